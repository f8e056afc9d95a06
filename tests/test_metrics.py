"""The Prometheus metrics (extproc/service/metrics.py), each test in a registry of its
own: each event the stream, the servicer and the reloaders report moves its own
series, under the names and labels the dashboard and the alert rules read
(tests/test_observability.py checks those names against the registry)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest
from prometheus_client import CollectorRegistry

from extproc.core.plan import RequestStats
from extproc.service.metrics import PrometheusServerMetrics
from extproc.service.stream_metrics import ANOMALY_KINDS, StreamMetrics


@pytest.fixture
def metrics() -> PrometheusServerMetrics:
    return PrometheusServerMetrics(CollectorRegistry())


def sample(metrics: PrometheusServerMetrics, name: str, **labels: str) -> float | None:
    """The series' value, or None while it does not exist."""
    return metrics.registry.get_sample_value(name, labels)


@pytest.mark.parametrize(
    ("event", "series"),
    [
        pytest.param(
            lambda m: m.rejected(400, None),
            [
                ("extproc_requests_total", {"outcome": "rejected"}),
                ("extproc_rejections_total", {"status": "400", "param": "-"}),
            ],
            id="rejected",
        ),
        pytest.param(
            lambda m: m.rejected(413, "input"),
            [("extproc_rejections_total", {"status": "413", "param": "input"})],
            id="rejected-param",
        ),
        pytest.param(
            lambda m: m.forwarded(RequestStats(inputs=1), rewritten=False),
            [("extproc_requests_total", {"outcome": "passthrough"})],
            id="forwarded-as-sent",
        ),
        pytest.param(
            lambda m: m.forwarded(
                RequestStats(
                    inputs=3,
                    prompted=True,
                    truncated_inputs=1,
                    tokens_cut=7,
                    dimensions_emulated=True,
                    fields_stripped=2,
                ),
                rewritten=True,
            ),
            [
                ("extproc_requests_total", {"outcome": "rewritten"}),
                ("extproc_rewrites_total", {"kind": "instruction"}),
                ("extproc_rewrites_total", {"kind": "truncation"}),
                ("extproc_rewrites_total", {"kind": "dimensions"}),
                ("extproc_rewrites_total", {"kind": "fields_stripped"}),
            ],
            id="forwarded-rewritten",
        ),
        pytest.param(
            lambda m: m.upstream_response(204, local=False),
            [("extproc_upstream_responses_total", {"status_class": "2xx"})],
            id="upstream-2xx",
        ),
        pytest.param(
            lambda m: m.upstream_response(0, local=False),
            [("extproc_upstream_responses_total", {"status_class": "invalid"})],
            id="upstream-invalid",
        ),
        pytest.param(
            lambda m: m.upstream_response(503, local=True),
            [("extproc_upstream_responses_total", {"status_class": "local"})],
            id="upstream-local",
        ),
        pytest.param(
            lambda m: m.response_rewritten("error_envelope", status=502),
            [("extproc_responses_rewritten_total", {"kind": "error_envelope"})],
            id="response-rewritten",
        ),
        pytest.param(
            lambda m: m.anomaly("request_body"),
            [("extproc_stream_anomalies_total", {"message": "request_body"})],
            id="anomaly",
        ),
        pytest.param(
            lambda m: m.phase_seconds("response", 0.002),
            [("extproc_processing_seconds_count", {"phase": "response"})],
            id="phase-seconds",
        ),
        pytest.param(
            lambda m: m.stream_seconds(0.5),
            [("extproc_stream_seconds_count", {})],
            id="stream-seconds",
        ),
        pytest.param(
            lambda m: m.admission_waited(),
            [("extproc_admission_waited_total", {})],
            id="admission-waited",
        ),
        pytest.param(
            lambda m: m.admission_refused("headers"),
            [("extproc_admission_rejected_total", {"stage": "headers"})],
            id="admission-refused",
        ),
    ],
)
def test_each_event_counts_once_in_its_series(
    metrics: PrometheusServerMetrics,
    event: Callable[[StreamMetrics], None],
    series: list[tuple[str, dict[str, str]]],
) -> None:
    event(metrics.streams)
    assert [sample(metrics, name, **labels) for name, labels in series] == [1.0] * len(series)


