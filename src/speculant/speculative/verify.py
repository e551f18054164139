"""Verification (docs/design/spec/runtime.md §10-§11, §17.4): which block positions the target
accepts, and the token it commits after them.

``greedy_accept`` is a pure function of the block and the target's choices: the argmax of
each row (greedy) or, under keyed sampling, the Gumbel-max draw at each row's sequence
position (``seam.sample_keyed``). Under rejection sampling the pure function is
``tensors.sampling.rejection_sample`` (the same code over numpy and CuPy). Both are reached
through the seam so that the rows stay where they were produced. :func:`verify` picks one and
returns ``(num_accepted, token)``; it changes nothing but the request's generator (rejection
sampling's draws), and the round records nothing itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from speculant.tensors import TensorSeam, Value
from speculant.workflow.constraint import Constraint
from speculant.workflow.sampler import Sampler


def greedy_accept(block: Sequence[int], target: Sequence[int]) -> int:
    """Accepted block positions ``a``: position 0 (the pending token) always, then each draft
    up to the first that differs from the target's choice there. ``1 <= a <= len(block)``.

    ``block = [p, d_1, …, d_k]``; ``target[i]`` is the target's choice after consuming
    ``block[0..i)`` (``target[0] = p``). ``target[a]`` is then the correction (``a <= k``)
    or the bonus (``a = k + 1``).
    """
    a = 1
    while a < len(block) and block[a] == target[a]:
        a += 1
    return a


def verify(seam: TensorSeam, sampler: Sampler | None, block: Sequence[int], logits: Value,
           q: Sequence[Value] | None, start: int,
           constraint: Constraint | None = None,
           argmax: Callable[[], list[int]] | None = None) -> tuple[int, int]:
    """``(num_accepted, t[num_accepted])`` for the block ``[p, d_1 … d_k]`` at sequence
    positions ``start … start + k`` from the verification scores ``logits`` [1, k + 1, V]
    (row ``i`` scores the token after ``block[0..i]``, at position ``start + i + 1``).

    Greedy (``sampler`` None): ``t`` is the argmax of every row (``k + 1`` ids read back)
    and ``num_accepted`` comes from :func:`greedy_accept`. Keyed sampling: the same with
    ``t`` the Gumbel-max draw of every row at its position — the token plain sampling draws
    there, so a draft is accepted exactly when it is that token. Rejection sampling:
    against ``p_i = T(row i − 1)`` with the drafts' distributions ``q`` (None:
    deterministic drafts, ``q = δ_d``), drawing ``k`` acceptance uniforms then the
    correction or bonus; the count and the token are read back (8 bytes).

    ``constraint``: every row is first masked by the grammar, advanced along the drafts
    (workflow/constraint.py), so the target's choice at each row is one the grammar allows
    and a draft it refuses is never accepted. ``argmax``: the rows' argmax made already (a
    batched pass's, for all its rows at once), which greedy verification reads if unmasked.
    """
    drafts = block[1:]
    if constraint is not None:
        logits, argmax = constraint.mask_rows(seam, logits, drafts), None
    if sampler is None or sampler.is_keyed:
        if sampler is None and argmax is not None:  # reduced with the pass's other rows
            ids = argmax()
        else:  # the rows reduced here, [k + 1] int32, and read back
            ids = seam.read_token_ids(seam.argmax_rows(logits) if sampler is None else
                                      seam.sample_keyed(logits, sampler.params, sampler.key,
                                                        start + 1))
        t = [block[0], *ids]  # k + 1 ids
        num_accepted = greedy_accept(block, t)
        return num_accepted, t[num_accepted]
    p = seam.distribution_rows(logits, sampler.params)  # [k + 1, V] float32
    num_accepted, token = seam.read_token_ids(
        seam.rejection_sample(p, q, drafts, sampler.uniforms(len(drafts) + 1)))
    return num_accepted, token


def verify_in_place(seam: TensorSeam, drafts: Value, logits: Value) -> tuple[int, list[int]]:
    """Greedy verification of drafts kept where they were made: ``(a, [c_1 … c_a])`` from
    the drafts [k] int32 and the scores [1, k + 1, V], compared there
    (``seam.accept_greedy``, the device twin of :func:`greedy_accept`); the one read-back
    is ``[a, c_1 … c_{k+1}]``, 4 (k + 2) bytes."""
    count_then_ids = seam.read_token_ids(seam.accept_greedy(drafts, seam.argmax_rows(logits)))
    num_accepted = count_then_ids[0]
    return num_accepted, count_then_ids[1:1 + num_accepted]
