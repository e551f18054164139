"""`DecodeState`: the one owner of a decode's caches, stream and counters."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from speculant.package.plan import LoadPlan
from speculant.tensors import TensorSeam, Value
from speculant.workflow.request import Admitted
from speculant.workflow.sampler import Sampler
from speculant.workflow.stats import DecodeStats
from speculant.workflow.target_pass import PassResult


def truncate_cells(seam: TensorSeam, plan: LoadPlan, cells: Mapping[str, Value],
                   length: int) -> dict[str, Value]:
    """Rollback, the one mechanism: ``cells`` with every ``rollback_state`` cell cut to its
    first ``length`` positions on its group's sequence axis (a view for a contiguous prefix,
    a copy where it is strided), every copy in one write batch. The target's state
    (:meth:`DecodeState.advance`) and a draft model's own state both roll back through it."""
    kept = dict(cells)
    with seam.write_batch():  # every truncation copy, then one fence at most
        for name in plan.rollback_state:
            kept[name] = seam.truncate_axis(cells[name], plan.cells[name].sequence_axis, length)
    return kept


def set_control(admitted: Admitted, control: str, number: int | bool) -> None:
    """Set serving control ``control`` (``active``, ``done``, ``accepted_len``), if bound."""
    current = admitted.controls.get(control)
    if current is not None:
        array = np.full(current.shape, number, dtype=current.data.dtype)
        admitted.controls[control] = Value.host(array, current.dtype)


@dataclass(frozen=True)
class StopRules:
    max_new_tokens: int
    stop_ids: frozenset[int]  # EOS ids in force (package EOS unless disabled, plus the request's)
    stop_sequences: tuple[tuple[int, ...], ...]
    context_cap: int | None  # M


@dataclass
class DecodeState:
    """The stream, the caches and the chain context of one decode.

    Invariant between passes (runtime.md §14.2): every cell holds exactly positions
    ``0 … C−1``, computed from ``x[0..C)``; the *pending token* ``x[C] = tokens[-1]`` is the
    target's choice after ``x[0..C]`` and is not consumed yet; and ``(latest, keep)`` is the
    chain context: the first ``keep`` positions of the latest pass are the ones retained, so
    its seed row ``keep − 1`` is the target's hidden state at the last consumed token
    ``x[C−1]`` — the state that predicted the pending token.
    """

    seam: TensorSeam
    plan: LoadPlan
    rules: StopRules
    admitted: Admitted
    tokens: list[int]  # the stream x[0..L): prompt, then committed tokens
    prompt_len: int  # P
    cells: dict[str, Value]  # cell -> current value [1, ..., C, ...] on its sequence axis
    consumed: int = 0  # C
    latest: PassResult | None = None
    keep: int = 0
    stop_reason: str | None = None
    stats: DecodeStats = field(default_factory=DecodeStats)
    sampler: Sampler | None = None  # T(row) and the request's generator; None: greedy

    @property
    def pending(self) -> int:
        return self.tokens[-1]

    @property
    def num_generated(self) -> int:  # N
        return len(self.tokens) - self.prompt_len

    @property
    def is_stopped(self) -> bool:
        return self.stop_reason is not None

    def capped_width(self, k: int) -> int:
        """k_r = min(k, R − 1, M − L − 1) (runtime.md §13); k is already <= the bound."""
        width = min(k, self.rules.max_new_tokens - self.num_generated - 1)
        if self.rules.context_cap is not None:
            width = min(width, self.rules.context_cap - len(self.tokens) - 1)
        return max(width, 0)

    def commit(self, tokens: Iterable[int]) -> list[int]:
        """Append tokens one at a time with stop checks; return those committed."""
        committed = []
        for token in tokens:
            if self.is_stopped:
                break
            self.tokens.append(int(token))
            committed.append(int(token))
            self.stats.committed += 1
            self.stop_reason = self._stop_after(int(token))
        if self.is_stopped:
            self._set_control("active", False)
            self._set_control("done", True)
        return committed

    def _stop_after(self, token: int) -> str | None:
        if self.num_generated >= self.rules.max_new_tokens:
            return "max_new_tokens"
        if token in self.rules.stop_ids:
            return "eos"
        for sequence in self.rules.stop_sequences:
            if sequence and tuple(self.tokens[-len(sequence):]) == sequence:
                return "stop_sequence"
        if self.rules.context_cap is not None and len(self.tokens) >= self.rules.context_cap:
            return "context_full"
        return None

    def advance(self, vp: PassResult, keep: int) -> None:
        """Adopt the pass's caches for its first ``keep`` positions: C' = C0 + keep.

        The target's rollback (through :func:`truncate_cells`): every ``rollback_state`` cell
        is truncated along its group's sequence axis to ``C0 + keep`` — never
        ``C0 + keep + 1``: position ``C0 + keep`` holds a rejected draft, and the correction
        now pending is consumed there next pass.
        """
        new_consumed = vp.start + keep
        self.cells = (truncate_cells(self.seam, self.plan, vp.presents, new_consumed)
                      if keep < len(vp.tokens) else dict(vp.presents))
        self.consumed = new_consumed
        self.latest, self.keep = vp, keep
        self._set_control("accepted_len", keep)

    def _set_control(self, control: str, number: int | bool) -> None:
        set_control(self.admitted, control, number)
