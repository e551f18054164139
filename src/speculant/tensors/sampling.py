"""Sampling math (docs/design/spec/runtime.md §17), written once over an array module ``xp``.

The host backend calls these functions with ``numpy`` and the CUDA backend with ``cupy``, so
the two run the same operations in the same order: the same sort of values (never a sort
whose tie order matters), the same cumulative sums, the same comparisons. Ties are broken by
the lower id through counts over id order, never through the stability of a library sort.
Internally everything is float64; probability rows are stored as float32.

* :func:`widen_bfloat16` reads bfloat16 scores as float32 (the one widening).
* :func:`distribution_rows` is ``T(row)``: scores -> a distribution per row.
* :func:`sample_rows` draws one id per row by inverse CDF with a given uniform.
* :func:`rejection_sample` is the speculative verifier, batched: a pure function of
  ``(p, q, drafts, uniforms)``. With ``q = None`` the drafts are deterministic (``q = δ_d``).
* :func:`keyed_gumbel` and :func:`sample_keyed`: Gumbel-max draws from noise keyed by
  ``(seed, position, id)`` through a counter-based hash (splitmix64), so the token drawn at a
  sequence position depends on nothing else — not on the width of the pass that scored it,
  nor on which proposer ran or how often (docs/design/spec/runtime.md §17).

The uniforms and keys come from the caller (one per request, on the host), so these
functions are deterministic: the same inputs give the same ids on either backend, up to the
rounding of float64 cumulative sums (or of ``log``) at a boundary of measure zero. The hash
is integer arithmetic, identical on both.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Sampling:
    """The parameters of ``T(row)``. ``temperature > 0``; ``top_k = 0`` keeps every id;
    ``top_p = 1.0`` and ``min_p = 0.0`` filter nothing. Checked at request admission."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0


MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment, 2^64 / the golden ratio
_MIX = (30, 0xBF58476D1CE4E5B9, 27, 0x94D049BB133111EB, 31)  # splitmix64's finalizer


def _mix(xp: ModuleType, z: Any) -> Any:
    """splitmix64's finalizer (a bijection) over a uint64 array; products wrap mod 2^64."""
    shift1, mul1, shift2, mul2, shift3 = (xp.uint64(c) for c in _MIX)
    z = (z ^ (z >> shift1)) * mul1
    z = (z ^ (z >> shift2)) * mul2
    return z ^ (z >> shift3)


def seed_key(seed: int) -> int:
    """The 64-bit key of a request seed (any int >= 0): its 64-bit words, lowest first,
    folded through :func:`_mix`. Distinct seeds below 2^64 have distinct keys."""
    key = GOLDEN
    while True:
        key = int(_mix(np, np.asarray([(key + (seed & MASK64)) & MASK64], np.uint64))[0])
        seed >>= 64
        if not seed:
            return key


def keyed_gumbel(xp: ModuleType, key: int, positions: Any, width: int) -> Any:
    """[R, V] float64 standard Gumbel noise ``G(key, position, id)`` for ``positions`` [R]
    (sequence positions) and ids ``0 … width − 1``: ``−log(−log u)`` with
    ``u = ((bits >> 11) + 0.5) / 2^53`` in (0, 1), where ``bits`` is splitmix64's output
    number ``id + 1`` from the state ``mix(key ^ position · GOLDEN)``. Pure integer
    arithmetic up to ``u``, so the host and the device give the same ``u`` bit for bit."""
    steps = xp.asarray(positions, xp.uint64).reshape(-1, 1) * xp.uint64(GOLDEN)  # [R, 1]
    streams = _mix(xp, steps ^ xp.uint64(key))  # [R, 1] uint64: one stream per position
    ids = xp.arange(1, width + 1, dtype=xp.uint64).reshape(1, -1)  # [1, V] uint64
    bits = _mix(xp, streams + ids * xp.uint64(GOLDEN))  # [R, V] uint64
    u = ((bits >> xp.uint64(11)).astype(xp.float64) + 0.5) * 2.0 ** -53  # [R, V] in (0, 1)
    return -xp.log(-xp.log(u))


