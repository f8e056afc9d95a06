"""Every query of the Grafana dashboard, evaluated by a real Prometheus that scraped a
real gateway and a real shadow comparator under a short load.

On 127.0.0.1, all started here and stopped by their own PIDs:

- the fake Dynamo (``tests/fake_upstream.py``) and the fake legacy server
  (``tests/fake_legacy.py``), in this process;
- the gateway: ``extproc run --metrics`` (Envoy + ext_proc) in front of the fake Dynamo,
  with a copy of the shipped Qwen3 policy;
- the shadow set-up: ``extproc shadow`` (Envoy, ext_proc server, comparator) with the
  legacy server as baseline and the fake Dynamo as candidate, its ext_proc policy
  without the Qwen3 query instruction, so that query inputs mismatch (the seed's
  silent failure) while documents agree, and the verdict panel and alert have
  something to show;
- Debian's ``prometheus`` (scrape and rule evaluation every second, a temporary data
  directory) with ``deploy/observability/prometheus/alerts.yml`` loaded.

The load comes in rounds a few scrapes apart, so that every counter is seen before and
after it grows and every rate is non-zero: valid requests (documents, queries,
``dimensions``, base64, a long input that is truncated), requests the gateway rejects,
and upstream 500s. Then each dashboard query goes through ``/api/v1/query`` with
Grafana's ``$__rate_interval`` replaced by a concrete window, and must return at least
one finite sample.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import QWEN_MODEL, REPO, SHIPPED_QWEN_POLICY
from tests.fake_legacy import FakeLegacy
from tests.fake_upstream import FakeUpstream
from tests.harness import Gateway, free_port, http, metric_value, start_gateway

OBSERVABILITY = REPO / "deploy" / "observability"
DASHBOARD = OBSERVABILITY / "grafana" / "dashboards" / "gateway.json"
ALERTS = OBSERVABILITY / "prometheus" / "alerts.yml"

READY_TIMEOUT_S = 90.0
SCRAPED_TIMEOUT_S = 30.0
ROUNDS = 3
ROUND_GAP_S = 2.5  # more than two scrape intervals between rounds
# Grafana's variables, as Grafana would fill them for a 5-minute view scraped every second.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "5m", "$__interval": "1s"}

# The one query allowed to return nothing: the policy reload counter comes with the live
# policy reload, which may not be in this build yet. It is allowed only while the
# gateway's /metrics does not have the metric at all; once it does, the query must
# return data like every other (the load rewrites the policy file to cause a reload).
MAY_LACK_DATA_UNTIL_RELOADS_ARE_COUNTED = frozenset(
    {"sum by (outcome) (extproc_policy_reloads_total)"}
)
RELOAD_METRIC = "extproc_policy_reloads_total"


@dataclass(frozen=True)
class Query:
    panel: str
    ref: str
    expr: str

    @property
    def promql(self) -> str:
        text = self.expr
        for variable, value in GRAFANA_VARIABLES.items():
            text = text.replace(variable, value)
        return text


def dashboard_queries() -> list[Query]:
    doc = json.loads(DASHBOARD.read_text())
    return [
        Query(panel["title"], target["refId"], target["expr"])
        for panel in doc["panels"]
        for target in panel.get("targets", [])
    ]


QUERIES = dashboard_queries()


# --------------------------------------------------------------------------- processes


class Process:
    """A command with its output in a log file, stopped by its own PID."""

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("wb") as log_file:
            self.popen = subprocess.Popen(
                argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after 20 s; the exit status."""
        if self.popen.poll() is None:
            self.popen.terminate()
        try:
            return self.popen.wait(20)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(5)


def wait_until(check: Callable[[], bool], timeout: float, what: str, process: Process) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if process.popen.poll() is not None:
            raise RuntimeError(f"{what}: exited with {process.popen.returncode}\n{process.log()}")
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not done in {timeout} s\n{process.log()[-4000:]}")


def get_json(url: str) -> Any:
    return http("GET", url, timeout=10).json()


def answers_ok(url: str) -> bool:
    try:
        return http("GET", url, timeout=2).status == 200
    except OSError:  # not listening yet
        return False


