"""Metrics that keep what they are told, in order, so that a test can drive the
gateway's code without Prometheus and assert on the events: the stream's and the
servicer's (StreamMetrics, extproc/service/stream_metrics.py), the policy reloader's
(PolicyReloadMetrics, extproc/service/reload.py), the certificate reloader's
(TlsReloadMetrics, extproc/service/tls.py) and, all three, a server's (ServerMetrics,
extproc/service/server.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from extproc.core.plan import RequestStats
from extproc.service.reload import NotAppliedSetting
from extproc.service.stream_metrics import AdmissionStage, ProcessingPhase, RewriteKind


@dataclass
class Recorded:
    # (event, arguments...) in the order reported (list.append: from any thread).
    events: list[tuple[Any, ...]] = field(default_factory=list)

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [event for event in self.events if event[0] == name]


@dataclass
class RecordedStreamMetrics(Recorded):
    """A StreamMetrics. Timings are recorded without their seconds, which are kept
    apart in ``seconds``."""

    seconds: list[float] = field(default_factory=list)

    def open_streams(self) -> int:
        """Streams opened and not closed yet."""
        return len(self.named("stream_opened")) - len(self.named("stream_closed"))

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

    def response_rewritten(
        self, kind: RewriteKind, *, status: int, prompt_tokens: int | None = None
    ) -> None:
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


@dataclass
class RecordedPolicyReloads(Recorded):
    """A PolicyReloadMetrics."""

    def reloaded(self) -> None:
        self.events.append(("reloaded",))

    def rejected(self) -> None:
        self.events.append(("rejected",))

    def setting_not_applied(self, setting: NotAppliedSetting, not_applied: bool) -> None:
        self.events.append(("setting_not_applied", setting, not_applied))

    def envoy_limits_stale(self, stale: bool) -> None:
        self.events.append(("envoy_limits_stale", stale))


@dataclass
class RecordedTlsReloads(Recorded):
    """A TlsReloadMetrics."""

    def reloaded(self) -> None:
        self.events.append(("reloaded",))

    def rejected(self) -> None:
        self.events.append(("rejected",))


@dataclass
class RecordedServerMetrics:
    """A ServerMetrics of the recorders above. Publishing is recorded; nothing is served."""

    streams: RecordedStreamMetrics = field(default_factory=RecordedStreamMetrics)
    policy_reloads: RecordedPolicyReloads = field(default_factory=RecordedPolicyReloads)
    tls_reloads: RecordedTlsReloads = field(default_factory=RecordedTlsReloads)
    published: list[tuple[str, int]] = field(default_factory=list)

    def publish(self, host: str, port: int) -> None:
        self.published.append((host, port))