def sample_keyed(xp: ModuleType, rows: Any, sampling: Sampling, key: int,
                 positions: Any) -> Any:
    """One id per score row of ``rows`` [R, V] float64, row ``r`` drawn at sequence position
    ``positions[r]``: the argmax of ``log T(row) + G(key, position, id)`` over the ids
    ``T(row)`` keeps (Gumbel-max: a draw from ``T(row)``, exact for independent noise).
    ``T``'s filters (top_k, top_p, min_p) apply first; an id of probability 0 never wins;
    ties go to the lower id. [R] int64."""
    w = distribution_rows(xp, rows, sampling)  # [R, V] float64
    kept = w > 0
    scores = xp.where(kept, xp.log(xp.where(kept, w, 1.0)), -xp.inf)  # log T(row); −inf: dropped
    scores = scores + keyed_gumbel(xp, key, positions, rows.shape[-1])
    top = scores.max(axis=-1, keepdims=True)  # [R, 1]
    return _first_true(xp, scores == top, 0)


def widen_bfloat16(xp: ModuleType, words: Any) -> Any:
    """bfloat16 words (any 16-bit dtype: ml_dtypes' bfloat16 on the host, ``uint16`` on
    CUDA) as float32, exactly: the 16 bits go to the top half of a float32. A new array."""
    return xp.left_shift(words.view(xp.uint16).astype(xp.uint32), xp.uint32(16)).view(xp.float32)


def _first_true(xp: ModuleType, mask: Any, default: int) -> Any:
    """[R] int64: the lowest column where ``mask`` [R, V] is true, ``default`` where none."""
    width = mask.shape[-1]
    columns = xp.arange(width, dtype=xp.int64)
    first = xp.where(mask, columns, width).min(axis=-1)
    return xp.where(first < width, first, default)


def _keep_most_probable(xp: ModuleType, w: Any, count: Any) -> Any:
    """``w`` [R, V] float64 with all but the ``count`` [R, 1] largest entries of each row
    zeroed; among equal values the lower ids are kept."""
    descending = -xp.sort(-w, axis=-1)  # [R, V] values only: tie order cannot matter
    threshold = xp.take_along_axis(descending, count - 1, axis=-1)  # [R, 1]
    greater = w > threshold
    equal = w == threshold
    room = count - greater.sum(axis=-1, keepdims=True)  # [R, 1] equal values still kept
    keep = greater | (equal & (xp.cumsum(equal, axis=-1) <= room))
    return xp.where(keep, w, 0.0)


def distribution_rows(xp: ModuleType, rows: Any, sampling: Sampling) -> Any:
    """``T(row)`` for ``rows`` [R, V] float64 (scores widened exactly); [R, V] float64.

    NaN gets probability 0; the rest is ``softmax(score / temperature)``, where ``+inf``
    scores share all the mass and a row whose non-NaN scores are all ``-inf`` is one-hot at
    its argmax (the first index of its maximum; an all-NaN row is one-hot at 0). Then, in
    this order: keep the ``top_k`` most probable ids; keep the smallest prefix of ids by
    descending probability whose mass reaches ``top_p`` of the (renormalized) total; drop ids
    below ``min_p`` times the largest probability; renormalize. Ties always go to the lower id.
    """
    width = rows.shape[-1]
    is_nan = xp.isnan(rows)
    key = xp.where(is_nan, -xp.inf, rows / sampling.temperature)  # [R, V] float64
    top = key.max(axis=-1, keepdims=True)  # [R, 1]
    finite_top = xp.isfinite(top)
    w = xp.exp(key - xp.where(finite_top, top, 0.0))  # softmax numerators; -inf -> 0
    w = xp.where(top == xp.inf, (key == xp.inf).astype(xp.float64), w)
    columns = xp.arange(width, dtype=xp.int64)
    argmax = _first_true(xp, (key == top) & ~is_nan, 0)[:, None]  # [R, 1]
    w = xp.where(top == -xp.inf, (columns == argmax).astype(xp.float64), w)
    w = w / w.sum(axis=-1, keepdims=True)

    if 0 < sampling.top_k < width:
        count = xp.full((rows.shape[0], 1), sampling.top_k, dtype=xp.int64)
        w = _keep_most_probable(xp, w, count)
        w = w / w.sum(axis=-1, keepdims=True)
    if sampling.top_p < 1.0:
        descending = -xp.sort(-w, axis=-1)
        mass = xp.cumsum(descending, axis=-1)  # [R, V]
        reached = mass >= sampling.top_p * mass[:, -1:]
        count = _first_true(xp, reached, width - 1)[:, None] + 1  # [R, 1] ids kept
        w = _keep_most_probable(xp, w, count)
    if sampling.min_p > 0.0:
        w = xp.where(w >= sampling.min_p * w.max(axis=-1, keepdims=True), w, 0.0)
    return w / w.sum(axis=-1, keepdims=True)


