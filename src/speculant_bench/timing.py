"""Where a decode's time goes, measured from outside the round.

`InvokeClock` observes every session of an engine (its components', and its draft model's)
through the session's timing hook (``ComponentSession.observers``; nothing is patched): the
target's session counts as *target* time, every other session as *proposer* time.
`verify_width_curve` times target passes of growing block size over one fixed cache, straight
over the cache a prefill left
(`prefilled`: the decode state the runtime returns), through `engine.target.run`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import cycle, islice
from typing import Any

from speculant.engine import Engine
from speculant.session.session import Invocation
from speculant.workflow.options import GenerationOptions
from speculant.workflow.request import Admitted
from speculant.workflow.state import DecodeState

VERIFY_WIDTHS = (1, 2, 3, 5, 9)  # block sizes k + 1 for k = 0, 1, 2, 4, 8
WIDTH_WARMUP = 3  # untimed passes of each width before the timed ones
WIDTH_REPEATS = 20  # timed passes of each width


class InvokeClock:
    """Seconds spent in each session's ``invoke``, one entry per call, in call order.

        with InvokeClock(engine) as clock:
            clock.reset(); engine.generate(...)
            clock.target_s(skip_first=1), clock.proposer_s()
    """

    def __init__(self, engine: Engine) -> None:
        self.sessions = dict(engine.sessions)
        if engine.draft is not None:
            self.sessions["draft"] = engine.draft.session
        self.target = engine.package.plan.target
        # each session's calls, their seconds asked at the end (an overlapped replay's
        # timing waits for its end: asking at once would stall the pipeline being measured)
        self.calls: dict[str, list[Invocation]] = {name: [] for name in self.sessions}

    def __enter__(self) -> InvokeClock:
        self._observers = {name: self._recorder(self.calls[name]) for name in self.sessions}
        for name, session in self.sessions.items():
            session.observers.append(self._observers[name])
        return self

    def __exit__(self, *exc_info: object) -> None:
        for name, session in self.sessions.items():
            session.observers.remove(self._observers[name])

    @staticmethod
    def _recorder(calls: list[Invocation]) -> Callable[[Invocation], None]:
        def record(call: Invocation) -> None:
            calls.append(dataclasses.replace(call, inputs={}))  # no request's buffers kept
        return record

    def reset(self) -> None:
        for calls in self.calls.values():
            calls.clear()

    def target_s(self, skip_first: int = 0) -> float:
        """Target time, leaving out the first ``skip_first`` passes (the prefill)."""
        return sum(call.seconds for call in self.calls[self.target][skip_first:])

    def proposer_s(self) -> float:
        return sum(call.seconds for name, calls in self.calls.items() if name != self.target
                   for call in calls)


def prefilled(engine: Engine, prompt_ids: Sequence[int], room: int = 1) -> DecodeState:
    """The decode state the prefill of ``prompt_ids`` leaves: its caches hold the prompt
    (extent ``len(prompt_ids)``), with the admitted request it ran under; ``room``: the
    tokens a pass may then consume (static caches are allocated for that many)."""
    decode = engine.decode(list(prompt_ids), GenerationOptions(max_new_tokens=room,
                                                               stop_on_eos=False))
    next(decode)  # the prefill and its first token
    decode.close()
    return decode.state


@dataclass(frozen=True)
class WidthTiming:
    width: int  # tokens in the block: k + 1
    pass_s: list[float]  # engine.target.run, per repeat
    invoke_s: list[float]  # of which ComponentSession.invoke (binding and ORT's run)
    bare_s: list[float]  # ORT's run alone on the same inputs, bound once, waited for


def verify_width_curve(engine: Engine, context_ids: Sequence[int],
                       widths: Sequence[int] = VERIFY_WIDTHS, *, warmup: int = WIDTH_WARMUP,
                       repeats: int = WIDTH_REPEATS, on_step=None) -> list[WidthTiming]:
    """Time target passes of each block width over the cache a prefill of ``context_ids``
    leaves (fixed cache length ``len(context_ids)``); widths interleave within each repeat so
    drift hits them alike. The block is the context's tokens again (real ids, not zeros)."""
    state = prefilled(engine, context_ids, max(widths))
    start, cells, admitted = state.consumed, state.cells, state.admitted
    controls = dict(admitted.initial_controls)  # as the prefill pass saw them
    blocks = {w: list(islice(cycle(context_ids), w)) for w in widths}
    timings = {w: WidthTiming(w, [], [], []) for w in widths}
    bare = {w: bare_run(engine, blocks[w], start, cells, admitted, controls) for w in widths}
    with InvokeClock(engine) as clock:
        for repeat in range(warmup + repeats):
            for w in widths:
                clock.reset()
                started = time.perf_counter()
                engine.target.run(blocks[w], start, cells, admitted, controls)
                engine.seam.synchronize(engine.device)  # whatever the pass left queued
                elapsed = time.perf_counter() - started
                bare_s = bare[w]()
                if repeat >= warmup:
                    timings[w].pass_s.append(elapsed)
                    timings[w].invoke_s.append(clock.target_s())
                    timings[w].bare_s.append(bare_s)
            if on_step is not None:
                on_step()
    return [timings[w] for w in widths]


def bare_run(engine: Engine, block: Sequence[int], start: int, cells, admitted: Admitted,
             controls) -> BareRun:
    """A timer of ONNX Runtime's run alone for the target pass over ``block``: the pass's
    inputs (as `TargetPass.bind` makes them) bound once, then each call runs the session on
    them and waits for the device, with none of the runtime's Python. Pass time minus this is
    what the runtime adds to a pass.

    On a session made for CUDA graphs the binding gets a ``gpu_graph_id`` of its own (captured
    on its third run, like a plan's, then replayed): a run without one is graph id 0, and ORT
    would replay whichever plan captured id 0 first, whatever this binding holds (before
    2026-12-05 every width's bare run was the width-1 greedy plan's replay)."""
    session = engine.sessions[engine.package.plan.target]
    values, _ = engine.target.bind(block, start, cells, admitted, controls)
    binding = session.bind(engine.target.port_values(values),
                           list(engine.package.plan.target_outputs))
    options = session.graphs.run_options(session.graphs.new_id())  # None: an eager session
    return BareRun(engine, session.session, binding, options)


@dataclass(frozen=True)
class BareRun:
    """``bare_run``'s timer: calling it runs ORT on the binding once, in seconds."""

    engine: Engine
    session: Any  # the ORT InferenceSession
    binding: Any  # its IO binding: the pass's inputs, its outputs where ORT put them
    options: Any  # ORT run options: the binding's own graph id (None: eager)

    def __call__(self) -> float:
        started = time.perf_counter()
        self.session.run_with_iobinding(self.binding, self.options)  # waits for the device
        self.engine.seam.synchronize(self.engine.device)
        return time.perf_counter() - started
