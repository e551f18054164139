"""What a bench runs: plain greedy, and each proposer kind at each k, asked for by name.

A runner is only the `GenerationOptions` it decodes with. A kind or a k the package refuses
is skipped with the engine's own reason (its admission's RequestError).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from speculant.engine import Engine
from speculant.errors import RequestError
from speculant.speculative.kinds import NAMES
from speculant.workflow.options import GenerationOptions

PROPOSERS = NAMES  # every proposer kind a bench asks for by default
KS: tuple[int | str, ...] = (1, 2, 4, 8, "auto")  # "auto": the controller picks per round


@dataclass(frozen=True)
class Runner:
    proposer: str | None = None  # None: plain greedy decoding
    k: int | str = 0  # drafts per round (0 for greedy), or "auto"

    @property
    def name(self) -> str:
        return "greedy" if self.proposer is None else f"{self.proposer} k={self.k}"

    @property
    def is_speculative(self) -> bool:
        return self.proposer is not None

    def options(self, max_new_tokens: int) -> GenerationOptions:
        """EOS masked, so every runner decodes ``max_new_tokens`` tokens."""
        if self.proposer is None:
            return GenerationOptions(max_new_tokens=max_new_tokens, stop_on_eos=False)
        return GenerationOptions(max_new_tokens=max_new_tokens, stop_on_eos=False,
                                 proposer=self.proposer, k=self.k)


def runner_list(proposers: Sequence[str] = PROPOSERS,
                ks: Sequence[int | str] = KS) -> list[Runner]:
    return [Runner(), *(Runner(p, k) for p in proposers for k in ks)]


def why_unavailable(engine: Engine, runner: Runner, prompt: Sequence[int]) -> str | None:
    """None when the engine admits ``runner``'s request; otherwise its reason."""
    if runner.proposer is None:
        return None
    try:
        engine.admit(list(prompt), runner.options(2))
    except RequestError as error:
        return str(error)
    return None


def parse_k(text: str) -> int | str:
    """A ``--k`` value: a positive int, or ``auto``."""
    if text == "auto":
        return text
    value = int(text)  # ValueError names the text
    if value < 1:
        raise ValueError(f"k must be >= 1 or auto, got {value}")
    return value
