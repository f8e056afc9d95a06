"""A fresh gateway's first scrape, before any request, has every ext_proc metric the
shipped Grafana dashboard and Prometheus alerts name, labelled series at 0.

The names are read from deploy/observability (every PromQL expression), not listed
here, so a panel or alert added later is checked too. With `extproc run --workers N`
prometheus_client's multiprocess mode writes a labelled series only once a worker
creates it, so without MetricFamilies.known_series a family such as
extproc_admission_rejected_total was missing until its first refusal: the dashboard
showed "No data" instead of 0 and ratios and ``absent()`` alerts misread it.

Started here on 127.0.0.1 and stopped by PID: `extproc run --workers 1` and
`--workers 2` (the shipped Qwen3 policy, in front of the fake Dynamo, never called) and
`extproc serve --metrics`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import GatewaySpec
from testing_support.qwen import REPO
from testing_support.serve import ServeSpec
from tests.harness import Gateways, Servers

OBSERVABILITY = REPO / "deploy" / "observability"
DASHBOARD = OBSERVABILITY / "grafana" / "dashboards" / "gateway.json"
ALERTS = OBSERVABILITY / "prometheus" / "alerts.yml"

# Series that cannot exist before they are counted: their labels come from requests.
OPEN_LABELS = {
    "extproc_rejections_total": "its param label is the request field a client got wrong",
}

NAME = re.compile(r"\bextproc_[a-z_]+\b")


def expressions() -> list[str]:
    """Every PromQL expression of the dashboard's panels and the alert rules."""
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    found.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(json.loads(DASHBOARD.read_text(encoding="utf-8")))
    walk(yaml.safe_load(ALERTS.read_text(encoding="utf-8")))
    return found


def named_gateway_metrics() -> set[str]:
    """The ext_proc server's metric names the expressions use (the shadow comparator's,
    ``extproc_shadow_*``, are another process's)."""
    names = {name for expr in expressions() for name in NAME.findall(expr)}
    return {name for name in names if not name.startswith("extproc_shadow_")}


def scraped(text: str) -> dict[str, list[float]]:
    """Sample name -> the values of its series, from a /metrics page."""
    samples: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample.value)
    return samples


def missing(text: str) -> list[str]:
    samples = scraped(text)
    return sorted(n for n in named_gateway_metrics() - set(OPEN_LABELS) if not samples.get(n))


def test_the_expressions_name_what_this_test_checks() -> None:
    names = named_gateway_metrics()
    assert len(names) >= 10, names
    assert "extproc_admission_rejected_total" in names
    assert set(OPEN_LABELS) <= names, "an open-label exception the dashboard no longer uses"


@pytest.fixture(scope="module")
def upstream_url(fake_dynamo: FakeUpstream) -> Iterator[str]:
    yield fake_dynamo.url


@pytest.mark.parametrize("workers", [1, 2], ids=["1-worker", "2-workers"])
def test_a_fresh_gateway_exports_every_named_metric(
    gateways: Gateways, upstream_url: str, workers: int
) -> None:
    with gateways.own(GatewaySpec(upstream=upstream_url, workers=workers)) as gateway:
        text = gateway.metrics()
    assert missing(text) == []
    samples = scraped(text)
    assert samples["extproc_admission_rejected_total"] == [0.0, 0.0, 0.0]  # three stages
    assert sorted(samples["extproc_requests_total"]) == [0.0, 0.0, 0.0]


def test_a_fresh_serve_exports_every_named_metric(servers: Servers, tmp_path: Path) -> None:
    with servers.own(ServeSpec(metrics=True)) as server:
        text = server.metrics()
    assert missing(text) == []
