"""Anchors: the runtimes people use today, decoding the same weights in the same bench run.

    speculant bench PACKAGE --draft DRAFT --anchors hf,genai

``hf`` is Hugging Face transformers ``generate`` (greedy, prompt lookup, assisted generation
with the draft model); ``genai`` is onnxruntime-genai on a model its own builder exports
(greedy, n-gram, draft model). Both start from the checkpoint `speculant_tools.export.export_hf`
writes out of the package (and out of the draft package), so every runtime decodes the same
float32 weights. An anchor whose packages are missing, or that fails to build or load, is
skipped with the reason; a mode that fails on its first decode is skipped with the runtime's
own error. ``genai_model`` names a folder genai's builder made beforehand (e.g. from the same
checkpoint on another machine, or at another precision): genai then decodes that folder (under
a patched copy of its config) and needs neither the checkpoint nor the builder; its "= greedy"
column is what shows it holds the same weights. Modules: ``base`` (the runner record), ``hf``,
``genai``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from speculant_bench.anchors.base import (
    ANCHORS,
    AnchorDecode,
    AnchorError,
    AnchorRunner,
    AnchorSetup,
    emitted_ids,
    fingerprint,
    is_current,
    mark,
    parse_anchors,
    why_missing,
)

__all__ = ["ANCHORS", "AnchorDecode", "AnchorError", "AnchorRunner", "AnchorSetup",
           "parse_anchors", "prepare_anchors", "why_missing"]


def prepare_anchors(anchors: Sequence[str], *, package: Path, draft: Path | None, device: str,
                    threads: int | None, proposers: Sequence[str], ks: Sequence[int],
                    reference: Sequence[Sequence[int]], check_prompt: Sequence[int],
                    work: Path | None = None, note=print,
                    genai_model: Path | None = None) -> AnchorSetup:
    """Export the checkpoints once, prepare each anchor, and keep the runners whose first
    decode of ``check_prompt`` (two tokens) works. ``reference`` is speculant's greedy
    output per prompt (genai's pad id must be one it never emits). ``work``: where the
    checkpoints and genai's models go (None: a temporary folder, removed by ``close``); a
    checkpoint or model already there, made from the same files, is reused."""
    setup = AnchorSetup()
    wanted = [name for name in anchors
              if _available(name, setup, note, prebuilt=name == "genai" and bool(genai_model))]
    if not wanted:
        return setup
    if work is None:
        temporary = tempfile.TemporaryDirectory(prefix="speculant-anchors-")
        setup.cleanup.append(temporary.cleanup)
        work = Path(temporary.name)
    work.mkdir(parents=True, exist_ok=True)
    target_hf = draft_hf = None
    if "hf" in wanted or genai_model is None:  # a prebuilt genai folder needs no checkpoint
        try:
            target_hf, draft_hf = _checkpoints(package, draft, work)
        except Exception as error:  # noqa: BLE001 - any failure is a reason to print
            for name in wanted:
                _skip_all(setup, name, f"export_hf failed: {type(error).__name__}: {error}",
                          note)
            return setup
    if genai_model is not None and "genai" in wanted and draft is not None \
            and "draft" in proposers:
        setup.skip("genai", "genai draft (every k)", "a prebuilt genai folder (--genai-model) "
                   "is the target alone; genai's draft mode needs both built here")
    common = {"device": device, "threads": threads, "proposers": proposers, "ks": ks}
    for name in wanted:
        before = len(setup.runners)
        try:
            if name == "hf":
                from speculant_bench.anchors import hf
                hf.prepare(setup, target_dir=target_hf, draft_dir=draft_hf, **common)
            else:
                from speculant_bench.anchors import genai
                genai.prepare(setup, target_hf=target_hf, draft_hf=draft_hf, work=work,
                              emitted=emitted_ids(reference), prebuilt=genai_model, **common)
        except Exception as error:  # noqa: BLE001
            del setup.runners[before:]
            reason = str(error) if isinstance(error, AnchorError) else \
                f"{type(error).__name__}: {error}"
            _skip_all(setup, name, reason, note)
            continue
        setup.runners[before:] = [r for r in setup.runners[before:]
                                  if _first_decode_works(r, check_prompt, setup, note)]
    return setup


def _available(name: str, setup: AnchorSetup, note, *, prebuilt: bool = False) -> bool:
    reason = why_missing(name, prebuilt=prebuilt)
    if reason is not None:
        _skip_all(setup, name, reason, note)
    return reason is None


def _skip_all(setup: AnchorSetup, name: str, reason: str, note) -> None:
    setup.skip(name, f"{name} (every mode)", reason)
    note(f"skipping the {name} anchor: {reason}")


def _checkpoints(package: Path, draft: Path | None, work: Path) -> tuple[Path, Path | None]:
    """`export_hf` of the package (and the draft package) under ``work/hf``, unless an earlier
    run exported the same files there."""
    from speculant_tools.export import export_hf

    def export(source: Path, out: Path) -> Path:
        made_from = fingerprint(source)
        if not is_current(out, made_from):
            export_hf(source, out)
            mark(out, made_from)
        return out

    target = export(package, work / "hf" / "target")
    return target, (export(draft, work / "hf" / "draft") if draft is not None else None)


def _first_decode_works(runner: AnchorRunner, prompt: Sequence[int], setup: AnchorSetup,
                        note) -> bool:
    try:
        runner.decode(list(prompt), 2)
    except Exception as error:  # noqa: BLE001 - the runtime's own error is the reason
        reason = f"{type(error).__name__}: {error}"
        setup.skip(runner.runtime, runner.name, reason)
        note(f"skipping {runner.name}: {reason}")
        return False
    return True
