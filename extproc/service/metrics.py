"""Prometheus metrics. Label values come from fixed sets only (never from client
input: no model names, no text), so cardinality stays bounded.

:class:`PrometheusStreamMetrics` is the stream's and the servicer's
:class:`~extproc.service.stream_metrics.StreamMetrics`. It looks each labelled child
up once: prometheus_client's ``labels()`` takes a lock and builds its key on every
call, several times per request. A series still appears in the output only once it
has been counted.
"""

from __future__ import annotations

import functools

from prometheus_client import Counter, Gauge, Histogram

from extproc.core.plan import RequestStats
from extproc.service.stream_metrics import AdmissionStage, ProcessingPhase, RewriteKind

REQUESTS = Counter(
    "extproc_requests_total",
    "Embeddings requests by outcome: passthrough (forwarded as sent), rewritten, rejected.",
    ["outcome"],
)
REJECTIONS = Counter(
    "extproc_rejections_total",
    "Requests answered by the gateway with an error, by status and offending param.",
    ["status", "param"],
)
REWRITES = Counter(
    "extproc_rewrites_total",
    "Request rewrites by kind: instruction, truncation, dimensions, fields_stripped.",
    ["kind"],
)
TOKENS_CUT = Counter(
    "extproc_tokens_cut_total",
    "Tokens removed by truncation; a lower bound for very long inputs, whose tail "
    "beyond a few thousand tokens is never tokenized.",
)
UPSTREAM_RESPONSES = Counter(
    "extproc_upstream_responses_total",
    "Responses seen, by status class (2xx..5xx) or 'local' for Envoy's own replies.",
    ["status_class"],
)
RESPONSES_REWRITTEN = Counter(
    "extproc_responses_rewritten_total",
    "Responses rewritten, by kind: vectors (dimensions/encoding), error_envelope.",
    ["kind"],
)
STREAM_ANOMALIES = Counter(
    "extproc_stream_anomalies_total",
    "Messages that arrived out of order or unexpected, answered neutrally.",
    ["message"],
)
# multiprocess_mode: how `extproc run --workers N` adds up its workers' gauges
# (extproc/commands/worker_metrics.py); one process ignores it.
ACTIVE_STREAMS = Gauge(
    "extproc_active_streams", "ext_proc streams in flight.", multiprocess_mode="livesum"
)
PROCESSING_SECONDS = Histogram(
    "extproc_processing_seconds",
    "Time spent in the gateway's own processing per phase (request, response).",
    ["phase"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5),
)
STREAM_SECONDS = Histogram(
    "extproc_stream_seconds",
    "Wall time from the first message to the last reply of a stream (includes upstream).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
ADMISSION_REJECTED = Counter(
    "extproc_admission_rejected_total",
    "Requests answered 503 overloaded: the process's budget of work in flight stayed "
    "full for the whole admission wait. By stage: headers (the declared body, before "
    "Envoy sent it), request (body received), response (the answer to rewrite would "
    "not fit).",
    ["stage"],
)
ADMISSION_WAITED = Counter(
    "extproc_admission_waited_total",
    "Requests that had to wait for room in the budget (admitted or not).",
)
ADMISSION_IN_FLIGHT_BYTES = Gauge(
    "extproc_admission_in_flight_bytes",
    "Bytes of work admitted and not yet finished (request bodies plus the estimated "
    "answers of rewrites); at most limits.max_inflight_bytes, or one request's work.",
    multiprocess_mode="livesum",
)
TLS_RELOADS = Counter(
    "extproc_tls_reloads_total",
    "Changes of the TLS files seen while serving: reloaded (new connections use them), "
    "rejected (unusable, e.g. key and certificate do not match; the current ones stay).",
    ["outcome"],
)
POLICY_RELOADS = Counter(
    "extproc_policy_reloads_total",
    "Policy file changes and SIGHUPs acted on: reloaded (new streams use it), "
    "rejected (cannot be served: YAML, schema or tokenizer; the running policy stays).",
    ["outcome"],
)
POLICY_ENVOY_LIMITS_STALE = Gauge(
    "extproc_policy_envoy_limits_stale",
    "1 while the running policy needs larger Envoy buffer or gRPC message limits than "
    "this process started with (a restart applies them), else 0. The same as any of "
    "extproc_policy_settings_not_applied's limit settings at 1.",
    multiprocess_mode="livemax",
)
POLICY_SETTINGS_NOT_APPLIED = Gauge(
    "extproc_policy_settings_not_applied",
    "1 while the running policy asks for a setting that this process, or the Envoy "
    "`extproc run` rendered, took from the policy it started with and a reload cannot "
    "change (a restart applies it), else 0. By setting: request_body_buffer, "
    "response_buffer, grpc_message (limits smaller than the policy needs), "
    "precheck_markers (Envoy's precheck searches bodies for other fields).",
    ["setting"],
    multiprocess_mode="livemax",
)


# Labelled children, each looked up once (the label sets are fixed, so these stay small).
_requests = functools.cache(REQUESTS.labels)
_rejections = functools.cache(REJECTIONS.labels)
_rewrites = functools.cache(REWRITES.labels)
_upstream_responses = functools.cache(UPSTREAM_RESPONSES.labels)
_responses_rewritten = functools.cache(RESPONSES_REWRITTEN.labels)
_anomalies = functools.cache(STREAM_ANOMALIES.labels)
_processing_seconds = functools.cache(PROCESSING_SECONDS.labels)
_admission_rejected = functools.cache(ADMISSION_REJECTED.labels)


class PrometheusStreamMetrics:
    """The stream's and the servicer's events, counted in this module's metrics."""

    def stream_opened(self) -> None:
        ACTIVE_STREAMS.inc()

    def stream_closed(self) -> None:
        ACTIVE_STREAMS.dec()

    def forwarded(self, stats: RequestStats, *, rewritten: bool) -> None:
        _requests("rewritten" if rewritten else "passthrough").inc()
        if stats.prompted:
            _rewrites("instruction").inc()
        if stats.truncated_inputs:
            _rewrites("truncation").inc()
            TOKENS_CUT.inc(stats.tokens_cut)
        if stats.dimensions_emulated:
            _rewrites("dimensions").inc()
        if stats.fields_stripped:
            _rewrites("fields_stripped").inc()

    def rejected(self, status: int, param: str | None) -> None:
        _requests("rejected").inc()
        _rejections(str(status), param or "-").inc()

    def upstream_response(self, status: int, *, local: bool) -> None:
        _upstream_responses("local" if local else _status_class(status)).inc()

    def response_rewritten(self, kind: RewriteKind) -> None:
        _responses_rewritten(kind).inc()

    def anomaly(self, message: str) -> None:
        _anomalies(message).inc()

    def phase_seconds(self, phase: ProcessingPhase, seconds: float) -> None:
        _processing_seconds(phase).observe(seconds)

    def stream_seconds(self, seconds: float) -> None:
        STREAM_SECONDS.observe(seconds)

    def admission_waited(self) -> None:
        ADMISSION_WAITED.inc()

    def admission_refused(self, stage: AdmissionStage) -> None:
        _admission_rejected(stage).inc()

    def admission_in_flight(self, work_bytes: int) -> None:
        ADMISSION_IN_FLIGHT_BYTES.set(work_bytes)


class PrometheusPolicyReloadMetrics:
    """The policy reloader's events, in extproc_policy_reloads_total,
    extproc_policy_settings_not_applied and extproc_policy_envoy_limits_stale. Both
    outcomes' series exist, at 0, from the start of the watch."""

    def watching(self) -> None:
        POLICY_RELOADS.labels("reloaded")
        POLICY_RELOADS.labels("rejected")

    def reloaded(self) -> None:
        POLICY_RELOADS.labels("reloaded").inc()

    def rejected(self) -> None:
        POLICY_RELOADS.labels("rejected").inc()

    def setting_not_applied(self, setting: str, not_applied: bool) -> None:
        POLICY_SETTINGS_NOT_APPLIED.labels(setting).set(1 if not_applied else 0)

    def envoy_limits_stale(self, stale: bool) -> None:
        POLICY_ENVOY_LIMITS_STALE.set(1 if stale else 0)


class PrometheusTlsReloadMetrics:
    """The certificate reloader's outcomes, in extproc_tls_reloads_total (prometheus_client's
    children are thread-safe)."""

    def reloaded(self) -> None:
        TLS_RELOADS.labels("reloaded").inc()

    def rejected(self) -> None:
        TLS_RELOADS.labels("rejected").inc()


def _status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "invalid"
