"""`Package`: a folder on disk that passed validation and admission."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from speculant.package.model import Document
from speculant.package.plan import LoadPlan

TEXTPROTO_SUFFIX = ".onnx.textproto"


@dataclass(frozen=True)
class Package:
    root: Path  # realpath of the package folder
    metadata_file: Path
    document: Document
    plan: LoadPlan
    artifacts: dict[str, Path]  # component -> confined artifact path
    graphs: dict[str, onnx.ModelProto]  # component -> parsed model (external data not loaded)
    tokenizer_file: Path | None
    embedding_width: int | None = None  # W_E, from admission (chained packages)

    def model_source(self, component: str) -> str | bytes:
        """What ONNX Runtime opens: the path of a binary model (so external data resolves
        beside it), or the serialized bytes of a text-format model (metadata.md §2.2)."""
        path = self.artifacts[component]
        if path.name.endswith(TEXTPROTO_SUFFIX):
            return self.graphs[component].SerializeToString()
        return str(path)