def test_tokens_cut_add_up(metrics: PrometheusServerMetrics) -> None:
    stats = RequestStats(inputs=1, truncated_inputs=1, tokens_cut=7)
    metrics.streams.forwarded(stats, rewritten=True)
    metrics.streams.forwarded(stats, rewritten=True)
    assert sample(metrics, "extproc_tokens_cut_total") == 14


def test_the_gauges_follow_streams_and_admitted_work(metrics: PrometheusServerMetrics) -> None:
    streams = metrics.streams
    streams.stream_opened()
    streams.stream_opened()
    streams.stream_closed()
    assert sample(metrics, "extproc_active_streams") == 1
    streams.stream_closed()
    assert sample(metrics, "extproc_active_streams") == 0
    streams.admission_in_flight(12345)
    assert sample(metrics, "extproc_admission_in_flight_bytes") == 12345
    streams.admission_in_flight(0)
    assert sample(metrics, "extproc_admission_in_flight_bytes") == 0


def test_policy_reloads_count_from_0(
    metrics: PrometheusServerMetrics,
) -> None:
    reloads = metrics.policy_reloads
    name = "extproc_policy_reloads_total"
    assert sample(metrics, name, outcome="reloaded") == 0
    assert sample(metrics, name, outcome="rejected") == 0
    reloads.reloaded()
    reloads.rejected()
    reloads.rejected()
    assert sample(metrics, name, outcome="reloaded") == 1
    assert sample(metrics, name, outcome="rejected") == 2


def test_every_series_with_known_labels_is_there_at_0_before_anything_counts(
    metrics: PrometheusServerMetrics,
) -> None:
    expected = {
        "extproc_requests_total": ("outcome", ["passthrough", "rewritten", "rejected"]),
        "extproc_rewrites_total": (
            "kind",
            ["instruction", "truncation", "dimensions", "fields_stripped"],
        ),
        "extproc_upstream_responses_total": ("status_class", ["2xx", "4xx", "5xx", "local"]),
        "extproc_responses_rewritten_total": ("kind", ["vectors", "error_envelope"]),
        "extproc_stream_anomalies_total": ("message", ["internal_error", "request_body"]),
        "extproc_admission_rejected_total": ("stage", ["headers", "request", "response"]),
        "extproc_tls_reloads_total": ("outcome", ["reloaded", "rejected"]),
        "extproc_policy_reloads_total": ("outcome", ["reloaded", "rejected"]),
        "extproc_processing_seconds_count": ("phase", ["request", "response"]),
    }
    for name, (label, values) in expected.items():
        for value in values:
            assert sample(metrics, name, **{label: value}) == 0, (name, value)
    assert sample(metrics, "extproc_rejections_total", status="400", param="input") is None


def test_anomaly_kinds_name_every_message_kind_envoy_sends() -> None:
    oneof = ProcessingRequest.DESCRIPTOR.oneofs_by_name["request"]
    assert {field.name for field in oneof.fields} <= set(ANOMALY_KINDS)


def test_settings_not_applied_and_stale_limits_are_0_or_1(
    metrics: PrometheusServerMetrics,
) -> None:
    reloads = metrics.policy_reloads
    reloads.setting_not_applied("grpc_message", True)
    reloads.setting_not_applied("precheck_markers", False)
    reloads.envoy_limits_stale(True)
    not_applied = "extproc_policy_settings_not_applied"
    assert sample(metrics, not_applied, setting="grpc_message") == 1
    assert sample(metrics, not_applied, setting="precheck_markers") == 0
    assert sample(metrics, "extproc_policy_envoy_limits_stale") == 1
    reloads.setting_not_applied("grpc_message", False)
    reloads.envoy_limits_stale(False)
    assert sample(metrics, not_applied, setting="grpc_message") == 0
    assert sample(metrics, "extproc_policy_envoy_limits_stale") == 0


def test_tls_reloads_count_each_outcome(metrics: PrometheusServerMetrics) -> None:
    name = "extproc_tls_reloads_total"
    metrics.tls_reloads.rejected()
    assert sample(metrics, name, outcome="rejected") == 1
    assert sample(metrics, name, outcome="reloaded") == 0
    metrics.tls_reloads.reloaded()
    assert sample(metrics, name, outcome="reloaded") == 1
