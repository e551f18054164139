"""`DecodeState`: the one owner of a decode's caches, stream, serving controls and counters."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from speculant.errors import AdmissionError, ContractError
from speculant.package.package import Package
from speculant.package.plan import CellPlan, LoadPlan
from speculant.tensors import HOST, NO_TOKEN, NUMPY_DTYPES, TensorSeam, Value
from speculant.workflow.cells import (
    AppendedCells,
    RowCells,
    StaticCells,
    StaticPool,
    request_capacity,
)
from speculant.workflow.constraint import Constraint
from speculant.workflow.logprobs import Logprobs
from speculant.workflow.request import Admitted
from speculant.workflow.sampler import Sampler
from speculant.workflow.stats import DecodeStats
from speculant.workflow.stop_text import StopText
from speculant.workflow.target_pass import PassResult


@dataclass(frozen=True)
class RoundResult:
    """One speculative round's outcome (the round returns it, :meth:`DecodeState.record`
    records it)."""

    k: int  # k_r: drafts verified (0: a greedy step)
    num_accepted: int  # a: block positions accepted, the pending token included (1 … k + 1)
    tokens: list[int]  # to commit: the accepted drafts, then the correction or the bonus
    verify_pass: PassResult  # the round's target pass over [pending, d_1 … d_k]
    num_proposer_invocations: int = 0
    num_proposer_rows: int = 0  # score rows the proposer reduced to a token
    is_queued: bool = False  # queued on the device behind a pass not read yet (round.py)


def cell_shape(package: Package, cell: CellPlan, sequence_extent: int) -> list[int]:
    """A cell's shape: ``sequence_extent`` on the group's sequence axis, 1 on the request
    axis, the contract's fixed extents, and the owner graph's static extents for symbolic
    axes."""
    graph_inputs = {i.name: i for i in package.graphs[package.plan.target].graph.input}
    contract = cell.contract
    graph_dims = graph_inputs[cell.owner_input].type.tensor_type.shape.dim
    shape = []
    for axis, dim in enumerate(contract.dims):
        if axis == cell.sequence_axis:
            shape.append(sequence_extent)
        elif contract.batch_layout.kind == "request_aligned" and \
                axis == contract.batch_layout.axis:
            shape.append(1)
        elif isinstance(dim, int):
            shape.append(dim)
        elif axis < len(graph_dims) and graph_dims[axis].HasField("dim_value"):
            shape.append(graph_dims[axis].dim_value)
        else:
            raise AdmissionError(
                f"cell '{cell.name}' axis {axis} ({dim!r}) has no static extent in the "
                f"contract or in input '{cell.owner_input}' of the target graph, so its "
                "buffer cannot be built",
                path=f"pipeline.workflow.state.{cell.name}.contract.shape.{axis}",
                remedy="fix the extent in the contract or the graph")
    return shape


def empty_cells(package: Package) -> AppendedCells:
    """Each cell as an empty host tensor (appended caches: extent 0 on the sequence axis)."""
    return AppendedCells({name: Value.host(np.zeros(cell_shape(package, cell, 0),
                                                    NUMPY_DTYPES[cell.contract.dtype]),
                                           cell.contract.dtype)
                          for name, cell in package.plan.cells.items()})


def start_cells(seam: TensorSeam, package: Package, *, num_prompt: int, max_new_tokens: int,
                k: int, residency: str = HOST, what: str = "request",
                pool: StaticPool | None = None) -> AppendedCells | StaticCells:
    """A request's caches before its prefill: empty cells (appended), or the static buffers
    of the request's capacity in ``residency`` (:mod:`static_cells`): from ``pool`` (the
    engine's, reused with their pass plans) or, without one, allocated for this request."""
    if package.plan.static is None:
        return empty_cells(package)
    capacity = request_capacity(package.plan, num_prompt, max_new_tokens, k, what=what)

    def allocate(slots: int) -> dict[str, Value]:
        return {name: seam.zeros(cell_shape(package, cell, slots), cell.contract.dtype,
                                 residency) for name, cell in package.plan.cells.items()}

    if pool is None:
        return StaticCells(allocate(capacity), capacity)
    return pool.take(residency, capacity, package.plan.static.capacity, allocate)


def set_control(controls: dict[str, Value], control: str, number: int | bool) -> None:
    """Set serving control ``control`` (``active``, ``done``, ``accepted_len``), if bound."""
    current = controls.get(control)
    if current is not None:
        array = np.full(current.shape, number, dtype=current.data.dtype)
        controls[control] = Value.host(array, current.dtype)


@dataclass(frozen=True)
class StopRules:
    max_new_tokens: int
    stop_ids: frozenset[int]  # EOS ids in force (package EOS unless disabled, plus the request's)
    context_cap: int | None  # M


