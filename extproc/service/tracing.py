"""The OpenTelemetry :class:`StreamTracer`: one span per ext_proc stream, exported
over OTLP/gRPC. The only module of the package that imports OpenTelemetry; it is
imported only when tracing is switched on (`extproc serve --tracing`), so without it
nothing of OpenTelemetry is loaded and the servicer's tracer is None.

Configured by OpenTelemetry's own environment, as any OTLP exporter is:
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``, default
``http://localhost:4317``), ``OTEL_EXPORTER_OTLP_INSECURE``, ``OTEL_SERVICE_NAME``
(default ``extproc``), ``OTEL_TRACES_SAMPLER`` (default: follow the parent's
decision, so a request Envoy does not sample gets no span here either) and the batch
processor's ``OTEL_BSP_*``.

The parent is the trace context Envoy puts in the ext_proc call's gRPC metadata (W3C
``traceparent``/``tracestate``, read with the W3C propagator): the span is a child of
Envoy's span for the ext_proc call, under the request's trace id. A stream without it
starts a trace of its own.
"""

from __future__ import annotations

import os

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from extproc.service.stream_tracer import Metadata, StreamFacts

SPAN_NAME = "extproc stream"
_CONTEXT_KEYS = frozenset(TraceContextTextMapPropagator().fields)


class OtlpStreamTracer:
    """Spans of ext_proc streams, batched and sent over OTLP/gRPC."""

    def __init__(self) -> None:
        service = os.environ.get("OTEL_SERVICE_NAME") or "extproc"
        self._provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self._tracer = self._provider.get_tracer("extproc")
        self._propagator = TraceContextTextMapPropagator()

    def record(self, metadata: Metadata, start_ns: int, end_ns: int, facts: StreamFacts) -> None:
        carrier = {
            key: value for key, value in metadata if key in _CONTEXT_KEYS and isinstance(value, str)
        }
        parent = self._propagator.extract(carrier)
        span = self._tracer.start_span(
            SPAN_NAME,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=facts.attributes(),
            start_time=start_ns,
        )
        span.end(end_time=end_ns)

    def close(self) -> None:
        self._provider.shutdown()
