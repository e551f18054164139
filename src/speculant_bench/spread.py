"""Medians with spread over repeats: the one summary every timed figure gets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Spread:
    """Median, quartiles and range of one figure over the repeats (linear-interpolated
    quartiles, as numpy.percentile)."""

    median: float
    q1: float
    q3: float
    min: float
    max: float
    values: tuple[float, ...]  # one per repeat, in run order

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("a spread needs at least one value")
        array = np.asarray(values, dtype=np.float64)
        q1, median, q3 = np.percentile(array, [25, 50, 75])
        return cls(float(median), float(q1), float(q3), float(array.min()), float(array.max()),
                   tuple(float(v) for v in array))

    def scaled(self, factor: float) -> Spread:
        return Spread.of([v * factor for v in self.values])

    def as_dict(self) -> dict:
        data = asdict(self)
        data["values"] = list(self.values)
        return data
