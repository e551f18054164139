"""What an anchor is: another runtime decoding the same weights, timed beside speculant.

An anchor runner is one mode of one runtime (``hf greedy``, ``genai ngram k=4``) with a
``decode(prompt, n, count=False)`` that returns the same per-run record as a speculant runner:
the tokens, the time to the first token and the total time (the decode time is their
difference). ``count=True`` asks for the runtime's own counters as well (target passes, draft
passes, its speculative statistics); the bench asks for them in one untimed pass, so no
counting ever runs inside a timed decode.

Each anchor mode is paired with the speculant runner that does the same thing (``counterpart``):
greedy with greedy, prompt lookup and n-gram lookup with ``prompt_lookup``, assisted generation
and a draft model with ``draft``, at the same k.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from speculant_bench.runners import Runner

ANCHORS = ("hf", "genai")
RUNTIME_NAMES = {"hf": "Hugging Face transformers", "genai": "onnxruntime-genai"}
# Import names each anchor needs (the builder of onnxruntime-genai loads the checkpoint with
# transformers and writes with onnx_ir).
REQUIRED_MODULES = {
    "hf": ("torch", "transformers", "safetensors"),
    "genai": ("onnxruntime_genai", "onnx_ir", "torch", "transformers", "safetensors"),
}
PREBUILT_MODULES = ("onnxruntime_genai",)  # genai on a folder its builder made beforehand
INSTALL_HINT = ("the optional extra: pip install 'speculant[anchors]' (torch's CPU build "
                "from https://download.pytorch.org/whl/cpu keeps the CUDA build out)")
# The speculant proposer each anchor mode does the same job as.
COUNTERPART_PROPOSER = {"greedy": None, "prompt_lookup": "prompt_lookup", "assisted": "draft",
                        "ngram": "prompt_lookup", "draft": "draft"}


class AnchorError(Exception):
    """An anchor that cannot run here; the message is the reason the bench prints."""


def parse_anchors(values: Iterable[str] | None) -> tuple[str, ...]:
    """``["hf,genai"]`` or ``["hf", "genai"]`` → ``("hf", "genai")``, in the order given,
    each once; an unknown name raises ValueError naming the known ones."""
    names: list[str] = []
    for value in values or ():
        for name in (part.strip().lower() for part in value.split(",")):
            if not name:
                continue
            if name not in ANCHORS:
                raise ValueError(f"unknown anchor {name!r}; known: {', '.join(ANCHORS)}")
            if name not in names:
                names.append(name)
    return tuple(names)


def missing_modules(anchor: str, find_spec: Callable = importlib.util.find_spec, *,
                    prebuilt: bool = False) -> list[str]:
    """The import names of ``anchor`` that are not installed (found without importing);
    ``prebuilt``: genai on a built folder, which needs no builder and no checkpoint."""
    missing = []
    for module in PREBUILT_MODULES if prebuilt else REQUIRED_MODULES[anchor]:
        try:
            found = find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(module)
    return missing


def why_missing(anchor: str, find_spec: Callable = importlib.util.find_spec, *,
                prebuilt: bool = False) -> str | None:
    """None when every package ``anchor`` needs is installed; otherwise the reason to print."""
    missing = missing_modules(anchor, find_spec, prebuilt=prebuilt)
    if not missing:
        return None
    return (f"{RUNTIME_NAMES[anchor]} anchor skipped: {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed ({INSTALL_HINT})")


@dataclass(frozen=True)
class AnchorDecode:
    """One decode of one prompt by an anchor: the same record as a speculant `Sample`."""

    token_ids: list[int]
    total_s: float  # request in to last token out
    ttft_s: float  # request in to first token out
    counts: dict = field(default_factory=dict)  # only when decode(..., count=True)


@dataclass(eq=False)
class AnchorRunner:
    runtime: str  # "hf" | "genai"
    mode: str  # "greedy" | "prompt_lookup" | "assisted" | "ngram" | "draft"
    k: int | str  # drafts per round (0 for greedy), or "auto" (the runtime's adaptive width)
    decode: Callable[..., AnchorDecode]  # decode(prompt_ids, n, count=False)
    settings: dict = field(default_factory=dict)  # the runtime's options, as passed
    variant: str = ""  # a configuration beside the default one, e.g. "cuda graph"

    @property
    def name(self) -> str:
        return (f"{self.runtime} {self.mode}" + (f" k={self.k}" if self.k else "")
                + (f" ({self.variant})" if self.variant else ""))

    @property
    def counterpart(self) -> Runner:
        """The speculant runner doing the same job (the pair of the per-mode ratio)."""
        proposer = COUNTERPART_PROPOSER[self.mode]
        return Runner() if proposer is None else Runner(proposer, self.k)


@dataclass
class AnchorSetup:
    """What preparing the anchors gave: runners to time, what was skipped and why, and what
    the report records about each runtime (versions, exported files, settings)."""

    runners: list[AnchorRunner] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # {"name", "runtime", "reason"}
    info: dict = field(default_factory=dict)  # runtime -> facts for the report
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def skip(self, runtime: str, name: str, reason: str) -> None:
        self.skipped.append({"name": name, "runtime": runtime, "reason": reason})

    def close(self) -> None:
        for release in reversed(self.cleanup):
            release()
        self.cleanup.clear()


def emitted_ids(reference: Sequence[Sequence[int]]) -> set[int]:
    """Every token id the reference (speculant greedy) emits over the prompt set."""
    return {int(t) for tokens in reference for t in tokens}


# -- reuse of exported and built files in a kept --anchor-dir ------------------------------------
STAMP = ".speculant-source"  # what a folder was made from, to reuse it in a later run


def fingerprint(*folders: Path, extra: str = "") -> str:
    """A digest of every file under ``folders`` (relative path, size, modification time) and
    ``extra``: what an exported or built folder was made from."""
    digest = hashlib.sha256(extra.encode())
    for folder in folders:
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.name != STAMP):
            stat = path.stat()
            digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
                          .encode())
    return digest.hexdigest()


def is_current(out: Path, source: str) -> bool:
    """Whether ``out`` was made from ``source`` (a :func:`fingerprint`) by an earlier run."""
    stamp = Path(out) / STAMP
    return stamp.is_file() and stamp.read_text() == source


def mark(out: Path, source: str) -> None:
    (Path(out) / STAMP).write_text(source)
