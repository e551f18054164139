"""`Sampler`: the sampling in force, the request's seed and how drafts are accepted
(docs/design/spec/runtime.md §17).

* ``"gumbel"`` (the default): the token at sequence position ``n`` is the Gumbel-max draw from
  ``T(row)`` with noise keyed by ``(seed, n, id)`` (``tensors/sampling.sample_keyed``). Nothing
  is drawn from a generator, so plain and speculative decoding commit the same tokens for a
  seed, whatever the widths (``k="auto"`` follows timings), the proposer or how often it ran:
  a proposer drafts with the same noise at the same positions, and a draft is accepted
  exactly when it equals the target's draw there.
* ``"rejection"``: rejection sampling, with one ``numpy`` generator seeded by the seed drawn in
  a fixed order (the prefill's draw; per round the proposal's draws, ``k_r`` acceptance
  uniforms, the correction's or bonus's draw): reproducible at a fixed ``k`` only.

The rows stay where they were produced; only ids (and the accepted count) come back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from speculant.tensors import TensorSeam, Value
from speculant.tensors.sampling import Sampling, seed_key
from speculant.workflow.constraint import Constraint

GUMBEL, REJECTION = "gumbel", "rejection"
ACCEPTANCE_METHODS = (GUMBEL, REJECTION)


@dataclass
class Sampler:
    params: Sampling
    seed: int  # >= 0, the request's (drawn fresh when the request gave none)
    acceptance: str = GUMBEL  # one of ACCEPTANCE_METHODS
    key: int = field(init=False)  # [0, 2^64): the noise key of the seed (gumbel)
    rng: np.random.Generator = field(init=False)  # the request's generator (rejection)

    def __post_init__(self) -> None:
        self.key = seed_key(self.seed)
        self.rng = np.random.default_rng(self.seed)

    @property
    def is_keyed(self) -> bool:
        """Draws are Gumbel-max on keyed noise (no generator state; drafts need no ``q``)."""
        return self.acceptance == GUMBEL

    def uniforms(self, count: int) -> list[float]:
        """The next ``count`` draws of the request's generator, each in [0, 1)."""
        return [float(u) for u in self.rng.random(count)]


def choose(seam: TensorSeam, sampler: Sampler | None, row: Value, position: int,
           constraint: Constraint | None = None) -> tuple[int, Value | None]:
    """The token at sequence position ``position`` for one score row ``row`` [..., 1, V]: its
    argmax (greedy: ``sampler`` is None), the keyed Gumbel-max draw from ``T(row)``, or
    (rejection) a draw from ``T(row)`` by the request's generator, returned with that
    distribution [1, V] float32 (where the row lives) for the verifier. 4 bytes read back.
    ``constraint``: the row masked by the grammar first."""
    if constraint is not None:
        row = constraint.mask_rows(seam, row, ())
    if sampler is None:
        return seam.read_token_ids(seam.argmax_rows(row))[0], None
    if sampler.is_keyed:
        return seam.read_token_ids(seam.sample_keyed(row, sampler.params, sampler.key,
                                                     position))[0], None
    probs = seam.distribution_rows(row, sampler.params)  # [1, V] float32
    return seam.read_token_ids(seam.sample_rows(probs, sampler.uniforms(1)))[0], probs