@dataclass(frozen=True)
class Shadow:
    process: Process
    url: str  # where clients send embeddings requests
    http_url: str  # the comparator's /summary and /metrics


def start_shadow(baseline: str, candidate: str, qwen_dir: Path, log_dir: Path) -> Shadow:
    """`extproc shadow` whose candidate-side policy has no query instruction."""
    policy = yaml.safe_load(SHIPPED_QWEN_POLICY.read_text())
    policy["models"][0]["prompts"] = {"query": "{text}"}
    policy_path = log_dir / "no-query-instruction.yaml"
    policy_path.write_text(yaml.safe_dump(policy))
    listen, http_port = free_port(), free_port()
    argv = [
        *(sys.executable, "-m", "extproc.tools.shadow", "shadow"),
        *("--baseline", baseline, "--candidate", candidate),
        *("--listen", f"127.0.0.1:{listen}", "--http", f"127.0.0.1:{http_port}"),
        *("--config", str(policy_path), "--tokenizer", f"{QWEN_MODEL}={qwen_dir}"),
        *("--grace", "1"),
    ]
    process = Process(argv, log_dir / "shadow.log")
    shadow = Shadow(process, f"http://127.0.0.1:{listen}", f"http://127.0.0.1:{http_port}")
    wait_until(lambda: "extproc shadow ready:" in process.log(), READY_TIMEOUT_S, "shadow", process)
    return shadow


@dataclass(frozen=True)
class Prometheus:
    process: Process
    url: str

    def query(self, promql: str) -> dict[str, Any]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        doc: dict[str, Any] = get_json(url)
        assert doc["status"] == "success", doc
        return dict(doc["data"])

    def value(self, promql: str) -> float:
        data = self.query(promql)
        return float(data["result"][0]["value"][1]) if data["result"] else math.nan


