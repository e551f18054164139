"""Shared by the draft-model, prompt-lookup and sampling tests: the draft fixture's deviation
positions, the fixture's exact sampled distributions, and a chi-square test.

Chi-square: cells of probability 0 must be empty; cells whose expected count is below 5 are
pooled into one; the statistic is compared with the critical value at significance
``ALPHA = 0.001`` (Wilson–Hilferty: ``dof · (1 − 2/(9 dof) + z √(2/(9 dof)))³`` with ``z`` the
standard normal quantile of ``1 − ALPHA``; within 1 % of the exact quantile for dof ≥ 3; the
exact quantiles for dof 1 and 2).
Every sample in these tests comes from fixed seeds, so a verdict never changes between runs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from builders import DEFAULT_DEVIATION_POSITIONS, VOCAB_SIZE, FixtureSpec, target_next
from builders import definition as fx

# A draft that agrees with the target except at 7, 17, 40 (only the target deviates) and at
# 10, 28, 50 (only the draft does).
DRAFT_DEVIATIONS = (DEFAULT_DEVIATION_POSITIONS - {7, 17, 40}) | {10, 28, 50}
DRAFT_SPEC = fx.make_spec(DRAFT_DEVIATIONS)

ALPHA = 0.001
Z_ALPHA = 3.090232306167813  # the standard normal quantile of 1 - ALPHA


def chi_square_critical(dof: int, z: float = Z_ALPHA) -> float:
    if dof < 1:
        return math.inf  # one cell: nothing to test beyond the empty zero-mass cells
    if dof <= 2:
        return (10.828, 13.816)[dof - 1]  # the exact quantiles at ALPHA = 0.001
    h = 2.0 / (9.0 * dof)
    return dof * (1.0 - h + z * math.sqrt(h)) ** 3


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """(statistic, critical value at ALPHA) of ``counts`` [V] against ``probs`` [V]."""
    counts = np.asarray(counts, np.float64)
    probs = np.asarray(probs, np.float64)
    assert counts[probs == 0].sum() == 0, "a sample fell where the distribution has no mass"
    n = counts.sum()
    expected = n * probs[probs > 0]
    observed = counts[probs > 0]
    small = expected < 5
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return statistic, chi_square_critical(len(expected) - 1)


def assert_follows(samples: Sequence[int] | np.ndarray, probs: np.ndarray, what: str) -> None:
    counts = np.bincount(np.asarray(samples, np.int64), minlength=len(probs))
    statistic, critical = chi_square(counts, probs)
    assert statistic < critical, (f"{what}: chi-square {statistic:.1f} >= {critical:.1f} "
                                  f"(alpha {ALPHA}, {len(samples)} samples)")


def total_variation(samples: np.ndarray, probs: np.ndarray) -> float:
    empirical = np.bincount(samples, minlength=len(probs)) / len(samples)
    return 0.5 * float(np.abs(empirical - probs).sum())


# -- the fixture's sampled distributions ---------------------------------------------------------
def fixture_distribution(chosen: int, temperature: float, margin: float = 8.0) -> np.ndarray:
    """``T(row)`` of a fixture logits row (``margin`` at ``chosen``, 0 elsewhere), [32]."""
    weights = np.ones(VOCAB_SIZE)
    weights[chosen] = math.exp(margin / temperature)
    return weights / weights.sum()


def exact_marginals(spec: FixtureSpec, prompt: Sequence[int], num_tokens: int,
                    temperature: float) -> list[np.ndarray]:
    """The marginal distribution [32] of each of the first ``num_tokens`` generated tokens
    when the target samples at ``temperature`` (no stop on EOS), by enumerating streams."""
    paths: dict[tuple[int, ...], float] = {tuple(prompt): 1.0}
    marginals = []
    for _ in range(num_tokens):
        following: dict[tuple[int, ...], float] = defaultdict(float)
        marginal = np.zeros(VOCAB_SIZE)
        for stream, weight in paths.items():
            dist = fixture_distribution(target_next(spec, stream, len(stream) - 1), temperature)
            marginal += weight * dist
            for token in range(VOCAB_SIZE):
                following[stream + (token,)] += weight * dist[token]
        marginals.append(marginal)
        paths = following
    return marginals
