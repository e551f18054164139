"""`Sampler`: the sampling in force and the request's generator (docs/design/spec/runtime.md §17).

Draws come from one ``numpy`` generator seeded by the request seed, in a fixed order: the
first token's draw at prefill; then per round the proposal's draws (one per sampled draft),
the round's acceptance uniforms (one per draft, all drawn whatever the outcome) and the draw
of the correction or bonus. A run is therefore reproducible for a given seed and ``k``. The
uniforms are host floats; the rows they are applied to stay where they were produced, and
only token ids (and the accepted count) come back (tensors/seam.py, "sampling").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from speculant.tensors import TensorSeam, Value
from speculant.tensors.sampling import Sampling


@dataclass
class Sampler:
    params: Sampling
    rng: np.random.Generator

    @classmethod
    def seeded(cls, params: Sampling, seed: int) -> Sampler:
        return cls(params, np.random.default_rng(seed))

    def uniforms(self, count: int) -> list[float]:
        """The next ``count`` draws of the request's generator, each in [0, 1)."""
        return [float(u) for u in self.rng.random(count)]


def choose(seam: TensorSeam, sampler: Sampler | None, row: Value) -> tuple[int, Value | None]:
    """The token for one score row ``row`` [..., 1, V]: its argmax (greedy: ``sampler`` is
    None), or a draw from ``T(row)``, returned with that distribution [1, V] float32 (where
    the row lives) for the verifier. 4 bytes read back either way."""
    if sampler is None:
        return seam.read_token_ids(seam.argmax_rows(row))[0], None
    probs = seam.distribution_rows(row, sampler.params)  # [1, V] float32
    return seam.read_token_ids(seam.sample_rows(probs, sampler.uniforms(1)))[0], probs

