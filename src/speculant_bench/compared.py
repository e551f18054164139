"""Compared packages: other packages of the same model family, timed in the same run as the
package, on the same prompts (``speculant bench PACKAGE --compare LABEL=PATH``).

Each compared package gets its own engine (same device, same thread count) and the same
runners the package gets, where it admits them; they join the same rotation prompt by prompt,
so drift on a shared machine hits every package alike, and every ratio between packages is
one within a run. The prompts are the package's token ids, so a compared package must share
its tokenizer (the same ``tokenizer.json``, byte for byte).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from speculant.engine import Engine, load
from speculant.errors import RequestError
from speculant.workflow.options import GenerationOptions
from speculant_bench.runners import Runner, Width, why_unavailable


@dataclass(frozen=True, eq=False)
class PackageRunner:
    """One runner of a compared package: the options it decodes with, on that package's
    engine."""

    label: str  # the package's label in the report
    engine: Engine
    runner: Runner

    @property
    def name(self) -> str:
        return f"{self.label}: {self.runner.name}"

    @property
    def proposer(self) -> str | None:
        return self.runner.proposer

    @property
    def k(self) -> Width:
        return self.runner.k

    @property
    def is_speculative(self) -> bool:
        return self.runner.is_speculative

    def options(self, max_new_tokens: int) -> GenerationOptions:
        return self.runner.options(max_new_tokens)


@dataclass
class ComparedPackage:
    label: str
    path: str  # as given on the command line
    engine: Engine
    runners: list[PackageRunner] = field(default_factory=list)
    skipped: list[tuple[Runner, str]] = field(default_factory=list)  # with the engine's reason


def parse_compared(values: Sequence[str]) -> list[tuple[str, str]]:
    """``["int4=/tmp/int4", "/tmp/v5"]`` → ``[("int4", "/tmp/int4"), ("v5", "/tmp/v5")]``: a
    label is the text before ``=``, else the folder's name (a built-in package's name)."""
    pairs = []
    for value in values:
        label, is_labelled, path = value.partition("=")
        if not is_labelled:
            label, path = Path(value).name or value, value
        if not label or not path:
            raise ValueError(f"--compare {value!r} names no package; expected LABEL=PATH or "
                             "PATH")
        if any(label == seen for seen, _ in pairs):
            raise ValueError(f"two compared packages are labelled {label!r}; label them: "
                             "LABEL=PATH")
        pairs.append((label, path))
    return pairs


def _tokenizer_bytes(engine: Engine) -> bytes | None:
    file = engine.package.tokenizer_file
    return None if file is None else Path(file).read_bytes()


def load_compared(pairs: Sequence[tuple[str, str]], package: Engine, runners: Sequence[Runner],
                  check_prompt: Sequence[int], *, device: str, threads: int | None
                  ) -> list[ComparedPackage]:
    """Load each compared package and keep the runners among ``runners`` it admits (the
    others skipped with its reason). A package whose tokenizer is not the package's is
    refused with a RequestError naming it."""
    compared = []
    expected = _tokenizer_bytes(package)
    for label, path in pairs:
        engine = load(path, device, threads=threads)
        if _tokenizer_bytes(engine) != expected or engine.vocab_size != package.vocab_size:
            raise RequestError("a compared package must share the package's tokenizer (the "
                               "prompts are the package's token ids)", path="--compare",
                               file=str(engine.package.root), value=label,
                               expected=f"the tokenizer.json of {package.package.root}",
                               remedy="compare packages of the same model")
        entry = ComparedPackage(label, path, engine)
        for runner in runners:
            reason = why_unavailable(engine, runner, check_prompt)
            if reason is None:
                entry.runners.append(PackageRunner(label, engine, runner))
            else:
                entry.skipped.append((runner, reason))
        compared.append(entry)
    return compared
