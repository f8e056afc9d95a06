"""The comparator engine: pair store + comparison + tally + metrics.

Sans-I/O: halves come in with the time (``now``, monotonic seconds), results and
counts go out. The gRPC tap streams, the expiry timer and the summary all call
into one instance on one event loop, so it needs no locks.
"""

from __future__ import annotations

from typing import Any

from extproc.tools.parity import Thresholds
from extproc.tools.shadow.comparator_metrics import ShadowMetrics
from extproc.tools.shadow.half import Half
from extproc.tools.shadow.pair_comparison import PairResult, ShadowTolerances, compare_pair
from extproc.tools.shadow.store import Completed, Dropped, PairStore, StoreLimits
from extproc.tools.shadow.summary import summarize
from extproc.tools.shadow.tally import Tally

_LIMITS = StoreLimits()
_TOLERANCES = ShadowTolerances()
_THRESHOLDS = Thresholds()


class Comparator:
    def __init__(
        self,
        *,
        limits: StoreLimits = _LIMITS,
        tolerances: ShadowTolerances = _TOLERANCES,
        thresholds: Thresholds = _THRESHOLDS,
        expect_noise: bool = False,
        metrics: ShadowMetrics | None = None,
    ) -> None:
        self.store = PairStore(limits, expect_noise=expect_noise)
        self.tolerances = tolerances
        self.thresholds = thresholds
        self.tally = Tally()
        self.metrics = metrics if metrics is not None else ShadowMetrics()

    def accept(self, half: Half, now: float) -> PairResult | None:
        self.tally.halves_received[half.role.value] += 1
        self.metrics.halves.labels(half.role.value).inc()
        completed, dropped = self.store.add(half, now)
        self._dropped(dropped)
        result = self._compare(completed) if completed is not None else None
        self._gauges()
        return result

    def expire(self, now: float) -> list[PairResult]:
        completed, dropped = self.store.expire(now)
        self._dropped(dropped)
        results = [self._compare(c) for c in completed]
        self._gauges()
        return results

    def tap_problem(self, reason: str) -> None:
        self.tally.tap_problems[reason] += 1
        self.metrics.tap_problems.labels(reason).inc()

    def summary(self) -> dict[str, Any]:
        return summarize(
            self.tally,
            tolerances=self.tolerances,
            thresholds=self.thresholds,
            pending=self.store.pending,
        )

    def _compare(self, completed: Completed) -> PairResult:
        result = compare_pair(
            completed.baseline, completed.candidate, completed.noise, self.tolerances
        )
        self.tally.add_pair(result)
        self.metrics.observe_pair(result)
        return result

    def _dropped(self, dropped: list[Dropped]) -> None:
        for item in dropped:
            self.tally.halves_dropped[f"{item.reason}/{item.role.value}"] += 1
            self.metrics.halves_dropped.labels(item.role.value, item.reason).inc()

    def _gauges(self) -> None:
        self.metrics.pending.set(self.store.pending)
        self.metrics.pending_bytes.set(self.store.pending_bytes)
