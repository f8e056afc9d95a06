"""RSS of watched processes, sampled on a timer and on demand."""

from __future__ import annotations

import signal
import time
from typing import Any

from testing_support.processes import memory_kb


class Sampler:
    """VmRSS of the watched processes every ``interval`` s (SIGALRM) and on demand.

    SIGALRM runs the sampler in this one thread, so that wrk is still started from a
    single-threaded process (its preexec_fn needs that).
    """

    def __init__(self, pids: dict[str, int], interval: float, t0: float) -> None:
        self.pids = pids
        self.interval = interval
        self.t0 = t0
        self.window: int | None = None
        self.samples: list[dict[str, Any]] = []

    def sample(self, at: str = "timer") -> dict[str, Any]:
        row: dict[str, Any] = {
            "t_s": round(time.monotonic() - self.t0, 2),
            "window": self.window,
            "at": at,
        }
        for name, pid in self.pids.items():
            rss = memory_kb(pid).get("VmRSS")
            row[f"{name}_rss_mb"] = round(rss / 1024, 1) if rss else None
        self.samples.append(row)
        return row

    def in_window(self, index: int, name: str) -> list[float]:
        """The non-empty RSS samples of one process during one window."""
        return [
            s[f"{name}_rss_mb"]
            for s in self.samples
            if s["window"] == index and s[f"{name}_rss_mb"]
        ]

    def _on_alarm(self, _signum: int, _frame: Any) -> None:
        self.sample()

    def __enter__(self) -> Sampler:
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.setitimer(signal.ITIMER_REAL, self.interval, self.interval)
        return self

    def __exit__(self, *_: object) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
