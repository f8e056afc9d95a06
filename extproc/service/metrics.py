"""Prometheus metrics: the only module of extproc/service that imports prometheus_client.
Label values come from fixed sets only (never from client input: no model names, no
text), so cardinality stays bounded.

:class:`MetricFamilies` are the gateway's metrics, registered in one registry.
:class:`PrometheusServerMetrics` counts in them what the server's streams and
servicer (:class:`PrometheusStreamMetrics`), its policy reloader
(:class:`PrometheusPolicyReloadMetrics`) and its certificate reloader
(:class:`PrometheusTlsReloadMetrics`) report, and publishes them over HTTP.
:func:`process_metrics` are the process's own, in prometheus_client's global registry,
which takes each metric name once: what `extproc serve`'s /metrics shows and, under
`extproc run --workers N`, what each worker writes for the launcher to add up.

A labelled child is looked up once: prometheus_client's ``labels()`` takes a lock and
builds its key on every call, several times per request. prometheus_client exports a
labelled series only once its child exists, so :meth:`MetricFamilies.known_series`
creates, at 0, every series whose labels are known before any request: a fresh
gateway's first scrape has what the dashboard and the alerts name (an absent series
reads as "No data", not 0, and breaks ratios and ``absent()``). Only
extproc_rejections_total stays open: its ``param`` label is the field a client got
wrong.
"""

from __future__ import annotations

import functools
from typing import get_args

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

from extproc.core.plan import RequestStats
from extproc.service.stream_metrics import (
    ANOMALY_KINDS,
    AdmissionStage,
    ProcessingPhase,
    RewriteKind,
)

REQUEST_OUTCOMES = ("passthrough", "rewritten", "rejected")
REQUEST_REWRITES = ("instruction", "truncation", "dimensions", "fields_stripped")
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx", "local")
RELOAD_OUTCOMES = ("reloaded", "rejected")


