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
    batched_artifact: Path | None = None  # the target's batched graph (plan.static.batch)

    def model_source(self, component: str) -> str | bytes:
        """What ONNX Runtime opens: the path of a binary model (so external data resolves
        beside it), or the serialized bytes of a text-format model."""
        path = self.artifacts[component]
        if path.name.endswith(TEXTPROTO_SUFFIX):
            return self.graphs[component].SerializeToString()
        return str(path)

    @property
    def logits_width(self) -> int | None:
        """The target's vocabulary as its logits see it: the last extent of the logits port's
        contract, else of the graph output, else ``model.vocab_size`` (None if unknown)."""
        plan, workflow = self.plan, self.document.workflow
        logits_port = plan.port_by_role["logits"]  # load refuses a target without it
        ports = workflow.components[plan.target].ports
        contract = ports.outputs.get(logits_port) if ports else None
        if contract is not None and isinstance(contract.dims[-1], int):
            return contract.dims[-1]
        for output in self.graphs[plan.target].graph.output:
            if output.name == logits_port:
                dims = output.type.tensor_type.shape.dim
                if dims and dims[-1].HasField("dim_value"):
                    return dims[-1].dim_value
        model = self.document.model
        return model.vocab_size if model else None
