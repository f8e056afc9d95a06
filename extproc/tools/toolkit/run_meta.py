"""What every tool's report says first: the two servers it compared, the model it
asked for, when the run started (wall clock, for people) and how long it took
(monotonic clock); and the clock a run starts to measure it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from extproc.tools.toolkit.server_pair import ServerPair


@dataclass(frozen=True)
class RunMeta:
    baseline: str
    candidate: str
    model: str
    started: str  # ISO 8601, UTC
    duration_s: float


@dataclass(frozen=True)
class RunClock:
    """A run's start, on both clocks."""

    wall: str
    monotonic: float

    @classmethod
    def start(cls) -> RunClock:
        return cls(datetime.now(UTC).isoformat(timespec="seconds"), time.monotonic())

    def meta(self, servers: ServerPair, model: str) -> RunMeta:
        """The run's meta, its duration up to now."""
        duration = time.monotonic() - self.monotonic
        return RunMeta(servers.baseline, servers.candidate, model, self.wall, duration)