class MetricFamilies:
    """The gateway's metrics, registered in ``registry`` (docs/metrics.md)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "extproc_requests_total",
            "Embeddings requests by outcome: passthrough (forwarded as sent), rewritten, rejected.",
            ["outcome"],
            registry=registry,
        )
        self.rejections = Counter(
            "extproc_rejections_total",
            "Requests answered by the gateway with an error, by status and offending param.",
            ["status", "param"],
            registry=registry,
        )
        self.rewrites = Counter(
            "extproc_rewrites_total",
            "Request rewrites by kind: instruction, truncation, dimensions, fields_stripped.",
            ["kind"],
            registry=registry,
        )
        self.tokens_cut = Counter(
            "extproc_tokens_cut_total",
            "Tokens removed by truncation; a lower bound for very long inputs, whose tail "
            "beyond a few thousand tokens is never tokenized.",
            registry=registry,
        )
        self.upstream_responses = Counter(
            "extproc_upstream_responses_total",
            "Responses seen, by status class (2xx..5xx) or 'local' for Envoy's own replies.",
            ["status_class"],
            registry=registry,
        )
        self.responses_rewritten = Counter(
            "extproc_responses_rewritten_total",
            "Responses rewritten, by kind: vectors (dimensions/encoding), error_envelope.",
            ["kind"],
            registry=registry,
        )
        self.stream_anomalies = Counter(
            "extproc_stream_anomalies_total",
            "Messages that arrived out of order or unexpected, answered neutrally.",
            ["message"],
            registry=registry,
        )
        # multiprocess_mode: how `extproc run --workers N` adds up its workers' gauges
        # (extproc/runtime/worker_metrics.py); one process ignores it.
        self.active_streams = Gauge(
            "extproc_active_streams",
            "ext_proc streams in flight.",
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.processing_seconds = Histogram(
            "extproc_processing_seconds",
            "Time spent in the gateway's own processing per phase (request, response).",
            ["phase"],
            buckets=(
                0.0001,
                0.00025,
                0.0005,
                0.001,
                0.0025,
                0.005,
                0.01,
                0.025,
                0.05,
                0.1,
                0.5,
                2.5,
            ),
            registry=registry,
        )
        self.stream_seconds = Histogram(
            "extproc_stream_seconds",
            "Wall time from the first message to the last reply of a stream (includes upstream).",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.admission_rejected = Counter(
            "extproc_admission_rejected_total",
            "Requests answered 503 overloaded: the process's budget of work in flight stayed "
            "full for the whole admission wait. By stage: headers (the declared body, before "
            "Envoy sent it), request (body received), response (the answer to rewrite would "
            "not fit).",
            ["stage"],
            registry=registry,
        )
        self.admission_waited = Counter(
            "extproc_admission_waited_total",
            "Requests that had to wait for room in the budget (admitted or not).",
            registry=registry,
        )
        self.admission_in_flight_bytes = Gauge(
            "extproc_admission_in_flight_bytes",
            "Bytes of work admitted and not yet finished (request bodies plus the estimated "
            "answers of rewrites); at most limits.max_inflight_bytes, or one request's work.",
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.tls_reloads = Counter(
            "extproc_tls_reloads_total",
            "Changes of the TLS files seen while serving: reloaded (new connections use them), "
            "rejected (unusable, e.g. key and certificate do not match; the current ones stay).",
            ["outcome"],
            registry=registry,
        )
        self.policy_reloads = Counter(
            "extproc_policy_reloads_total",
            "Policy file changes and SIGHUPs acted on: reloaded (new streams use it), "
            "rejected (cannot be served: YAML, schema or tokenizer; the running policy stays).",
            ["outcome"],
            registry=registry,
        )
        self.policy_envoy_limits_stale = Gauge(
            "extproc_policy_envoy_limits_stale",
            "1 while the running policy needs larger Envoy buffer or gRPC message limits than "
            "this process started with (a restart applies them), else 0. The same as any of "
            "extproc_policy_settings_not_applied's limit settings at 1.",
            multiprocess_mode="livemax",
            registry=registry,
        )
        self.policy_settings_not_applied = Gauge(
            "extproc_policy_settings_not_applied",
            "1 while the running policy asks for a setting that this process, or the Envoy "
            "`extproc run` rendered, took from the policy it started with and a reload cannot "
            "change (a restart applies it), else 0. By setting: request_body_buffer, "
            "response_buffer, grpc_message (limits smaller than the policy needs), "
            "precheck_markers (Envoy's precheck searches bodies for other fields).",
            ["setting"],
            multiprocess_mode="livemax",
            registry=registry,
        )

    def known_series(self) -> None:
        """Create at 0 every series whose labels are known up front (see the module's
        docstring). Gauges are set by their owners as they start (the reloader)."""
        for outcome in REQUEST_OUTCOMES:
            self.requests.labels(outcome)
        for kind in REQUEST_REWRITES:
            self.rewrites.labels(kind)
        for status_class in STATUS_CLASSES:
            self.upstream_responses.labels(status_class)
        for kind in get_args(RewriteKind):
            self.responses_rewritten.labels(kind)
        for message in ANOMALY_KINDS:
            self.stream_anomalies.labels(message)
        for phase in get_args(ProcessingPhase):
            self.processing_seconds.labels(phase)
        for stage in get_args(AdmissionStage):
            self.admission_rejected.labels(stage)
        for outcome in RELOAD_OUTCOMES:
            self.tls_reloads.labels(outcome)
            self.policy_reloads.labels(outcome)


class PrometheusStreamMetrics:
    """The stream's and the servicer's events, counted in ``families``."""

    def __init__(self, families: MetricFamilies) -> None:
        self._active_streams = families.active_streams
        self._tokens_cut = families.tokens_cut
        self._stream_seconds = families.stream_seconds
        self._admission_waited = families.admission_waited
        self._admission_in_flight_bytes = families.admission_in_flight_bytes
        # The label sets are fixed, so these caches stay small.
        self._requests = functools.cache(families.requests.labels)
        self._rejections = functools.cache(families.rejections.labels)
        self._rewrites = functools.cache(families.rewrites.labels)
        self._upstream_responses = functools.cache(families.upstream_responses.labels)
        self._responses_rewritten = functools.cache(families.responses_rewritten.labels)
        self._anomalies = functools.cache(families.stream_anomalies.labels)
        self._processing_seconds = functools.cache(families.processing_seconds.labels)
        self._admission_rejected = functools.cache(families.admission_rejected.labels)

    def stream_opened(self) -> None:
        self._active_streams.inc()

    def stream_closed(self) -> None:
        self._active_streams.dec()

    def forwarded(self, stats: RequestStats, *, rewritten: bool) -> None:
        self._requests("rewritten" if rewritten else "passthrough").inc()
        if stats.prompted:
            self._rewrites("instruction").inc()
        if stats.truncated_inputs:
            self._rewrites("truncation").inc()
            self._tokens_cut.inc(stats.tokens_cut)
        if stats.dimensions_emulated:
            self._rewrites("dimensions").inc()
        if stats.fields_stripped:
            self._rewrites("fields_stripped").inc()

    def rejected(self, status: int, param: str | None) -> None:
        self._requests("rejected").inc()
        self._rejections(str(status), param or "-").inc()

    def upstream_response(self, status: int, *, local: bool) -> None:
        self._upstream_responses("local" if local else _status_class(status)).inc()

    def response_rewritten(
        self, kind: RewriteKind, *, status: int, prompt_tokens: int | None = None
    ) -> None:
        self._responses_rewritten(kind).inc()

    def anomaly(self, message: str) -> None:
        self._anomalies(message).inc()

    def phase_seconds(self, phase: ProcessingPhase, seconds: float) -> None:
        self._processing_seconds(phase).observe(seconds)

    def stream_seconds(self, seconds: float) -> None:
        self._stream_seconds.observe(seconds)

    def admission_waited(self) -> None:
        self._admission_waited.inc()

    def admission_refused(self, stage: AdmissionStage) -> None:
        self._admission_rejected(stage).inc()

    def admission_in_flight(self, work_bytes: int) -> None:
        self._admission_in_flight_bytes.set(work_bytes)


class PrometheusPolicyReloadMetrics:
    """The policy reloader's events, in ``families``' extproc_policy_reloads_total,
    extproc_policy_settings_not_applied and extproc_policy_envoy_limits_stale."""

    def __init__(self, families: MetricFamilies) -> None:
        self._reloads = families.policy_reloads
        self._not_applied = families.policy_settings_not_applied
        self._envoy_limits_stale = families.policy_envoy_limits_stale

    def reloaded(self) -> None:
        self._reloads.labels("reloaded").inc()

    def rejected(self) -> None:
        self._reloads.labels("rejected").inc()

    def setting_not_applied(self, setting: str, not_applied: bool) -> None:
        self._not_applied.labels(setting).set(1 if not_applied else 0)

    def envoy_limits_stale(self, stale: bool) -> None:
        self._envoy_limits_stale.set(1 if stale else 0)


class PrometheusTlsReloadMetrics:
    """The certificate reloader's outcomes, in ``families``' extproc_tls_reloads_total
    (prometheus_client's children are thread-safe)."""

    def __init__(self, families: MetricFamilies) -> None:
        self._reloads = families.tls_reloads

    def reloaded(self) -> None:
        self._reloads.labels("reloaded").inc()

    def rejected(self) -> None:
        self._reloads.labels("rejected").inc()


class PrometheusServerMetrics:
    """Everything one ext_proc server reports, in ``registry``, and its /metrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        families = MetricFamilies(registry)
        families.known_series()
        self.streams = PrometheusStreamMetrics(families)
        self.policy_reloads = PrometheusPolicyReloadMetrics(families)
        self.tls_reloads = PrometheusTlsReloadMetrics(families)

    def publish(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)


@functools.cache
def process_metrics() -> PrometheusServerMetrics:
    """This process's metrics, in prometheus_client's global registry (with its
    process and platform collectors), created once."""
    return PrometheusServerMetrics(REGISTRY)


def _status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "invalid"