def start_prometheus(targets: dict[str, str], log_dir: Path) -> Prometheus:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed (scripts/ci-system-deps.sh installs it)")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [target]}]}
            for job, target in targets.items()
        ],
    }
    config_path = log_dir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    argv = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={log_dir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    prometheus = Prometheus(Process(argv, log_dir / "prometheus.log"), f"http://127.0.0.1:{port}")
    wait_until(
        lambda: answers_ok(f"{prometheus.url}/-/ready"), 30, "prometheus", prometheus.process
    )
    return prometheus


# --------------------------------------------------------------------------- load


def gateway_round(gateway: Gateway, upstream: FakeUpstream) -> dict[int, int]:
    """One round through the gateway; returns the count of each status."""
    docs = [f"Document {i} about the capital cities of Europe." for i in range(6)]
    bodies: list[bytes | dict[str, Any]] = [
        {"model": QWEN_MODEL, "input": docs},
        *({"model": QWEN_MODEL, "input": doc} for doc in docs[:3]),
        {"model": QWEN_MODEL, "input": "What is the capital of France?", "input_type": "query"},
        {"model": QWEN_MODEL, "input": docs[:2], "dimensions": 256},
        {"model": QWEN_MODEL, "input": docs[3], "dimensions": 128},
        {"model": QWEN_MODEL, "input": docs[:2], "encoding_format": "base64"},
        {"model": QWEN_MODEL, "input": "gateway metrics " * 900},  # over 1,024 tokens
        # rejected by the gateway
        {"model": QWEN_MODEL, "input": "x", "dimensions": 0},
        {"model": QWEN_MODEL, "input": "x", "dimensions": 4096},
        {"model": QWEN_MODEL, "input": "x", "input_type": "sideways"},
        {"model": QWEN_MODEL},
        b'{"model": "Qwen/Qwen3-Embedding-0.6B", "input": ',
    ]
    statuses: dict[int, int] = {}
    for body in bodies:
        status = gateway.embeddings(body, timeout=30).status
        statuses[status] = statuses.get(status, 0) + 1
    # Upstream 500s on the rewrite route (`dimensions`), whose responses the gateway
    # sees and counts by status class.
    upstream.fault = "http500"
    try:
        for doc in docs[:2]:
            body = {"model": QWEN_MODEL, "input": doc, "dimensions": 256}
            status = gateway.embeddings(body, timeout=30).status
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        upstream.fault = "none"
    return statuses


def shadow_round(shadow: Shadow) -> int:
    """One round through the shadow set-up; returns the number of requests sent."""
    bodies: list[dict[str, Any]] = [
        {"model": QWEN_MODEL, "input": ["Berlin is in Germany.", "Paris is in France."]},
        {"model": QWEN_MODEL, "input": "Madrid is in Spain."},
        {"model": QWEN_MODEL, "input": ["Which city is in Spain?"], "input_type": "query"},
        {"model": QWEN_MODEL, "input": "Rome is in Italy.", "dimensions": 256},
        {"model": QWEN_MODEL, "input": "x", "dimensions": 0},  # a client mistake: 4xx on both
    ]
    for body in bodies:
        reply = http("POST", f"{shadow.url}/v1/embeddings", body, timeout=30)
        assert reply.status // 100 in (2, 4), reply.body
    return len(bodies)


# --------------------------------------------------------------------------- fixture


@dataclass(frozen=True)
class Evaluated:
    results: dict[Query, dict[str, Any]]
    gateway_metrics: str
    statuses: dict[int, int]
    pairs: int
    alerts: list[dict[str, Any]]
    rules: list[dict[str, Any]]
    seconds: float


@pytest.fixture(scope="module")
def evaluated(qwen_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Evaluated]:
    started = time.monotonic()
    logs = tmp_path_factory.mktemp("observability")
    policy_copy = logs / "policy.yaml"
    shutil.copyfile(SHIPPED_QWEN_POLICY, policy_copy)
    with ExitStack() as cleanup:
        upstream = cleanup.enter_context(FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir))
        legacy = cleanup.enter_context(FakeLegacy(tokenizer_dir=qwen_dir))
        gateway = start_gateway(
            upstream.url,
            logs,
            config=policy_copy,
            tokenizer_overrides=f"{QWEN_MODEL}={qwen_dir}",
        )
        cleanup.callback(gateway.stop)
        shadow = start_shadow(legacy.url, upstream.url, qwen_dir, logs)
        cleanup.callback(shadow.process.stop)
        prometheus = start_prometheus(
            {
                "extproc": gateway.metrics_url.removeprefix("http://"),
                "extproc-shadow": shadow.http_url.removeprefix("http://"),
            },
            logs,
        )
        cleanup.callback(prometheus.process.stop)
        wait_until(
            lambda: prometheus.value('count(up{job=~"extproc|extproc-shadow"} == 1)') == 2,
            SCRAPED_TIMEOUT_S,
            "both targets scraped",
            prometheus.process,
        )

        statuses: dict[int, int] = {}
        sent_to_shadow = 0
        for round_number in range(ROUNDS):
            if round_number == 1:
                # A policy change the gateway reloads, where live reload exists.
                policy_copy.write_text(policy_copy.read_text() + "# reloaded by the test\n")
            for status, count in gateway_round(gateway, upstream).items():
                statuses[status] = statuses.get(status, 0) + count
            sent_to_shadow += shadow_round(shadow)
            time.sleep(ROUND_GAP_S)

        # Everything counted has been scraped: Prometheus agrees with the processes.
        gateway_metrics = http("GET", f"{gateway.metrics_url}/metrics").body.decode()
        requests = metric_value(gateway_metrics, "extproc_requests_total")
        wait_until(
            lambda: get_json(f"{shadow.http_url}/summary")["pairs"] >= sent_to_shadow,
            SCRAPED_TIMEOUT_S,
            "pairs compared",
            shadow.process,
        )
        wait_until(
            lambda: (
                prometheus.value("sum(extproc_requests_total)") == requests
                and prometheus.value("sum(extproc_shadow_pairs_total)") >= sent_to_shadow
            ),
            SCRAPED_TIMEOUT_S,
            "final counters scraped",
            prometheus.process,
        )
        results = {query: prometheus.query(query.promql) for query in QUERIES}
        alerts = get_json(f"{prometheus.url}/api/v1/alerts")["data"]["alerts"]
        groups = get_json(f"{prometheus.url}/api/v1/rules")["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        yield Evaluated(
            results,
            gateway_metrics,
            statuses,
            sent_to_shadow,
            alerts,
            rules,
            time.monotonic() - started,
        )


