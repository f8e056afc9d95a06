"""Pure numbers: cosine similarity, spreads, percentiles, bootstrap intervals,
histograms.

No I/O here; everything the verdict depends on is computed by these functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float64]


def l2_norm(v: Vector) -> float:
    return float(np.linalg.norm(v))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks
    (numpy's default, "linear"): p99 of 30 samples lies between the 29th and 30th."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


@dataclass(frozen=True)
class Spread:
    """Where a non-empty sample lies: min, p1, median, max."""

    n: int
    min: float
    p1: float
    median: float
    max: float


def spread(values: Sequence[float]) -> Spread:
    if not values:
        raise ValueError("spread of no values")
    return Spread(
        n=len(values),
        min=min(values),
        p1=percentile(values, 1.0),
        median=median(values),
        max=max(values),
    )


@dataclass(frozen=True)
class Interval:
    """A sample's mean, and the interval that holds it at some confidence."""

    mean: float
    low: float
    high: float


def bootstrap_interval(
    values: npt.NDArray[np.float64], confidence: float, resamples: int, seed: int = 0
) -> Interval:
    """The mean of ``values`` and its percentile bootstrap interval (``resamples``
    resamples, seeded: the same values give the same interval); NaN for no values."""
    if values.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, values.size, size=(resamples, values.size))
    means = values[picks].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Interval(float(values.mean()), float(low), float(high))


def histogram(values: Sequence[float], lo: float, hi: float, bins: int) -> list[int]:
    """Counts of ``values`` in ``bins`` equal bins over [lo, hi]; the last bin is closed.
    Values outside [lo, hi] are clamped into the first or last bin."""
    if bins < 1:
        raise ValueError("bins must be >= 1")
    if not hi > lo:
        raise ValueError("histogram needs hi > lo")
    counts = [0] * bins
    width = (hi - lo) / bins
    for value in values:
        index = int((value - lo) / width)
        counts[min(max(index, 0), bins - 1)] += 1
    return counts


def ratio(candidate: float | None, baseline: float | None) -> float | None:
    """candidate / baseline, or None when either is missing or the baseline is 0."""
    if candidate is None or baseline is None or baseline == 0.0:
        return None
    return candidate / baseline
