"""The decode: prefill, then rounds until a stop rule fires — one loop for every proposer,
width policy and device (docs/design/speculative.md).

The loop invariant is :class:`~speculant.workflow.state.DecodeState`'s: between rounds read,
the caches hold exactly the consumed positions and the pending token is the target's latest
choice. Everything a decode counts lands in ``state.stats``, returned with the state.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from speculant.speculative.proposal import HOST_ROUNDS, QUEUED_ROUNDS, Proposer
from speculant.speculative.round import Rounds, Route
from speculant.speculative.width import WidthPolicy
from speculant.workflow.sampler import choose
from speculant.workflow.state import DecodeState
from speculant.workflow.target_pass import TargetPass, capture_widths


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


def decode(state: DecodeState, target: TargetPass, proposer: Proposer | None,
           policy: WidthPolicy, route: Route | None = None) -> Iterator[int]:
    """Yield each committed token as it is committed; ``state`` holds the rest. ``route``:
    the admission's (None: :func:`choose_route`'s for this state)."""
    route = route or choose_route(state, target, proposer)
    # 1. Serving controls that say "inactive" or "done" get an empty result, no pass.
    if not state.is_active:
        state.stop("inactive")
        return
    # 2. Prefill: a pass over the prompt from empty caches; its last row gives the first
    #    token (argmax, or a draw from T(row)), at position P, which becomes pending.
    prefill = target.run(state.tokens, 0, state.cells, state.admitted, state.controls)
    last_row = state.seam.last_along_axis(prefill.logits, prefill.logits.rank - 2)  # [1,1,V]
    first, _ = choose(state.seam, state.sampler, last_row, len(state.tokens), state.constraint)
    yield from state.record_prefill(prefill, first)
    with policy.measuring():
        # 3. Every width the policy may choose is planned (captured) before the first round.
        if not state.is_stopped:
            warm_up(state, target, proposer, policy)
        # 4. Rounds: launch (propose, verify), read (accept), then the state rolls back and
        #    commits with stop checks; the policy sees each round as it is read.
        rounds = Rounds(state, target, proposer, policy, route)
        while not state.is_stopped:
            result = rounds.read_next()
            policy.observe(result)
            yield from state.record(result)


def warm_up(state: DecodeState, target: TargetPass, proposer: Proposer | None,
            policy: WidthPolicy) -> None:
    """Where passes replay captured CUDA graphs: the target's plan of every block width the
    policy may verify and the proposer's plans of every width it may propose, captured now
    (a capture mid-decode stalls it); then, for a measured policy, one timed proposal of each
    width (an unmeasured width looks free). The one place plans are made ahead."""
    cells = state.cells
    widths = [k for k in policy.widths if k <= state.capped_width(k)]
    if not cells.is_in_place or not target.session.graphs.is_enabled or all(
            k + 1 in cells.plans and not cells.plans[k + 1].awaits_capture for k in widths):
        return
    capture_widths(target, [k + 1 for k in widths], state.pending, state.consumed, cells,
                   state.admitted, state.controls)
    drafted = [k for k in widths if k]
    if proposer is None or not drafted or (capture := getattr(proposer, "capture_widths",
                                                              None)) is None:
        return
    capture(state, drafted)
    timed = getattr(policy, "timed_warm_up", None)
    draws_none = state.sampler is None or state.sampler.is_keyed  # no generator to advance
    for k in drafted if timed is not None and draws_none else ():
        started = time.perf_counter()
        proposal = proposer.propose(state, k)
        timed(proposal.k, time.perf_counter() - started)
