"""The chained proposal (docs/design/spec/runtime.md §8-§9): an MTP/EAGLE-style drafter, stepwise.

Each step feeds the drafter ``concat(table[last] · scale, carry)``, built inside its step graph
where the chain executes (``chain_graph.py``) from the target's table as stored; the borrowed
caches are the owner's cells as they stand after rollback; only the drafted token ids cross
to the host.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace

import numpy as np
import onnx
from onnx import numpy_helper

from speculant.errors import ChainError, ContractError
from speculant.package.package import Package
from speculant.package.plan import ChainPlan
from speculant.session.plan import PassPlan
from speculant.session.session import ComponentSession
from speculant.speculative.chain_graph import CARRY, NEXT, TABLE, TOKEN, table_initializer
from speculant.speculative.chain_steps import ChainSteps
from speculant.speculative.proposal import LaunchedRound, Proposal
from speculant.tensors import NUMPY_DTYPES, TensorSeam, Value
from speculant.workflow.cells import StaticCells
from speculant.workflow.sampler import choose
from speculant.workflow.state import DecodeState
from speculant.workflow.target_pass import PassResult


def read_table(package: Package, chain: ChainPlan) -> np.ndarray:
    """The declared embedding table ``[V_E, W_E]`` in the chain's currency, as the target
    artifact stores it: a read-only array over the initializer's bytes, never scaled in a
    copy (SmolLM2's is 113 MB; the step graph scales the row it gathers). Load admitted it
    (an initializer of the target, in the chain's currency: A6)."""
    initializer = table_initializer(package, chain)
    if initializer.data_location == onnx.TensorProto.EXTERNAL:
        base_dir = str(package.artifacts[package.plan.target].parent)
        return numpy_helper.to_array(initializer, base_dir=base_dir)
    return numpy_helper.to_array(initializer)


def proposer_length_port(package: Package) -> str | None:
    """The proposer's port of the static caches' valid length, if it has one."""
    plan = package.plan
    return plan.static.kv_length_ports.get(plan.proposer or "") \
        if plan.static is not None else None


def queued_advances(package: Package, session: ComponentSession
                    ) -> list[tuple[str, str, str, int]] | None:
    """How each of the proposer's shared inputs follows a round queued behind another
    (``ChainedProposer._advances``), as ``_fixed_bindings`` binds it from the host."""
    plan, chain = package.plan, package.plan.chain
    assert chain is not None
    length_port = proposer_length_port(package)
    advances = []
    for port, value_name in plan.proposer_inputs.items():
        if port == chain.fused_port or port in chain.borrowed:
            continue  # built in the step graph; the target's buffers themselves
        if port == length_port:
            advances.append((port, "length", value_name, 0))
            continue
        dims = session.ports.inputs[port].dims
        position_axes = [axis for axis, dim in enumerate(dims)
                         if dim is not None and dim == chain.position_symbol]
        if any(dim is not None and dim == chain.kv_symbol for dim in dims) or \
                len(position_axes) > 1:
            return None
        advances.append((port, "row", value_name, position_axes[0]) if position_axes else
                        (port, "copy", value_name, 0))
    return advances


class ChainedProposer:
    """Drafts ``k_r`` tokens per round from the chain context of the decode state."""

    def __init__(self, package: Package, session: ComponentSession, seam: TensorSeam,
                 chain_session: Callable[[int], ComponentSession | None] | None = None,
                 bootstrap_session: Callable[[], ComponentSession] | None = None) -> None:
        """``session`` runs the proposer's step graph (``chain_graph.step_component``);
        ``chain_session(depth)`` makes the session of the chain unrolled ``depth`` steps
        (None, or returning None: step by step), used greedy on static caches;
        ``bootstrap_session()`` the one step 0 runs on step by step, its carry alone."""
        assert package.plan.chain is not None
        self.package = package
        self.chain = package.plan.chain
        self.session = session
        self.seam = seam
        self.chain_session = chain_session
        self.bootstrap_session = bootstrap_session  # step 0's, its carry alone (chain_steps)
        self._chain_sessions: dict[int, ComponentSession | None] = {}  # depth -> session
        self.max_k = package.plan.rollback_bound or 0  # the chain's bound on k (admission)
        # The chain residency: where the proposer's outputs are produced (its execution device,
        # or the host in the host-staged parity configuration).
        self.residency = session.output_residency
        self._table: Value | None = None  # [V_E, W_E] currency, as stored, in the chain residency
        # how each shared input of the step plans is advanced on the device for a round
        # queued behind another: (port, "length" | "row" | "copy", value name, axis); None
        # where one is narrowed to the consumed length (a shape that changes: not queued)
        self._advances = queued_advances(package, session)
        self._length_port = proposer_length_port(package)  # the drafter's C' port, if any

    @property
    def table(self) -> Value:
        """The table as stored, read once per runtime and adopted once into the chain
        residency (on the host: that array itself, no copy)."""
        if self._table is None:
            host_table = Value.host(read_table(self.package, self.chain),
                                    self.chain.currency)
            self.seam.counters.embedding_table_reads += 1
            self._table = self.seam.adopt(host_table, self.residency)
            if self._table is not host_table:
                self.seam.counters.embedding_table_mirrors += 1
        return self._table

    def propose(self, state: DecodeState, k: int) -> Proposal:
        """Run ``k + 1`` drafter steps (bootstrap included) and return ``k`` drafts: each
        the argmax of its step's row, or under sampling a draw from ``q_j = T(row)``
        (under a grammar, the row masked by it: ``_read_drafts``),
        returned with the ``q_j`` (the bootstrap step draws nothing). A subset vocabulary
        (``speculative.vocabulary: subset``) gives ``q_j`` over its ``V_q`` ids, each id
        used unchanged as the target's; the verifier reads ``q_j = 0`` beyond them. A step is
        one run of the step graph (``chain_graph.py``), fed the token and the carry. Greedy
        on static caches the drafts stay where the chain runs (``Proposal.drafts`` [k] int32,
        each step's argmax the next step's token there: ``chain_steps.py``) and the round
        verifies them in place; otherwise each draft is read back (4 bytes) as it is made."""
        last, carry_0 = self.chain_context(state)
        if state.cells.is_in_place:
            return self._propose_planned(state, self._planned(state, state.cells, last, carry_0),
                                         k)
        return self._propose_invoked(state, k, last, carry_0)

    def chain_context(self, state: DecodeState) -> tuple[int, Value]:
        """``s`` (the last consumed token) and ``carry_0`` [1, 1, W_C] of the decode state."""
        pass_result, num_kept = state.latest, state.num_kept
        assert pass_result is not None
        last = pass_result.tokens[num_kept - 1]
        num_rows = self.table.shape[0]
        if not 0 <= last < num_rows:
            raise ChainError(f"token {last} is outside the embedding table's {num_rows} rows",
                             value=last, expected=f"0 <= id < {num_rows}")
        return last, self._carry_0(pass_result, num_kept)

    def _propose_invoked(self, state: DecodeState, k: int, last: int,
                         carry: Value) -> Proposal:
        """Appended caches: every step through ``invoke``, its draft read back."""
        seam, chain = self.seam, self.chain
        fixed = {**self._fixed_bindings(state), TABLE: self.table}
        token_ids = seam.zeros((1,), "int32", self.residency)  # [1] int32, per proposal

        def run_step(j: int, token: int) -> dict[str, Value]:
            nonlocal carry
            seam.write_ints(token_ids, [token])
            out = self.session.invoke({**fixed, TOKEN: token_ids, CARRY: carry},
                                      [chain.logits_output, chain.carry_output])
            if j < k:
                carry = self._step_carry(out[chain.carry_output])
            return out

        return self._read_drafts(state, k, last, run_step)

    def _planned(self, state: DecodeState, cells: StaticCells, last: int,
                 carry_0: Value) -> ChainSteps:
        """Static caches: the step plans of these buffers (made on their first proposal) with
        this proposal's inputs written: ``s``, ``p``, ``carry_0`` and the shared inputs."""
        seam = self.seam
        is_new = cells.chain_steps is None
        if is_new:  # its shared inputs are this proposal's already
            cells.chain_steps = self._steps(state, last, carry_0)
        steps = cells.chain_steps
        with seam.write_batch():  # once per proposal: s, p, carry_0 and the shared inputs
            if not is_new:
                self._fixed_bindings(state, steps.shared)
            seam.write_ints(steps.ids, [last, state.pending])
            seam.scatter_into_last_axis(seam.owned_rows(steps.carries, 0, 1, squeeze=True),
                                        carry_0, 0)
        return steps

    def _propose_planned(self, state: DecodeState, steps: ChainSteps, k: int) -> Proposal:
        """The drafts of the step plans (one run where the chain runs unrolled); read back
        step by step under sampling or a grammar, each draft written where the next step
        reads its token."""
        if state.sampler is None and state.constraint is None:
            unrolled = self._unrolled(k + 1)
            if unrolled is not None:  # the whole proposal, one run
                steps.chain_plan(k + 1, unrolled).run()
            else:  # step j's argmax is step j + 1's token, where it was made
                for j in range(k + 1):
                    steps.plan(j).run()
            return Proposal(num_invocations=k + 1, num_scored_rows=k, drafts=steps.drafts(k))

        def run_step(j: int, token: int) -> dict[str, Value]:
            if j >= 2:  # ids[0 : 2] (s, p) are written
                self.seam.write_ints(steps.ids, [token], j)
            return steps.plan(j).run()

        return self._read_drafts(state, k, state.pending, run_step)

    def _read_drafts(self, state: DecodeState, k: int, last: int,
                     run_step: Callable[[int, int], dict[str, Value]]) -> Proposal:
        """Run steps ``0 … k`` (``run_step(j, token)``: step ``j`` fed ``token``), each
        step's draft read back: its argmax or draw (``_choose``). Under a grammar
        (workflow/constraint.py) the drafts start with the tokens it forces, each later one
        is chosen from the step's row masked by the grammar advanced along the drafts before
        it, and drafting ends where the grammar can take no more."""
        constraint = state.constraint
        drafts: list[int] = []
        probs: list[Value] = []  # q_j = T(step j's row) under rejection sampling
        num_scored = 0
        with constraint.drafting() if constraint is not None else nullcontext():
            forced = constraint.forced_tokens(k) if constraint is not None and (
                state.sampler is None or state.sampler.is_keyed) else []  # no q to return
            for j in range(k + 1):
                out = run_step(j, last)
                if j == 0:
                    last = state.pending  # bootstrap: its prediction is p, already known
                    continue
                if j <= len(forced):
                    last, q = forced[j - 1], None
                else:
                    last, q = self._choose(state, out, state.consumed + j)  # 4 bytes read
                    num_scored += 1
                if constraint is not None and not constraint.advance(last):
                    break
                drafts.append(last)
                if q is not None:
                    probs.append(q)
                if constraint is not None and constraint.is_finished:
                    break
        return Proposal(drafts, probs or None, num_invocations=j + 1,
                        num_scored_rows=num_scored)

    def capture_widths(self, state: DecodeState, widths: list[int]) -> None:
        """Static caches: every plan a proposal of each of ``widths`` drafts runs, run until
        captured (their runs write only the chain's own buffers, rewritten by the next
        proposal)."""
        cells = state.cells
        if not cells.is_in_place:
            return
        last, carry_0 = self.chain_context(state)
        steps = self._planned(state, cells, last, carry_0)
        plans: dict[int, PassPlan] = {}  # id -> plan: the step plans are shared by widths
        for k in widths:
            unrolled = self._unrolled(k + 1) if state.sampler is None and \
                state.constraint is None else None  # as _propose_planned runs it
            for plan in [steps.chain_plan(k + 1, unrolled)] if unrolled is not None else \
                    [steps.plan(j) for j in range(k + 1)]:
                plans[id(plan)] = plan
        for plan in plans.values():
            with plan.session.unobserved():
                while plan.awaits_capture:
                    plan.run()

    # -- a round queued behind another (speculative/round.py) ------------------------------
    def can_queue(self, state: DecodeState) -> bool:
        return state.sampler is None and state.cells.is_in_place and \
            self._advances is not None

    def propose_after(self, state: DecodeState, after: LaunchedRound | None, cursor: Value,
                      k: int) -> Proposal:
        """The drafts of the round queued behind ``after`` (None: behind the state's latest
        round): its chain context written from the host (``after`` None) or advanced where
        the chain runs from ``after``'s acceptance; ``block`` is ``ids[1 : k + 2]``."""
        cells = state.cells
        assert cells.is_in_place
        if after is None:
            last, carry_0 = self.chain_context(state)
            steps = self._planned(state, cells, last, carry_0)
        else:
            steps = cells.chain_steps
            self._advance(steps, after, cursor)
        proposal = self._propose_planned(state, steps, k) if k else Proposal(
            drafts=steps.drafts(0))
        return replace(proposal, block=self.seam.owned_rows(steps.ids, 1, k + 1))

    def _advance(self, steps: ChainSteps, after: LaunchedRound, cursor: Value) -> None:
        """The chain context after ``after``, from its count ``a`` where it was made: ``s``
        = its block's position ``a − 1`` (``ids[a]``), ``p = c_a``, ``carry_0`` = its seed
        row ``a − 1``, the positions its row ``a − 1``, the length ``cursor`` (= C + a)."""
        seam, rows = self.seam, self.seam.owned_rows
        count = rows(after.counted, 0, 1)  # [1] int32: a
        seed = after.verify.seed  # [1, k + 1, W_C]
        assert seed is not None and self._advances is not None
        with seam.write_batch():
            seam.take_at(rows(steps.ids, 0, 1), steps.ids, 0, count)  # s = ids[a]
            seam.take_at(rows(steps.ids, 1, 1), after.counted, 0, count)  # p = c_a
            seam.take_at(rows(steps.carries, 0, 1, squeeze=True), seed, seed.rank - 2, count,
                         -1)
            for port, how, value_name, axis in self._advances:
                buffer = steps.shared[port]
                if how == "length":
                    seam.write_arange_from(buffer, cursor, step=0)
                elif how == "row":
                    seam.take_at(buffer, after.verify.values[value_name], axis, count, -1)
                else:
                    PassPlan.copy_into(self.session, port, buffer, after.verify.values[value_name])

    def _unrolled(self, depth: int) -> ComponentSession | None:
        """The session of the chain unrolled ``depth`` steps (None: stepwise). The first
        unrolled proposal makes every depth's, ``2 … K + 1``: ``k = "auto"`` changes the
        width round to round, and a session made mid-decode would stall that decode."""
        if self.chain_session is None:
            return None
        if not self._chain_sessions:
            self._chain_sessions = {d: self.chain_session(d) for d in range(2, self.max_k + 2)}
        return self._chain_sessions.get(depth)

    def _steps(self, state: DecodeState, last: int, carry_0: Value) -> ChainSteps:
        """The step plans of a static buffer set, after one checked run of the step graph:
        the borrowed ports bound to the target's buffers themselves (read in place, never
        copied), the table to the chain's, a buffer of their own for the other inputs."""
        seam, session, chain = self.seam, self.session, self.chain
        fixed = self._fixed_bindings(state)
        token = seam.write_ints(seam.zeros((1,), "int32", self.residency), [last])
        produced = session.invoke({**fixed, TABLE: self.table, TOKEN: token, CARRY: carry_0},
                                  [chain.logits_output, chain.carry_output, NEXT])
        shared: dict[str, Value] = {TABLE: self.table}
        for port, value in fixed.items():
            if port in chain.borrowed:
                shared[port] = value  # the target's buffer of the last layer
            else:
                buffer = seam.zeros(value.shape, value.dtype, session.device)
                shared[port] = PassPlan.copy_into(session, port, buffer, value)
        return ChainSteps(session, shared, carry_0, produced, self.max_k, chain.carry_output,
                          self.bootstrap_session)

    def _choose(self, state: DecodeState, out: dict[str, Value],
                position: int) -> tuple[int, Value | None]:
        """Step ``out``'s draft at sequence position ``position`` from its last score row:
        the argmax, or a draw from T(row) (sampler.choose)."""
        logits = out[self.chain.logits_output]  # [1, 1, V] draft scores
        return choose(self.seam, state.sampler,
                      self.seam.last_along_axis(logits, logits.rank - 2), position,
                      state.constraint)

    def _carry_0(self, pass_result: PassResult, num_kept: int) -> Value:
        """Row ``num_kept − 1`` of the latest pass's seed output, in the chain residency."""
        seed = pass_result.seed
        assert seed is not None  # load checked the target invoke binds the seed output
        try:
            carry_0 = self.seam.slice_axis(seed, seed.rank - 2, num_kept - 1, 1)  # [1, 1, W_C]
        except ContractError as exc:
            raise ChainError(f"cannot take carry_0 at row {num_kept - 1} of "
                             f"'{self.chain.seed_output}' {seed.describe()}: {exc}",
                             path="speculative.proposal_execution.folded_carry_seed") from exc
        return self.seam.adopt(carry_0, self.residency)

    def _step_carry(self, step_carry: Value) -> Value:
        """The carry a step hands to the next: its last row [1, 1, W_C]."""
        return self.seam.adopt(self.seam.last_along_axis(step_carry, step_carry.rank - 2),
                               self.residency)

    # -- bindings fixed for one proposal ---------------------------------------------------
    def _fixed_bindings(self, state: DecodeState,
                        into: dict[str, Value] | None = None) -> dict[str, Value]:
        """The proposer's inputs other than the step's own, for this proposal
        (docs/design/spec/runtime.md §9.2); with ``into`` (static caches: the step plans'
        buffers) each is written into its buffer instead (borrowed caches are the target's
        buffers themselves, the length is written in place)."""
        pass_result, num_kept = state.latest, state.num_kept
        assert pass_result is not None
        consumed = pass_result.start + num_kept  # C'
        fixed: dict[str, Value] = {}
        length_port = self._length_port
        for port, value_name in self.package.plan.proposer_inputs.items():
            if port == self.chain.fused_port:
                continue
            cell = self.chain.borrowed.get(port)
            if cell is not None:  # a borrowed cache: the owner's output, rolled back to C'
                # (static caches: the target's buffer itself, no copy; C' is its length)
                fixed[port] = self.seam.adopt(state.cells[cell], self.residency)
                continue
            if port == length_port and into is not None:  # the drafter sees slots [0, C')
                self.seam.write_ints(into[port], [consumed] * into[port].size)
                continue
            if port == length_port:
                dtype = self.session.ports.inputs[port].dtype
                fixed[port] = self.seam.adopt(Value.host(
                    np.full((1,), consumed, NUMPY_DTYPES[dtype]), dtype), self.residency)
                continue
            value = pass_result.values.get(value_name)
            if value is None:
                raise ChainError(f"proposer port '{port}' is bound to '{value_name}', which the "
                                 "latest pass did not bind or produce", path=port)
            dims = self.session.ports.inputs[port].dims
            for axis, dim in enumerate(dims):
                try:
                    if dim is not None and dim == self.chain.position_symbol:
                        value = self.seam.slice_axis(value, axis, num_kept - 1, 1)
                    elif dim is not None and dim == self.chain.kv_symbol:
                        value = self.seam.truncate_axis(value, axis, consumed)
                except ContractError as exc:
                    raise ChainError(f"cannot narrow '{value_name}' for proposer port '{port}' "
                                     f"on axis {axis} ({dim}): {exc}", path=port) from exc
            fixed[port] = self.seam.adopt(value, self.residency)
            if into is not None:
                PassPlan.copy_into(self.session, port, into[port], fixed[port])
        return fixed