def sample_rows(xp: ModuleType, probs: Any, uniforms: Any) -> Any:
    """One id per row of ``probs`` [R, V] (any non-negative weights) with ``uniforms`` [R] in
    [0, 1): the lowest id whose cumulative weight exceeds ``u`` times the row's total.
    An id of weight 0 is never drawn. [R] int64."""
    cumulative = xp.cumsum(probs.astype(xp.float64), axis=-1)  # [R, V]
    total = cumulative[:, -1:]
    return _first_true(xp, cumulative > uniforms[:, None] * total, 0)


def rejection_sample(xp: ModuleType, p: Any, q: Any | None, drafts: Any,
                     uniforms: Any) -> tuple[Any, Any]:
    """Speculative rejection sampling for a batch of ``B`` rounds.

    ``p`` [B, k + 1, V]: the target's distributions at block positions 1 … k + 1 (row ``i``
    scores the token after ``block[0..i]``). ``q`` [B, k, V_q] with ``V_q <= V``: the
    distributions the drafts were drawn from, or None for deterministic drafts (``q = δ_d``);
    a proposer vocabulary that is a subset of the target's (ids ``< V_q`` used unchanged) has
    ``q = 0`` on the ids it lacks, so ``q`` is padded with zeros to ``V``. ``drafts`` [B, k].
    ``uniforms`` [B, k + 1] in [0, 1): one acceptance uniform per draft, then the uniform of
    the correction or bonus draw (all drawn whatever the outcome, so the draw order is fixed).

    Draft ``i`` is accepted when ``u_i · q_i(d_i) < p_i(d_i)`` (that is, with probability
    ``min(1, p/q)``); at the first rejection the correction is drawn from
    ``norm(max(0, p_i − q_i))`` (``p_i`` itself if that has no mass, which rounding alone can
    cause); when all ``k`` are accepted the bonus is drawn from ``p_{k+1}``.
    Returns ``(a, token)``, each [B] int64: ``a = 1 +`` the accepted drafts.
    """
    batch, k = drafts.shape
    width = p.shape[-1]
    drafts = drafts.astype(xp.int64)
    p = p.astype(xp.float64)
    if q is None:
        q = (xp.arange(width, dtype=xp.int64) == drafts[..., None]).astype(xp.float64)
    else:
        q = q.astype(xp.float64)
        if q.shape[-1] < width:  # a subset proposer vocabulary: q is 0 beyond its V_q ids
            q = xp.concatenate([q, xp.zeros(q.shape[:-1] + (width - q.shape[-1],),
                                            xp.float64)], axis=-1)
    p_draft = xp.take_along_axis(p[:, :k], drafts[..., None], axis=-1)[..., 0]  # [B, k]
    q_draft = xp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]  # [B, k]
    accepted = uniforms[:, :k] * q_draft < p_draft  # [B, k]
    num_accepted = _first_true(xp, ~accepted, k) if k else xp.zeros(batch, xp.int64)  # [B]
    residual = xp.maximum(p[:, :k] - q, 0.0)  # [B, k, V]
    has_mass = residual.sum(axis=-1, keepdims=True) > 0
    residual = xp.where(has_mass, residual, p[:, :k])
    candidates = xp.concatenate([residual, p[:, k:]], axis=1)  # [B, k + 1, V]
    final = xp.take_along_axis(candidates, num_accepted[:, None, None], axis=1)[:, 0]  # [B, V]
    return num_accepted + 1, sample_rows(xp, final, uniforms[:, k])
