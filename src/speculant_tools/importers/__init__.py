"""``speculant import``: packages from the models people have.

    from speculant_tools.importers import import_model
    import_model("model.gguf", "out")                       # a GGUF of the Llama family
    import_model("hf-checkpoint/", "out", dtype="float16")  # config.json + safetensors
    import_model("genai-model/", "out")                     # onnxruntime-genai's builder output
    import_model("head.eagle3/", "out", target="my-llama")  # a speculators EAGLE head

GGUF and Hugging Face checkpoints are read into a :class:`Checkpoint` (``gguf_file``,
``hf_folder``) and written with ``speculant_tools.export``'s Llama graphs
(``checkpoint.write_checkpoint``); an onnxruntime-genai folder keeps its own graph
(``genai_folder``); a speculators head becomes the chained drafter beside its target's
package (``speculators``).
"""

from __future__ import annotations

from pathlib import Path

from speculant_tools.importers.checkpoint import (
    Checkpoint,
    Drafter,
    ImporterError,
    Progress,
    check_quantize,
    read_drafter,
    write_checkpoint,
)

__all__ = ["Checkpoint", "Drafter", "ImporterError", "detect", "import_model", "read_checkpoint",
           "read_drafter", "write_checkpoint"]

KINDS = ("gguf", "hf", "genai", "speculators")


def detect(source: str | Path) -> str:
    """``gguf``, ``hf``, ``genai`` or ``speculators`` for ``source``; anything else is an
    ImporterError."""
    from speculant_tools.importers.genai_folder import is_genai_folder
    from speculant_tools.importers.hf_folder import is_hf_folder
    from speculant_tools.importers.speculators import is_speculators_folder

    path = Path(source)
    if path.is_file():
        with path.open("rb") as handle:
            if handle.read(4) == b"GGUF":
                return "gguf"
        raise ImporterError("this file is not a GGUF file (no GGUF magic)", file=str(path),
                            path="GGUF.magic", expected="a .gguf file, or a folder")
    if path.is_dir():
        if is_genai_folder(path):
            return "genai"
        if is_speculators_folder(path):
            return "speculators"
        if is_hf_folder(path):
            return "hf"
        raise ImporterError("this folder is neither a Hugging Face checkpoint nor an "
                            "onnxruntime-genai model", file=str(path),
                            expected="config.json + *.safetensors, or genai_config.json "
                            "+ model.onnx")
    raise ImporterError("no such file or folder", file=str(path))


def read_checkpoint(source: str | Path, progress: Progress | None = None) -> Checkpoint:
    """The Llama checkpoint of a GGUF file or a Hugging Face folder."""
    kind = detect(source)
    if kind == "gguf":
        from speculant_tools.importers.gguf_file import read_gguf

        return read_gguf(source, progress)
    if kind == "hf":
        from speculant_tools.importers.hf_folder import read_hf_folder

        return read_hf_folder(source, progress)
    raise ImporterError("an onnxruntime-genai folder has a graph, not a checkpoint",
                        file=str(source), remedy="import it with import_model")


def import_model(source: str | Path, out: str | Path, *, dtype: str | None = None,
                 quantize: str | None = None, graph: str = "auto",
                 cache: str | None = None, target: str | Path | None = None,
                 max_proposal_width: int | None = None, batch: int | None = None,
                 progress: Progress | None = None) -> Path:
    """Write the speculant package of ``source`` into ``out`` (a new or empty folder), in
    ``dtype`` (default float32), its caches in ``cache`` form (default ``static``: the fast
    path, docs/design/static-cache.md; or ``appended``). An onnxruntime-genai folder keeps its
    own graph's form. A speculators head needs ``target`` (the package it drafts for: a
    folder or a built-in name; its dtype and cache form are the defaults) and takes
    ``max_proposal_width`` (default: the head's ``speculative_tokens``). ``batch`` (a GGUF
    or a Hugging Face checkpoint, static caches): also the batched pass of up to ``batch``
    rows (docs/design/batching.md)."""
    from speculant_tools.export.package import check_batch_form

    check_quantize(quantize, dtype or "float32")
    check_batch_form(batch, cache or "static")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ImporterError("the output folder exists and is not empty", file=str(out),
                            remedy="name a new folder")
    kind = detect(source)
    if batch is not None and kind in ("speculators", "genai"):
        raise ImporterError(f"a {kind} import has no batched pass: speculant writes one "
                            "only for the Llama graphs it builds", file=str(source),
                            path="batch", value=batch,
                            remedy="leave --batch out, or import a GGUF or Hugging Face "
                                   "checkpoint")
    if kind == "speculators":
        from speculant_tools.importers.speculators import import_speculators

        if target is None or quantize is not None:
            raise ImporterError("a speculators head is imported beside the package of its "
                                "target, never quantized here", file=str(source),
                                path="target" if target is None else "quantize",
                                value=quantize, remedy="speculant import HEAD OUT --target "
                                "TARGET_PACKAGE")
        return import_speculators(source, target, out, dtype=dtype, cache=cache,
                                  max_proposal_width=max_proposal_width, progress=progress)
    dtype, cache = dtype or "float32", cache or "static"
    if kind == "genai":
        from speculant_tools.importers.genai_folder import import_genai_folder

        if quantize is not None:
            raise ImporterError("an onnxruntime-genai graph is copied as it is, never "
                                "quantized here", path="quantize", value=quantize,
                                remedy="quantize with genai's builder (-p int4)")
        return import_genai_folder(source, out, dtype=dtype)
    checkpoint = read_checkpoint(source, progress)
    if progress is not None:
        progress(f"writing the {dtype} graph", 0, 1)
    write_checkpoint(checkpoint, out, dtype=dtype, graph=graph, quantize=quantize,
                     cache=cache, batch=batch)
    if progress is not None:
        progress(f"wrote {out}", 1, 1)
    return out
