"""A StreamMetrics (extproc/service/stream_metrics.py) that keeps what the stream and
the servicer report, in order, so that a test can drive them without Prometheus and
assert on the events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from extproc.core.plan import RequestStats
from extproc.service.stream_metrics import AdmissionStage, ProcessingPhase, RewriteKind


@dataclass
class RecordedMetrics:
    # (event, arguments...) in the order reported; timings without their seconds,
    # which are kept apart in `seconds`.
    events: list[tuple[Any, ...]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [event for event in self.events if event[0] == name]

    def stream_opened(self) -> None:
        self.events.append(("stream_opened",))

    def stream_closed(self) -> None:
        self.events.append(("stream_closed",))

    def forwarded(self, stats: RequestStats, *, rewritten: bool) -> None:
        self.events.append(("forwarded", stats, rewritten))

    def rejected(self, status: int, param: str | None) -> None:
        self.events.append(("rejected", status, param))

    def upstream_response(self, status: int, *, local: bool) -> None:
        self.events.append(("upstream_response", status, local))

    def response_rewritten(self, kind: RewriteKind) -> None:
        self.events.append(("response_rewritten", kind))

    def anomaly(self, message: str) -> None:
        self.events.append(("anomaly", message))

    def phase_seconds(self, phase: ProcessingPhase, seconds: float) -> None:
        self.events.append(("phase_seconds", phase))
        self.seconds.append(seconds)

    def stream_seconds(self, seconds: float) -> None:
        self.events.append(("stream_seconds",))
        self.seconds.append(seconds)

    def admission_waited(self) -> None:
        self.events.append(("admission_waited",))

    def admission_refused(self, stage: AdmissionStage) -> None:
        self.events.append(("admission_refused", stage))

    def admission_in_flight(self, work_bytes: int) -> None:
        self.events.append(("admission_in_flight", work_bytes))
