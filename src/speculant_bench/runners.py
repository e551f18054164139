"""What a bench runs: plain greedy, and each proposer kind at each k, asked for by name.

A runner is only the `GenerationOptions` it decodes with. A kind or a k the package refuses
is skipped with the engine's own reason (its admission's RequestError). ``k`` is a fixed width
or ``"auto"`` (the width chosen per round from measured acceptance and costs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from speculant.engine import Engine
from speculant.errors import RequestError
from speculant.speculative.kinds import NAMES
from speculant.speculative.width import AUTO  # the k whose width follows acceptance
from speculant.workflow.options import GenerationOptions, parse_width

PROPOSERS = NAMES  # every proposer kind a bench asks for by default
Width = int | str  # a fixed k >= 1, or AUTO
KS: tuple[Width, ...] = (1, 2, 4, 8, AUTO)  # AUTO: the controller picks per round


def parse_widths(values: Sequence[str]) -> tuple[Width, ...]:
    """``["1", "4", "auto"]`` → ``(1, 4, "auto")``, in the order given, each once; anything
    but a positive integer or ``auto`` raises ValueError naming the value."""
    widths: list[Width] = []
    for value in values:
        try:  # the runtime's one parser of k, on command-line text
            width = parse_width(str(value).strip().lower(), is_text=True)
        except RequestError as exc:
            raise ValueError(f"k = {value!r} is neither a width (an integer >= 1) nor "
                             f"{AUTO!r}") from exc
        if width is not None and width not in widths:
            widths.append(width)
    return tuple(widths)


def fixed_widths(ks: Sequence[Width]) -> list[int]:
    """The fixed widths among ``ks`` (what a runtime without an automatic width runs)."""
    return [k for k in ks if k != AUTO]


@dataclass(frozen=True)
class Runner:
    proposer: str | None = None  # None: plain greedy decoding
    k: Width = 0  # drafts per round (0 for greedy), or AUTO

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


def runner_list(proposers: Sequence[str] = PROPOSERS, ks: Sequence[Width] = KS
                ) -> list[Runner]:
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
