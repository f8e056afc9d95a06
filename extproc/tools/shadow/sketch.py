"""A mergeable quantile sketch with bounded memory (a small DDSketch).

Positive values fall into logarithmic buckets ``(gamma**(i-1), gamma**i]`` with
``gamma = (1 + a) / (1 - a)``: any quantile comes back within relative error
``a`` (1 % by default). Values at or below ``floor`` are counted in one zero
bucket; values are clamped at ``ceiling``, so there are at most
``log(ceiling / floor) / log(gamma)`` buckets (about 2,100 for 1e-9..1e9 at 1 %),
whatever the number of observations. Two sketches with the same accuracy merge
exactly by adding their bucket counts (replicas' tallies do).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

DEFAULT_ACCURACY: Final = 0.01
FLOOR: Final = 1e-9
CEILING: Final = 1e9


class Sketch:
    def __init__(self, accuracy: float = DEFAULT_ACCURACY) -> None:
        if not 0 < accuracy < 1:
            raise ValueError("accuracy must be in (0, 1)")
        self.accuracy = accuracy
        self._log_gamma = math.log((1 + accuracy) / (1 - accuracy))
        self.count = 0
        self.zeros = 0
        self.buckets: dict[int, int] = {}
        self.min = math.inf
        self.max = -math.inf

    def add(self, value: float) -> None:
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"sketch values must be finite and >= 0, got {value}")
        self.count += 1
        self.min = min(self.min, value)
        self.max = max(self.max, value)
        if value <= FLOOR:
            self.zeros += 1
            return
        index = math.ceil(math.log(min(value, CEILING)) / self._log_gamma)
        self.buckets[index] = self.buckets.get(index, 0) + 1

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 <= q <= 1), None when empty; min and max are exact."""
        if self.count == 0:
            return None
        if q <= 0:
            return self.min
        if q >= 1:
            return self.max
        rank = q * (self.count - 1)
        seen = self.zeros
        if rank < seen:
            return max(self.min, 0.0)
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if rank < seen:
                gamma = math.exp(self._log_gamma)
                value = 2 * gamma**index / (gamma + 1)  # the bucket's midpoint, relatively
                return min(max(value, self.min), self.max)
        return self.max

    def merge(self, other: Sketch) -> None:
        if other.accuracy != self.accuracy:
            raise ValueError("cannot merge sketches of different accuracy")
        self.count += other.count
        self.zeros += other.zeros
        for index, n in other.buckets.items():
            self.buckets[index] = self.buckets.get(index, 0) + n
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def to_json(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "count": self.count,
            "zeros": self.zeros,
            "min": self.min if self.count else None,
            "max": self.max if self.count else None,
            "buckets": {str(k): v for k, v in sorted(self.buckets.items())},
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Sketch:
        sketch = cls(float(doc["accuracy"]))
        sketch.count = int(doc["count"])
        sketch.zeros = int(doc["zeros"])
        if sketch.count:
            sketch.min = float(doc["min"])
            sketch.max = float(doc["max"])
        sketch.buckets = {int(k): int(v) for k, v in doc["buckets"].items()}
        return sketch

    @classmethod
    def merged(cls, sketches: Iterable[Sketch], accuracy: float = DEFAULT_ACCURACY) -> Sketch:
        out = cls(accuracy)
        for sketch in sketches:
            out.merge(sketch)
        return out