@dataclass
class DecodeState:
    """The stream, the caches, the serving controls and the chain context of one decode.

    Invariant between passes (docs/design/spec/runtime.md §14.2): every cell holds exactly positions
    ``0 … C−1``, computed from ``x[0..C)``; the *pending token* ``x[C] = tokens[-1]`` is the
    target's choice after ``x[0..C]`` and is not consumed yet; and ``(latest, num_kept)`` is
    the chain context: the first ``num_kept`` positions of the latest pass are the ones
    retained, so its seed row ``num_kept − 1`` is the target's hidden state at the last
    consumed token ``x[C−1]`` — the state that predicted the pending token.

    Build it with :meth:`start` (before the prefill) or :meth:`after_pass`; every counter
    of :attr:`stats` changes in :meth:`record_prefill` and :meth:`record`.
    """

    seam: TensorSeam
    plan: LoadPlan
    rules: StopRules
    admitted: Admitted
    tokens: list[int]  # the stream x[0..L): prompt, then committed tokens
    prompt_len: int  # P
    # cell -> [1, ..., C or capacity, ...], or a row of the engine's batched caches
    cells: AppendedCells | StaticCells | RowCells  # (workflow/cells.py)
    controls: dict[str, Value] = field(default_factory=dict)  # serving control -> current value
    consumed: int = 0  # C
    latest: PassResult | None = None
    num_kept: int = 0
    stop_reason: str | None = None
    stats: DecodeStats = field(default_factory=DecodeStats)
    sampler: Sampler | None = None  # T(row) and the request's generator; None: greedy
    text: StopText | None = None  # the committed text and its stop strings, when wanted
    target_file: str = ""  # the target's artifact, for messages
    constraint: Constraint | None = None  # the grammar's mask over every chosen row
    logprobs: Logprobs | None = None  # committed tokens' log-probabilities, when asked

    @classmethod
    def start(cls, seam: TensorSeam, package: Package, rules: StopRules, admitted: Admitted,
              prompt_ids: Iterable[int], *, sampler: Sampler | None = None,
              text: StopText | None = None, k: int = 0, residency: str = HOST,
              pool: StaticPool | None = None, constraint: Constraint | None = None,
              logprobs: Logprobs | None = None, row: RowCells | None = None) -> DecodeState:
        """The state before the prefill: empty caches (static caches: the buffers, allocated
        once in ``residency`` for a request of width up to ``k``; ``row``: a row of the
        engine's batched caches, reserved already), the admitted controls."""
        tokens = [int(t) for t in prompt_ids]
        cells = row if row is not None else start_cells(
            seam, package, num_prompt=len(tokens), max_new_tokens=rules.max_new_tokens, k=k,
            residency=residency, pool=pool)
        return cls(seam, package.plan, rules, admitted, tokens, len(tokens), cells,
                   dict(admitted.initial_controls), sampler=sampler, text=text,
                   target_file=str(package.artifacts.get(package.plan.target, package.root)),
                   constraint=constraint, logprobs=logprobs)

    @classmethod
    def after_pass(cls, seam: TensorSeam, plan: LoadPlan, admitted: Admitted,
                   tokens: Iterable[int], pass_result: PassResult, num_kept: int,
                   rules: StopRules | None = None) -> DecodeState:
        """The state whose chain context is ``(pass_result, num_kept)``: its caches cut to
        ``C = start + num_kept``; ``tokens`` is the stream ``x[0..C]``, pending token last."""
        stream = [int(t) for t in tokens]
        consumed = pass_result.start + num_kept
        cells, _ = pass_result.presents.roll_back(seam, plan, consumed)
        return cls(seam, plan, rules or StopRules(1, frozenset(), None), admitted, stream,
                   len(stream), cells, dict(admitted.initial_controls), consumed=consumed,
                   latest=pass_result, num_kept=num_kept)

    @property
    def pending(self) -> int:
        return self.tokens[-1]

    @property
    def num_generated(self) -> int:  # N
        return len(self.tokens) - self.prompt_len

    @property
    def is_stopped(self) -> bool:
        return self.stop_reason is not None

    @property
    def is_active(self) -> bool:
        """Whether the serving controls allow a pass (``active`` true and ``done`` false)."""
        active, done = self.controls.get("active"), self.controls.get("done")
        return not ((active is not None and not bool(active.data.reshape(-1)[0])) or
                    (done is not None and bool(done.data.reshape(-1)[0])))

    def room(self, ahead: int = 0) -> int:
        """Tokens the decode may still commit (R − N, and M − L under a context cap), less
        ``ahead``: those rounds launched and not read yet may commit first."""
        room = self.rules.max_new_tokens - self.num_generated - ahead
        if self.rules.context_cap is not None:
            room = min(room, self.rules.context_cap - len(self.tokens) - ahead)
        return room

    def capped_width(self, k: int, ahead: int = 0) -> int:
        """k_r = min(k, R − 1, M − L − 1) ; k is already <= the bound."""
        return max(min(k, self.room(ahead) - 1), 0)

    # -- the two places a decode's counters and stream change ------------------------------
    def record_prefill(self, pass_result: PassResult, first: int) -> list[int]:
        """The prefill consumed the prompt and chose ``first``; returns what was committed.
        A draw gives NaN scores probability 0, so under sampling the prefill's row is also
        reduced by the argmax rule once: scores without a finite maximum stop the decode."""
        if self.sampler is not None:
            logits = pass_result.logits  # [1, P, V]
            row = self.seam.last_along_axis(logits, logits.rank - 2)
            if self.seam.read_token_ids(self.seam.argmax_rows(row))[0] == NO_TOKEN:
                raise self._no_finite_scores()
        self.stats.record_prefill(self.sampler is not None)
        self.record_chunk(pass_result)
        committed = self.commit([first])
        if self.logprobs is not None:  # the prefill's last row chose it
            self.logprobs.record(self.seam, pass_result.logits, committed,
                                 first_row=len(pass_result.tokens) - 1)
        return committed

    def record_chunk(self, pass_result: PassResult) -> None:
        """A prompt chunk consumed (the whole prompt alone; in chunks decoded together): its
        caches adopted, its rows' prompt log-probabilities recorded where asked."""
        if self.logprobs is not None and self.logprobs.wants_prompt:
            self.logprobs.record_prompt(self.seam, pass_result.logits,
                                        self.tokens[:self.prompt_len], pass_result.start)
        self.advance(pass_result, len(pass_result.tokens))

    def record(self, result: RoundResult) -> list[int]:
        """Record one round: roll back to ``C + num_accepted`` (the chain context becomes
        ``(verify_pass, num_accepted)``), then commit its tokens; returns those committed."""
        self.stats.record_pass(result.k, result.num_accepted, result.num_proposer_invocations,
                               result.num_proposer_rows, self.sampler is not None,
                               len(self.plan.rollback_state), result.is_queued)
        self.advance(result.verify_pass, result.num_accepted)
        committed = self.commit(result.tokens)
        if self.logprobs is not None:  # row i of the verify pass chose committed token i
            self.logprobs.record(self.seam, result.verify_pass.logits, committed)
        return committed

    def stop(self, reason: str) -> None:
        """End the decode from outside the loop (a closed stream, inactive controls)."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def commit(self, tokens: Iterable[int]) -> list[int]:
        """Append tokens one at a time with stop checks; return those committed."""
        committed = []
        for token in tokens:
            if self.is_stopped:
                break
            if token == NO_TOKEN:  # the argmax of scores without a finite maximum
                raise self._no_finite_scores()
            self.tokens.append(int(token))
            committed.append(int(token))
            if self.constraint is not None:
                self.constraint.commit(token)
            self.stop_reason = self._stop_after(int(token))
        self.stats.record_commit(len(committed))
        if self.is_stopped:
            set_control(self.controls, "active", False)
            set_control(self.controls, "done", True)
        return committed

    def _no_finite_scores(self) -> ContractError:
        target = self.plan.target
        return ContractError(
            f"the target '{target}' computed logits with no finite maximum (NaN or +inf) at "
            f"position {len(self.tokens)}: no token can be chosen from them",
            file=self.target_file, path=f"pipeline.workflow.components.{target}",
            remedy="check the target's weights for NaN or infinite values (a broken export or "
                   "conversion; a float16 graph that overflows), and re-export the model")

    def _stop_after(self, token: int) -> str | None:
        is_stop_string = self.text is not None and self.text.push(token)
        if self.num_generated >= self.rules.max_new_tokens:
            return "max_new_tokens"
        if token in self.rules.stop_ids:
            return "eos"
        if is_stop_string:
            return "stop_string"
        if self.rules.context_cap is not None and len(self.tokens) >= self.rules.context_cap:
            return "context_full"
        if self.constraint is not None and self.constraint.is_finished:
            return "grammar"
        return None

    def advance(self, pass_result: PassResult, num_kept: int) -> None:
        """Adopt the pass's caches for its first ``num_kept`` positions: C' = C0 + num_kept.

        The target's rollback (through :func:`roll_back`): every ``rollback_state`` cell
        is truncated along its group's sequence axis to ``C0 + num_kept`` — never one more:
        that position holds a rejected draft, and the correction now pending is consumed
        there next pass. Static caches keep their buffers: the rollback is the length
        ``C ← C0 + num_kept`` alone (``stats.rollback_bytes_moved`` stays 0).
        """
        new_consumed = pass_result.start + num_kept
        self.cells = pass_result.presents
        if num_kept < len(pass_result.tokens):
            self.cells, moved = self.cells.roll_back(self.seam, self.plan, new_consumed)
            self.stats.rollback_bytes_moved += moved
        self.consumed = new_consumed  # static caches: L = C + a, nothing else
        self.latest, self.num_kept = pass_result, num_kept
        set_control(self.controls, "accepted_len", num_kept)