# --------------------------------------------------------------------------- tests


def finite_samples(data: dict[str, Any]) -> list[float]:
    if data["resultType"] == "scalar":
        values = [float(data["result"][1])]
    else:
        values = [float(sample["value"][1]) for sample in data["result"]]
    return [v for v in values if math.isfinite(v)]


def test_the_load_reached_every_outcome(evaluated: Evaluated) -> None:
    """The load did what the queries need: successes, gateway rejections, upstream 5xx."""
    assert evaluated.statuses.get(200, 0) >= ROUNDS * 9, evaluated.statuses
    assert evaluated.statuses.get(400, 0) >= ROUNDS * 4, evaluated.statuses
    assert evaluated.statuses.get(500, 0) == ROUNDS * 2, evaluated.statuses
    assert evaluated.pairs == ROUNDS * 5


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: f"{q.panel}/{q.ref}")
def test_dashboard_query_returns_data(evaluated: Evaluated, query: Query) -> None:
    data = evaluated.results[query]
    if query.expr in MAY_LACK_DATA_UNTIL_RELOADS_ARE_COUNTED and not data["result"]:
        assert f"# TYPE {RELOAD_METRIC}" not in evaluated.gateway_metrics, (
            f"{RELOAD_METRIC} is served, so {query.expr!r} must return data"
        )
        return
    assert finite_samples(data), f"{query.panel} ({query.ref}): {query.promql} -> {data}"


def test_every_dashboard_query_was_evaluated(evaluated: Evaluated) -> None:
    with_data = [q for q in QUERIES if finite_samples(evaluated.results[q])]
    print(
        f"\n{len(with_data)} of {len(QUERIES)} dashboard queries returned data "
        f"({len(QUERIES) - len(with_data)} allowed without); set-up, load and "
        f"evaluation took {evaluated.seconds:.1f} s"
    )
    assert len(MAY_LACK_DATA_UNTIL_RELOADS_ARE_COUNTED) == 1
    assert {q.expr for q in QUERIES} >= MAY_LACK_DATA_UNTIL_RELOADS_ARE_COUNTED
    assert len(with_data) >= len(QUERIES) - len(MAY_LACK_DATA_UNTIL_RELOADS_ARE_COUNTED)


def test_the_shadow_verdict_sees_the_query_mismatches(evaluated: Evaluated) -> None:
    """Queries lost their instruction on the candidate side: the verdict is not ready,
    by query inputs only; documents agree."""
    (verdict,) = [q for q in QUERIES if q.panel == "Shadow verdict"]
    assert finite_samples(evaluated.results[verdict])[0] >= ROUNDS
    (mismatches,) = [q for q in QUERIES if q.panel == "Mismatches" and "input_mismatches" in q.expr]
    # Every kind's counter is exported (at 0 until it counts): only queries have counted.
    counted = {
        s["metric"]["kind"]
        for s in evaluated.results[mismatches]["result"]
        if float(s["value"][1]) > 0
    }
    assert counted == {"query"}


def test_the_alert_rules_evaluate_on_the_real_metrics(evaluated: Evaluated) -> None:
    """Every rule evaluates without error against what the processes export; the two
    conditions the load creates are pending (their `for` has not elapsed), the
    processes that are up raise nothing."""
    assert len(evaluated.rules) == 8
    for rule in evaluated.rules:
        assert rule["health"] == "ok", rule
    active = {a["labels"]["alertname"]: a["state"] for a in evaluated.alerts}
    assert active.get("ExtprocShadowNotReady") == "pending", evaluated.alerts
    assert active.get("ExtprocUpstream5xxRatioHigh") == "pending", evaluated.alerts
    assert "ExtprocProcessorDown" not in active
    assert "ExtprocShadowComparatorDown" not in active
