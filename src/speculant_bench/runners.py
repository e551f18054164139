"""What a bench runs: plain greedy, and each proposer at each k, asked for by name.

A runner is only the `Engine.generate` options it decodes with. Proposers are named, never
switched on: a name the engine does not know yet (``draft``, ``prompt_lookup`` while they are
being built) or a k the package refuses is skipped with the engine's own reason.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

from speculant.engine import Engine
from speculant.errors import RequestError

PROPOSERS = ("chained", "draft", "prompt_lookup")  # every proposer a bench asks for by default
KS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Runner:
    proposer: str | None = None  # None: plain greedy decoding
    k: int = 0  # drafts per round (0 for greedy)

    @property
    def name(self) -> str:
        return "greedy" if self.proposer is None else f"{self.proposer} k={self.k}"

    @property
    def is_speculative(self) -> bool:
        return self.proposer is not None

    def options(self, can_name_proposer: bool) -> dict:
        """Keywords for `Engine.generate` (EOS masked, so every runner decodes N tokens)."""
        if self.proposer is None:
            return {"stop_on_eos": False}
        named = {"proposer": self.proposer} if can_name_proposer else {}
        return {"stop_on_eos": False, "speculative": True, "k": self.k, **named}


def runner_list(proposers: Sequence[str] = PROPOSERS, ks: Sequence[int] = KS) -> list[Runner]:
    return [Runner(), *(Runner(p, k) for p in proposers for k in ks)]


def can_name_proposer(engine: Engine) -> bool:
    """Whether `Engine.generate` takes ``proposer=`` (itself, or through ``**options`` that
    `Engine.request` declares)."""
    parameters = inspect.signature(engine.generate).parameters
    if "proposer" in parameters:
        return True
    forwards = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return forwards and "proposer" in inspect.signature(engine.request).parameters


def why_unavailable(engine: Engine, runner: Runner, prompt: Sequence[int]) -> str | None:
    """None when ``runner`` decodes on ``engine``; otherwise the reason, from a two-token
    decode that the engine admits or refuses."""
    if runner.proposer is None:
        return None
    can_name = can_name_proposer(engine)
    if not can_name and runner.proposer != "chained":
        return ("Engine.generate takes no 'proposer' argument, so only speculative=True "
                "(chained) can be asked for")
    try:
        engine.generate(list(prompt), 2, **runner.options(can_name))
    except RequestError as error:
        return str(error)
    return None
