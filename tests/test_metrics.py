"""PrometheusStreamMetrics: each event the stream and the servicer report moves its
own series, under the names and labels the dashboard and the alert rules read
(tests/test_observability.py checks those names against the registry)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client import REGISTRY

from extproc.core.plan import RequestStats
from extproc.service.metrics import PrometheusStreamMetrics
from extproc.service.stream_metrics import StreamMetrics

METRICS: StreamMetrics = PrometheusStreamMetrics()


def value(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


@pytest.mark.parametrize(
    ("event", "series"),
    [
        pytest.param(
            lambda: METRICS.rejected(400, None),
            [
                ("extproc_requests_total", {"outcome": "rejected"}),
                ("extproc_rejections_total", {"status": "400", "param": "-"}),
            ],
            id="rejected",
        ),
        pytest.param(
            lambda: METRICS.rejected(413, "input"),
            [("extproc_rejections_total", {"status": "413", "param": "input"})],
            id="rejected-param",
        ),
        pytest.param(
            lambda: METRICS.forwarded(RequestStats(inputs=1), rewritten=False),
            [("extproc_requests_total", {"outcome": "passthrough"})],
            id="forwarded-as-sent",
        ),
        pytest.param(
            lambda: METRICS.forwarded(
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
            lambda: METRICS.upstream_response(204, local=False),
            [("extproc_upstream_responses_total", {"status_class": "2xx"})],
            id="upstream-2xx",
        ),
        pytest.param(
            lambda: METRICS.upstream_response(0, local=False),
            [("extproc_upstream_responses_total", {"status_class": "invalid"})],
            id="upstream-invalid",
        ),
        pytest.param(
            lambda: METRICS.upstream_response(503, local=True),
            [("extproc_upstream_responses_total", {"status_class": "local"})],
            id="upstream-local",
        ),
        pytest.param(
            lambda: METRICS.response_rewritten("error_envelope"),
            [("extproc_responses_rewritten_total", {"kind": "error_envelope"})],
            id="response-rewritten",
        ),
        pytest.param(
            lambda: METRICS.anomaly("request_body"),
            [("extproc_stream_anomalies_total", {"message": "request_body"})],
            id="anomaly",
        ),
        pytest.param(
            lambda: METRICS.phase_seconds("response", 0.002),
            [("extproc_processing_seconds_count", {"phase": "response"})],
            id="phase-seconds",
        ),
        pytest.param(
            lambda: METRICS.stream_seconds(0.5),
            [("extproc_stream_seconds_count", {})],
            id="stream-seconds",
        ),
        pytest.param(
            METRICS.admission_waited,
            [("extproc_admission_waited_total", {})],
            id="admission-waited",
        ),
        pytest.param(
            lambda: METRICS.admission_refused("headers"),
            [("extproc_admission_rejected_total", {"stage": "headers"})],
            id="admission-refused",
        ),
    ],
)
def test_each_event_counts_once_in_its_series(
    event: Callable[[], None], series: list[tuple[str, dict[str, str]]]
) -> None:
    before = [value(name, labels) for name, labels in series]
    event()
    after = [value(name, labels) for name, labels in series]
    assert [b - a for a, b in zip(before, after, strict=True)] == [1.0] * len(series)


def test_tokens_cut_add_up() -> None:
    before = value("extproc_tokens_cut_total")
    METRICS.forwarded(RequestStats(inputs=1, truncated_inputs=1, tokens_cut=7), rewritten=True)
    assert value("extproc_tokens_cut_total") - before == 7


def test_the_gauges_follow_streams_and_admitted_work() -> None:
    before = value("extproc_active_streams")
    METRICS.stream_opened()
    METRICS.stream_opened()
    METRICS.stream_closed()
    assert value("extproc_active_streams") - before == 1
    METRICS.stream_closed()
    METRICS.admission_in_flight(12345)
    assert value("extproc_admission_in_flight_bytes") == 12345
    METRICS.admission_in_flight(0)
    assert value("extproc_admission_in_flight_bytes") == 0
