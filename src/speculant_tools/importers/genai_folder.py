"""onnxruntime-genai model folders (``genai_config.json`` + the builder's ``model.onnx``).

Recognised, not yet imported: mapping the builder's IO onto a package's metadata is not
written, so an import of such a folder is refused with a typed error naming the remedy.
"""

from __future__ import annotations

from pathlib import Path

from speculant_tools.importers.checkpoint import ImporterError

GENAI_CONFIG = "genai_config.json"


def is_genai_folder(path: Path) -> bool:
    return (path / GENAI_CONFIG).is_file()


def import_genai_folder(folder: str | Path, out: str | Path, *, dtype: str = "float32") -> Path:
    raise ImporterError("importing an onnxruntime-genai folder is not supported yet",
                        file=str(Path(folder) / GENAI_CONFIG),
                        remedy="import the Hugging Face checkpoint or the GGUF the folder "
                        "was built from")
