"""What the stream state machine and the servicer report, as events: the interface
they are given at construction. extproc/service/metrics.py counts them in
Prometheus; a test can record them instead.
"""

from __future__ import annotations

from typing import Literal, Protocol

from extproc.core.plan import RequestStats

ProcessingPhase = Literal["request", "response"]
RewriteKind = Literal["vectors", "error_envelope"]
AdmissionStage = Literal["headers", "request", "response"]
# What ``anomaly`` names: a ProcessingRequest's message kind (its ``request`` oneof),
# ``unknown_message`` (none set), or ``internal_error`` (our own code raised).
ANOMALY_KINDS = (
    "request_headers",
    "request_body",
    "request_trailers",
    "response_headers",
    "response_body",
    "response_trailers",
    "unknown_message",
    "internal_error",
)


class StreamMetrics(Protocol):
    def stream_opened(self) -> None:
        """An ext_proc stream started."""

    def stream_closed(self) -> None:
        """An ext_proc stream ended, however it ended."""

    def forwarded(self, stats: RequestStats, *, rewritten: bool) -> None:
        """A request passed the contract and goes to the upstream, rewritten or as sent."""

    def rejected(self, status: int, param: str | None) -> None:
        """A request was answered with an error of the client's making."""

    def upstream_response(self, status: int, *, local: bool) -> None:
        """The response's status was seen; ``local``: Envoy's own reply, not the
        upstream's."""

    def response_rewritten(
        self, kind: RewriteKind, *, status: int, prompt_tokens: int | None = None
    ) -> None:
        """The client gets the gateway's answer instead of the upstream's body: with
        ``status``, and the upstream's token count where its answer was read."""

    def anomaly(self, message: str) -> None:
        """A message out of order or unknown was answered neutrally; ``message`` is
        its kind (``internal_error``: our own code raised)."""

    def phase_seconds(self, phase: ProcessingPhase, seconds: float) -> None:
        """Time the gateway's own processing of one phase took."""

    def stream_seconds(self, seconds: float) -> None:
        """Time from a stream's start to the reply that decided its answer."""

    def admission_waited(self) -> None:
        """A request had to wait for room in the admission budget."""

    def admission_refused(self, stage: AdmissionStage) -> None:
        """A request was answered 503 ``overloaded`` at this stage."""

    def admission_in_flight(self, work_bytes: int) -> None:
        """The work the admission budget now holds in flight."""
