"""A decode's caches, the one owner of their two kinds: how each holds positions and rolls back.

* :class:`AppendedCells`: each cell grows by the pass's block (the owner's present, extent
  ``C0 + n``); rollback cuts it to ``C`` (:func:`truncate_cells`: a view for a contiguous
  prefix, a counted copy where it is strided).
* :class:`StaticCells`: for a package whose caches are fixed-capacity (``LoadPlan.static``,
docs/design/static-cache.md) the decode state holds a :class:`StaticCells` instead of the
appended form's growing cells: each cell is one buffer ``[1, KV, capacity, d]`` in the
target's residency, whose slots ``[0, L)`` are valid, ``L`` being the consumed count. A pass
writes its block at ``[L, L + n)`` in place (the target's past and present bound to the same
buffer) and rollback is ``L ← C + a``: zero bytes move. The pass plans of the target (one per
block width, `session/plan.py`) live here too, since they bind these buffers.
* :class:`RowCells`: a request decoded with others (speculative/scheduler.py) holds one row of
  the engine's batched buffers ``[B, KV, capacity, d]`` (workflow/batched_pass.py); the
  state's consumed count is the row's cursor, so rollback is again a length: zero bytes move.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from speculant.errors import RequestError
from speculant.package.plan import LoadPlan
from speculant.session.plan import PassPlan
from speculant.tensors import TensorSeam, Value


def truncate_cells(seam: TensorSeam, plan: LoadPlan, cells: Mapping[str, Value],
                   length: int) -> AppendedCells:
    """Rollback, the one mechanism of appended caches: ``cells`` with every ``rollback_state``
    cell cut to its first ``length`` positions on its group's sequence axis (a view for a
    contiguous prefix, a copy where it is strided), every copy in one write batch. The
    target's state and a draft model's own state both roll back through it."""
    kept = AppendedCells(cells)
    with seam.write_batch():  # every truncation copy, then one fence at most
        for name in plan.rollback_state:
            kept[name] = seam.truncate_axis(cells[name], plan.cells[name].sequence_axis, length)
    return kept


class AppendedCells(dict[str, Value]):
    """cell -> its value ``[1, ..., C, ...]``, replaced by the owner's present every pass."""

    is_in_place = False  # a pass returns new, longer values; no pass plans

    def roll_back(self, seam: TensorSeam, plan: LoadPlan, length: int
                  ) -> tuple[AppendedCells, int]:
        """These caches cut to ``length`` positions, and the bytes the cut copied."""
        kept = truncate_cells(seam, plan, self, length)
        moved = sum(kept[name].nbytes for name in plan.rollback_state
                    if kept[name] is not self[name] and kept[name].owner is not self[name])
        return kept, moved


class StaticCells(dict[str, Value]):
    """cell -> its buffer ``[1, ..., capacity, ...]`` (fixed for the request's life), with the
    capacity and the pass plans that bind the buffers, by block width."""

    is_in_place = True  # a pass writes its block into the buffers through a plan of its width

    def roll_back(self, seam: TensorSeam, plan: LoadPlan, length: int
                  ) -> tuple[StaticCells, int]:
        """The same buffers: the length ``C`` (the state's) is the rollback, zero bytes."""
        return self, 0

    def __init__(self, buffers: dict[str, Value], capacity: int) -> None:
        super().__init__(buffers)
        self.capacity = capacity
        self.plans: dict[int, PassPlan] = {}  # block width n -> the target's plan
        # the chained drafter's step plans (speculative/chain_steps.py: they bind these buffers)
        self.chain_steps: Any = None


class RowCells:
    """A request's row of the engine's batched caches (the buffers belong to the
    :class:`~speculant.workflow.batched_pass.BatchedTargetPass`): its row index, given when
    the request takes a row (None while it waits), the slots it reserved (``P + R + k + 1``). The
    row's valid slots are ``[0, C)``, ``C`` being the decode state's consumed count, the one
    home of the row's length: every batched pass takes its cursor from it."""

    is_in_place = True  # a pass writes the row's block at its cursor, in place

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.row: int | None = None

    def roll_back(self, seam: TensorSeam, plan: LoadPlan, length: int) -> tuple[RowCells, int]:
        """The same row: the length ``C`` (the state's) is the rollback, zero bytes."""
        return self, 0


CAPACITY_STEP = 128  # capacities are rounded up to a multiple of this (and to the package's)


class StaticPool:
    """An engine's static caches, kept from request to request: one :class:`StaticCells` per
    (residency, capacity), the capacity rounded up to :data:`CAPACITY_STEP`. Requests to an
    engine run one at a time, so the next request reuses the buffers and, with them, every
    pass plan (and CUDA graph) made for them: plans are made once per capacity and width, not
    once per request. The slots past a request's length are never read, so stale contents
    from the last request are harmless."""

    def __init__(self) -> None:
        self._cells: dict[tuple[str, int], StaticCells] = {}

    def take(self, residency: str, capacity: int, largest: int | None,
             allocate: Callable[[int], dict[str, Value]]) -> StaticCells:
        rounded = -(-capacity // CAPACITY_STEP) * CAPACITY_STEP
        if largest is not None:
            rounded = min(rounded, largest)
        key = (residency, rounded)
        if key not in self._cells:
            self._cells[key] = StaticCells(allocate(rounded), rounded)
        return self._cells[key]


def request_capacity(plan: LoadPlan, num_prompt: int, max_new_tokens: int, k: int, *,
                     what: str = "request") -> int:
    """The capacity a request's buffers get: its bound ``P + max_new_tokens + k + 1``
    (every slot it can write, with room for a last verify block), which must not exceed the
    package's ``update.capacity``; a RequestError naming the numbers otherwise."""
    assert plan.static is not None
    bound = num_prompt + max_new_tokens + k + 1
    largest = plan.static.capacity
    if largest is not None and bound > largest:
        raise RequestError(
            f"the {what} needs {bound} cache slots (prompt {num_prompt} + max_new_tokens "
            f"{max_new_tokens} + k {k} + 1) but the package's static caches hold at most "
            f"{plan.static.capacity_input} = {largest}", path="max_new_tokens",
            value=bound, expected=f"prompt + max_new_tokens + k + 1 <= {largest}",
            remedy=f"lower max_new_tokens to at most {max(largest - num_prompt - k - 1, 0)}, "
            "shorten the prompt, or lower k")
    return bound

