"""One span per ext_proc stream, when tracing is on: what the span says, and the
interface of what records it.

The servicer gives a traced stream a :class:`NotingStreamMetrics` in place of its
metrics: it passes every event on unchanged and notes, from those events, what the
span reports (:class:`StreamFacts`). When the stream ends the servicer hands the
facts, the stream's start and end, and the gRPC metadata Envoy sent (its W3C
``traceparent``) to a :class:`StreamTracer`; extproc/service/tracing.py is the
OpenTelemetry one, and the only module that imports OpenTelemetry. Tracing off, the
servicer has no tracer and none of this runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from extproc.core.endpoint import Plan
from extproc.core.plan import RequestStats
from extproc.service.stream_metrics import (
    AdmissionStage,
    ProcessingPhase,
    RewriteKind,
    StreamMetrics,
)

# What the gateway did with the request: forwarded as sent (none); forwarded with a
# feature the upstream does itself (native: `dimensions` it cuts); rewritten, the
# request or the answer (emulated); answered by the gateway with an error (refused).
RewriteClass = Literal["none", "native", "emulated", "refused"]


@dataclass
class StreamFacts:
    """What one stream's span says. None: not known on this stream (a standalone
    request stream ends before the upstream answers; a refused request may never
    have named a model)."""

    model: str | None = None
    rewrite: RewriteClass = "none"
    inputs: int | None = None
    prompt_tokens: int | None = None  # the upstream's count, where its answer was read
    status: int | None = None  # the status the client gets

    def attributes(self) -> dict[str, str | int]:
        """The span's attributes (``embgw.*``), the unknown ones left out."""
        known: dict[str, str | int | None] = {
            "embgw.model": self.model,
            "embgw.rewrite": self.rewrite,
            "embgw.inputs": self.inputs,
            "embgw.tokens": self.prompt_tokens,
            "http.response.status_code": self.status,
        }
        return {key: value for key, value in known.items() if value is not None}


# A stream's metadata as Envoy sends it: where a trace context comes in.
Metadata = Iterable[tuple[str, Any]]


class StreamTracer(Protocol):
    def record(self, metadata: Metadata, start_ns: int, end_ns: int, facts: StreamFacts) -> None:
        """One span from ``start_ns`` to ``end_ns`` (epoch nanoseconds), a child of
        the trace context in ``metadata`` (a root span without one)."""

    def close(self) -> None:
        """Send what is still buffered (the server is stopping)."""


class NotingStreamMetrics:
    """A :class:`StreamMetrics` that passes every event to ``inner`` and notes the
    stream's :class:`StreamFacts` from them."""

    def __init__(self, inner: StreamMetrics) -> None:
        self.inner = inner
        self.facts = StreamFacts()

    def forwarded(self, stats: RequestStats, *, rewritten: bool) -> None:
        facts = self.facts
        facts.inputs = stats.inputs
        if rewritten or stats.dimensions_emulated:
            facts.rewrite = "emulated"
        elif stats.dimensions_forwarded:
            facts.rewrite = "native"
        self.inner.forwarded(stats, rewritten=rewritten)

    def rejected(self, status: int, param: str | None) -> None:
        self.facts.rewrite = "refused"
        self.facts.status = status
        self.inner.rejected(status, param)

    def upstream_response(self, status: int, *, local: bool) -> None:
        self.facts.status = status
        self.inner.upstream_response(status, local=local)

    def response_rewritten(
        self, kind: RewriteKind, *, status: int, prompt_tokens: int | None = None
    ) -> None:
        facts = self.facts
        facts.status = status
        facts.prompt_tokens = prompt_tokens
        if kind == "vectors":
            facts.rewrite = "emulated"
        self.inner.response_rewritten(kind, status=status, prompt_tokens=prompt_tokens)

    def anomaly(self, message: str) -> None:
        if message == "internal_error":
            self.facts.status = 500
        self.inner.anomaly(message)

    def admission_refused(self, stage: AdmissionStage) -> None:
        self.facts.rewrite = "refused"
        self.facts.status = 503
        self.inner.admission_refused(stage)

    def stream_opened(self) -> None:
        self.inner.stream_opened()

    def stream_closed(self) -> None:
        self.inner.stream_closed()

    def phase_seconds(self, phase: ProcessingPhase, seconds: float) -> None:
        self.inner.phase_seconds(phase, seconds)

    def stream_seconds(self, seconds: float) -> None:
        self.inner.stream_seconds(seconds)

    def admission_waited(self) -> None:
        self.inner.admission_waited()

    def admission_in_flight(self, work_bytes: int) -> None:
        self.inner.admission_in_flight(work_bytes)


def with_plan(facts: StreamFacts, plan: Plan | None) -> StreamFacts:
    """``facts`` with the model and input count of the stream's plan, where it has one
    (a response stream knows them only from its plan)."""
    if plan is not None:
        facts.model = plan.model
        facts.inputs = plan.input_count
    return facts
