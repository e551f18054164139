"""The seam's sampling (docs/design/spec/residency.md §3): ``T(row)``, draws (keyed Gumbel-max,
or inverse CDF from host uniforms) and the rejection sampler of a round, each run where its
rows live (the math: tensors/sampling.py); only ids come back. A part of
:class:`~speculant.tensors.seam.TensorSeam`, kept in its own module."""

from __future__ import annotations

import operator
from collections.abc import Sequence

from speculant.errors import ContractError
from speculant.tensors.sampling import MASK64, Sampling
from speculant.tensors.value import FLOAT_DTYPES, Value


class SamplingOps:
    """Mixed into TensorSeam: uses its ``backend_for``, ``_empty`` and ``_same_residency``."""

    def distribution_rows(self, scores: Value, sampling: Sampling) -> Value:
        """``T(row)`` of every score row of ``scores`` [..., V]: [R, V] float32
        probabilities, computed where the scores live (the math: tensors/sampling.py)."""
        self._check_scores("distribution_rows", scores, sampling)
        if scores.size == 0:
            return self._empty((0, scores.shape[-1]), "float32")
        return self.backend_for("distribution_rows", scores, "scores").distribution(
            scores, sampling)

    def sample_keyed(self, scores: Value, sampling: Sampling, key: int, start: int) -> Value:
        """One token id per score row of ``scores`` [..., V], row ``r`` drawn at sequence
        position ``start + r`` by Gumbel-max on the noise keyed by ``(key, position, id)``
        (``key``: ``sampling.seed_key`` of the request's seed): [R] int32 token ids, computed
        where the scores live; 4 bytes a row to read back."""
        op = "sample_keyed"
        self._check_scores(op, scores, sampling)
        if not (0 <= operator.index(key) <= MASK64 and operator.index(start) >= 0):
            raise ContractError(f"{op}: key {key} or start {start} out of range",
                                value=(key, start), expected="0 <= key < 2^64, start >= 0")
        if scores.size == 0:
            return self._empty((0,), "int32", "token_ids")
        return self.backend_for(op, scores, "scores").keyed(scores, sampling, int(key),
                                                             int(start))

    def sample_rows(self, probs: Value, uniforms: Sequence[float]) -> Value:
        """One token id per row of ``probs`` [R, V] float32, by inverse CDF with the host
        uniforms ``u_r`` in [0, 1): [R] int32 token ids, where ``probs`` lives."""
        self._check_probs("sample_rows", probs, "probabilities")
        self._check_uniforms("sample_rows", uniforms, probs.shape[0])
        if probs.shape[0] == 0:
            return self._empty((0,), "int32", "token_ids")
        return self.backend_for("sample_rows", probs, "probabilities").sample(probs, uniforms)

    def rejection_sample(self, p: Value, q: Sequence[Value] | None, drafts: Sequence[int],
                         uniforms: Sequence[float]) -> Value:
        """Speculative rejection sampling of one round.

        ``p`` [k + 1, V] float32: the target's distributions for block positions 1 … k + 1;
        ``q``: the rows [r, V_q] float32 (together k, one width ``V_q <= V``) the drafts were
        drawn from, or None for deterministic drafts (``V_q < V``: a subset proposer
        vocabulary, ``q = 0`` on ids ``>= V_q``); ``drafts``: the k draft ids (``< V_q``);
        ``uniforms``: k acceptance uniforms, then the uniform of the correction or bonus.
        Returns [2] int32 token ids, ``[a, token]``, where ``p`` lives: 8 bytes to read back.
        """
        op = "rejection_sample"
        self._check_probs(op, p, "p")
        k = len(drafts)
        if p.shape[0] != k + 1:
            raise ContractError(f"{op}: p has {p.shape[0]} rows for {k} drafts",
                                value=p.shape, expected=f"{k + 1} rows")
        width = q_width = p.shape[1]
        if q is not None:
            q_width = q[0].shape[-1] if q else width
            for row in q:
                self._check_probs(op, row, "q")
                self._same_residency(op, p, row, "p", "q")
                if row.shape[1] != q_width or q_width > width:
                    raise ContractError(f"{op}: q {row.describe()} is not {q_width} wide like "
                                        f"the first q row, or is wider than p {p.describe()}",
                                        value=row.shape,
                                        expected=f"one width <= {width} for every q row")
            if sum(row.shape[0] for row in q) != k:
                raise ContractError(f"{op}: q has {sum(r.shape[0] for r in q)} rows for {k} "
                                    "drafts", expected=f"{k} rows")
        bad = [d for d in drafts if not 0 <= operator.index(d) < q_width]  # drawn from q
        if bad:
            raise ContractError(f"{op}: draft ids {bad} outside [0, {q_width})", value=bad,
                                expected=f"0 <= id < {q_width}")
        self._check_uniforms(op, uniforms, k + 1)
        q = q if k else None  # no drafts: nothing was drawn from any q
        return self.backend_for(op, p, "p").rejection(p, q, [int(d) for d in drafts],
                                                      [float(u) for u in uniforms])

    @staticmethod
    def _check_scores(op: str, scores: Value, sampling: Sampling) -> None:
        if scores.dtype not in FLOAT_DTYPES:
            raise ContractError(f"{op}: scores must be float32, float16 or bfloat16, got "
                                f"{scores.describe()}", value=scores.dtype,
                                expected="a float dtype")
        if scores.rank == 0 or scores.shape[-1] == 0:
            raise ContractError(f"{op}: score rows of width 0 in {scores.describe()}",
                                value=scores.shape, expected="last extent >= 1")
        if not sampling.temperature > 0:
            raise ContractError(f"{op}: temperature {sampling.temperature} is not > 0 "
                                "(temperature 0 is greedy: use argmax_rows)",
                                value=sampling.temperature, expected="> 0")

    @staticmethod
    def _check_probs(op: str, probs: Value, role: str) -> None:
        if probs.dtype != "float32" or probs.rank != 2 or probs.shape[1] == 0:
            raise ContractError(f"{op}: {role} must be [R, V] float32 probability rows "
                                f"(from distribution_rows), got {probs.describe()}",
                                value=probs.shape, expected="[R, V] float32, V >= 1")

    @staticmethod
    def _check_uniforms(op: str, uniforms: Sequence[float], count: int) -> None:
        if len(uniforms) != count or not all(0.0 <= float(u) < 1.0 for u in uniforms):
            raise ContractError(f"{op}: needs {count} uniforms in [0, 1), got "
                                f"{list(uniforms)!r}", value=len(uniforms),
                                expected=f"{count} floats in [0, 1)")
