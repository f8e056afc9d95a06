"""The alert rules, their unit tests and the dashboard, checked without running the
gateway: Debian's `promtool` (check rules, test rules, check config) and the dashboard's
structure and metric names against the metrics the code registers. The same rules and
queries against live processes: tests/test_observability_live.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from extproc.service.metrics import MetricFamilies
from extproc.tools.shadow.comparator_metrics import ShadowMetrics
from testing_support.qwen import REPO
from tests.test_observability_live import DASHBOARD, MAY_LACK_DATA_UNTIL_RELOADS_ARE_COUNTED

PROMETHEUS_DIR = REPO / "deploy" / "observability" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERT_TESTS = PROMETHEUS_DIR / "alerts.test.yml"
METRIC_NAME = re.compile(r"\b(extproc_[a-z_]+)")


def promtool(*args: str, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is not installed (scripts/ci-system-deps.sh installs prometheus)")
    return subprocess.run(
        [binary, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


# --------------------------------------------------------------------------- promtool


def test_promtool_checks_the_rules() -> None:
    result = promtool("check", "rules", ALERTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", ALERT_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    cases: dict[str, set[bool]] = {rule["alert"]: set() for rule in alert_rules()}
    for test in load_yaml(ALERT_TESTS)["tests"]:
        for case in test.get("alert_rule_test", []):
            cases[case["alertname"]].add(bool(case["exp_alerts"]))
    assert cases and all(seen == {True, False} for seen in cases.values()), cases


@pytest.mark.parametrize(
    "alert,threshold,raised,failing_case",
    [
        (
            "ExtprocUpstream5xxRatioHigh",
            "> 0.05",
            "> 0.5",
            "upstream 5xx above 5% for 5 minutes fires",
        ),
        (
            "ExtprocAdmissionSaturated",
            "> 0.05",
            "> 0.5",
            "admission refusing 10% of the requests for 10 minutes fires",
        ),
        (
            "ExtprocEnvoyProcessorFailing",
            "> 0.01",
            "> 0.1",
            "Envoy's ext_proc streams failing and timing out (5%) for 5 minutes fires",
        ),
        (
            "ExtprocEnvoyOverloaded",
            "* 60 > 1",
            "* 60 > 100",
            "Envoy refusing requests for overload for 10 minutes fires, a burst does not",
        ),
    ],
)
def test_the_unit_tests_catch_a_changed_threshold(
    alert: str, threshold: str, raised: str, failing_case: str, tmp_path: Path
) -> None:
    """The unit tests bite: with one rule's threshold raised, its firing case fails."""
    doc = load_yaml(ALERTS)
    (rule,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == alert]
    assert threshold in rule["expr"], rule["expr"]
    rule["expr"] = rule["expr"].replace(threshold, raised)
    (tmp_path / ALERTS.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    result = promtool("test", "rules", ALERT_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0
    assert failing_case in result.stdout + result.stderr


def test_promtool_refuses_a_broken_rule(tmp_path: Path) -> None:
    doc = load_yaml(ALERTS)
    doc["groups"][0]["rules"][0]["expr"] = "sum(rate(extproc_requests_total[5m])"
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(doc))
    result = promtool("check", "rules", "alerts.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "parse error" in result.stdout + result.stderr


def test_promtool_checks_the_compose_prometheus_config() -> None:
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


# --------------------------------------------------------------------------- dashboard


def exported_series_names() -> set[str]:
    """Every series name the gateway and the comparator can export."""
    gateway = CollectorRegistry()
    MetricFamilies(gateway)
    registries = [gateway, ShadowMetrics().registry]
    names = set()
    for registry in registries:
        for family in registry.collect():
            if family.type == "counter":
                names.add(f"{family.name}_total")
            elif family.type == "histogram":
                names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_count", "_sum"))
            else:
                names.add(family.name)
    return names


def test_the_dashboard_and_the_rules_name_only_metrics_that_exist() -> None:
    """A renamed metric breaks a panel or an alert silently; this names it. (The live
    test proves each query returns data; this one runs without processes.) The one
    query allowed to lack data there may name a metric this build does not have yet."""
    exprs = [t["expr"] for panel in dashboard()["panels"] for t in panel.get("targets", [])]
    exprs += [rule["expr"] for rule in alert_rules()]
    used = {name for expr in exprs for name in METRIC_NAME.findall(expr)}
    missing = used - exported_series_names()
    not_yet = {n for e in MAY_LACK_DATA_UNTIL_RELOADS_ARE_COUNTED for n in METRIC_NAME.findall(e)}
    assert len(used) > 20 and missing <= not_yet, sorted(missing - not_yet)


def test_the_dashboard_is_well_formed() -> None:
    doc = dashboard()
    assert doc["uid"] == "extproc-gateway"
    (variable,) = doc["templating"]["list"]
    assert (variable["name"], variable["type"], variable["query"]) == (
        "datasource",
        "datasource",
        "prometheus",
    )
    panels = doc["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        own = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not own & cells, f"{panel['title']} overlaps another panel"
        cells |= own
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel["description"], panel
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert target["expr"].strip()
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_the_dashboard_covers_what_operators_watch() -> None:
    """Each metric family an operator needs is on a panel."""
    exprs = " ".join(t["expr"] for panel in dashboard()["panels"] for t in panel.get("targets", []))
    for name in (
        "extproc_requests_total",
        "extproc_rejections_total",
        "extproc_upstream_responses_total",
        "extproc_processing_seconds_bucket",
        "extproc_active_streams",
        "extproc_tokens_cut_total",
        "extproc_policy_reloads_total",
        "extproc_shadow_pairs_total",
        "extproc_shadow_status_mismatches_total",
        "extproc_shadow_input_mismatches_total",
        "extproc_shadow_cosine_bucket",
        "extproc_admission_rejected_total",
        # Envoy's own series (docs/metrics.md): what the ext_proc server cannot see.
        "envoy_http_ext_proc_streams_failed",
        "envoy_http_ext_proc_message_timeouts",
        "envoy_http_ext_proc_failure_mode_allowed",
        "envoy_http_downstream_rq_overload_close",
        "envoy_overload_envoy_overload_actions_stop_accepting_requests_active",
        "envoy_overload_envoy_resource_monitors_fixed_heap_pressure",
        "envoy_listener_downstream_global_cx_overflow",
    ):
        assert name in exprs, name


ENVOY_SERIES = re.compile(r"\b(envoy_[a-z_]+)")


def test_every_envoy_series_the_rules_name_is_on_the_dashboard() -> None:
    """Envoy's series are not registered by this code: the live test proves the names
    by the dashboard queries returning data from a running Envoy, so every one the
    rules use must be on a panel too."""
    panels = " ".join(t["expr"] for p in dashboard()["panels"] for t in p.get("targets", []))
    on_panels = set(ENVOY_SERIES.findall(panels))
    in_rules = {n for rule in alert_rules() for n in ENVOY_SERIES.findall(rule["expr"])}
    assert in_rules and in_rules <= on_panels, sorted(in_rules - on_panels)
