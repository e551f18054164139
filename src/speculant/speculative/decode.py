"""A request decoded alone: its route, chosen at admission, and its scheduler — the engine's
one loop at one row (speculative/scheduler.py), for every proposer, width policy and device
(docs/design/speculative.md); generation.py's ``Decode`` steps it.

The loop invariant is :class:`~speculant.workflow.state.DecodeState`'s: between rounds read,
the caches hold exactly the consumed positions and the pending token is the target's latest
choice. Everything a decode counts lands in ``state.stats``, returned with the state.
"""

from __future__ import annotations

from speculant.speculative.proposal import HOST_ROUNDS, QUEUED_ROUNDS, Proposer
from speculant.speculative.round import Route
from speculant.speculative.scheduler import Entry, LoneTarget, Scheduler
from speculant.speculative.width import WidthPolicy
from speculant.workflow.state import DecodeState
from speculant.workflow.target_pass import TargetPass


def choose_route(state: DecodeState, target: TargetPass, proposer: Proposer | None) -> Route:
    """How this decode's rounds run, decided once at admission, with its reason."""
    in_place = state.sampler is None and state.cells.is_in_place
    if state.constraint is not None or state.logprobs is not None:  # rows read every round
        why = ("a grammar masks every chosen row" if state.constraint is not None else
               "log-probabilities read every committed row")
        return Route(HOST_ROUNDS, in_place and state.constraint is None, 0,
                     f"reference: each round read before the next ({why})")
    depth = target.queue_depth if in_place and not target.control_ports else 0
    can_queue = getattr(proposer, "can_queue", None)
    if depth and can_queue is not None and can_queue(state):
        return Route(QUEUED_ROUNDS, in_place, depth,
                     f"queued: up to {depth} round(s) launched on the device before the "
                     "last is read (greedy, static caches, a chain advanced where it runs)")
    why = ("sampling" if state.sampler is not None else
           "appended caches" if not in_place else
           "serving controls bound" if target.control_ports else
           "the target runs on the host" if not target.queue_depth else
           "a proposer that reads the tokens back" if proposer is not None else None)
    if why is None:
        return Route(HOST_ROUNDS, True, depth, f"greedy steps on the device, up to {depth} "
                                               "queued before the last is read")
    steps = "; greedy steps keep their argmax where it is made" if in_place else ""
    return Route(HOST_ROUNDS, in_place, depth,
                 f"reference: each round read before the next ({why}){steps}")


def alone(state: DecodeState, target: TargetPass, proposer: Proposer | None,
          policy: WidthPolicy, route: Route | None = None) -> tuple[Scheduler, Entry]:
    """A request decoded alone: a scheduler of one row over its own target pass, the request
    submitted — the same steps (prefill, then rounds) as requests decoded together, its
    rounds queued as deep as ``route`` allows (None: :func:`choose_route`'s)."""
    scheduler = Scheduler(LoneTarget(target, route or choose_route(state, target, proposer)))
    return scheduler, scheduler.submit(state, proposer, policy)

