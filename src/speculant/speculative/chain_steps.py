"""The chained drafter's steps on static caches: one pass plan per step index, bound so that
each step reads what the step before it wrote (``chain_graph.py``: a step is one run); the
buffers and their layout: docs/design/chained.md, "The steps on static caches".
"""

from __future__ import annotations

from collections.abc import Callable

from speculant.session.plan import PassPlan
from speculant.session.session import ComponentSession
from speculant.speculative.chain_graph import CARRY, DRAFTS, NEXT, TOKEN, TOKENS
from speculant.tensors import Value


class ChainSteps:
    """Step plans ``0 … K`` and the buffers they bind (see the module)."""

    def __init__(self, session: ComponentSession, shared: dict[str, Value], carry: Value,
                 produced: dict[str, Value], max_k: int, carry_output: str,
                 bootstrap: Callable[[], ComponentSession] | None = None) -> None:
        """``shared``: port -> the buffer every step binds; ``carry``, ``produced``: a step's
        carry input and outputs as the checked run gave them (their shapes and dtypes);
        ``bootstrap()``: the session step 0 runs on, its carry the only output
        (``chain_graph.bootstrap_component``), made with step 0's plan (None: the step's)."""
        seam = session.seam
        self.session, self.shared, self.carry_output = session, shared, carry_output
        self.bootstrap = bootstrap
        where = session.output_residency  # the chain residency: where step outputs land
        with seam.write_batch():
            self.ids = seam.zeros((max_k + 2,), "int32", where)  # [K + 2] int32
            self.scratch = seam.zeros((1,), "int32", where)  # step 0's discarded prediction
            self.carries = seam.zeros((max_k + 2, *carry.shape), carry.dtype, where)
            self.outputs = {port: seam.zeros(value.shape, value.dtype, where)
                            for port, value in produced.items()
                            if port not in (NEXT, carry_output)}
        self.plans: list[PassPlan] = []
        self.chains: dict[int, PassPlan] = {}  # depth -> the unrolled chain's plan

    def chain_plan(self, depth: int, session: ComponentSession) -> PassPlan:
        """The plan of the unrolled chain of ``depth`` steps on ``session``, made on first
        use: the shared inputs, ``ids[0:2]`` and ``carries[0]`` in, ``ids[2 : depth + 1]``
        out."""
        if depth not in self.chains:
            rows = self.session.seam.owned_rows
            inputs = {**self.shared, TOKENS: rows(self.ids, 0, 2),
                      CARRY: rows(self.carries, 0, 1, squeeze=True)}
            self.chains[depth] = PassPlan(session, inputs, {DRAFTS: rows(self.ids, 2, depth - 1)})
        return self.chains[depth]

    def plan(self, j: int) -> PassPlan:
        """Step ``j``'s plan, made on first use."""
        while len(self.plans) <= j:
            i = len(self.plans)
            if i == 0 and self.bootstrap is not None:  # the carry alone: no scores
                carry = {self.carry_output: self.step_outputs(0)[self.carry_output]}
                self.plans.append(PassPlan(self.bootstrap(), self.step_inputs(0), carry))
            else:
                self.plans.append(PassPlan(self.session, self.step_inputs(i),
                                           self.step_outputs(i)))
        return self.plans[j]

    def step_inputs(self, j: int) -> dict[str, Value]:
        """What step ``j`` reads: the shared inputs, ``ids[j]`` and ``carries[j]``."""
        rows = self.session.seam.owned_rows
        return {**self.shared, TOKEN: rows(self.ids, j, 1),
                CARRY: rows(self.carries, j, 1, squeeze=True)}

    def step_outputs(self, j: int) -> dict[str, Value]:
        """Where step ``j`` writes: ``ids[j + 1]`` (step 0: the scratch slot),
        ``carries[j + 1]``, the shared score buffer."""
        rows = self.session.seam.owned_rows
        return {**self.outputs, NEXT: rows(self.ids, j + 1, 1) if j else self.scratch,
                self.carry_output: rows(self.carries, j + 1, 1, squeeze=True)}

    def drafts(self, k: int) -> Value:
        """``ids[2 : k + 2]``: the drafts of the last proposal at width ``k`` [k] int32."""
        return self.session.seam.owned_rows(self.ids, 2, k)
