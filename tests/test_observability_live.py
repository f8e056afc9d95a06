"""Every query of the Grafana dashboard, evaluated by a real Prometheus that scraped a
real gateway and a real shadow comparator under a short load.

On 127.0.0.1, all started here and stopped by their own PIDs:

- the fake Dynamo (``testing_support/fake_upstream.py``) and the fake legacy server
  (``tests/fake_legacy.py``), in this process;
- the gateway: ``extproc run --metrics`` (Envoy + ext_proc) in front of the fake Dynamo,
  with a copy of the shipped Qwen3 policy and ``--workers 2``, the default on this
  machine (the launcher's /metrics adds up both workers' metrics: one target). A single
  process exports the same series from its first scrape
  (tests/test_metrics_first_scrape.py), so every query returns data there as well;
- the shadow set-up: ``extproc shadow`` (Envoy, ext_proc server, comparator) with the
  legacy server as baseline and the fake Dynamo as candidate, its ext_proc policy
  without the Qwen3 query instruction, so that query inputs mismatch (the seed's
  silent failure) while documents agree, and the verdict panel and alert have
  something to show;
- two more Envoys for what the gateway above must not suffer, both rendered from the
  shipped ``envoy/standalone.yaml`` as ``extproc run`` renders it: one in front of an
  ``extproc serve`` of its own with a 1 s ``message_timeout``, whose server is
  stopped by PID (SIGSTOP) for a moment in each round, so that Envoy's messages time
  out, and stopped for good (SIGTERM) in the last round, so that its streams fail; and
  one with a heap budget it is already over (1 MiB, so its overload manager refuses
  every request) and a global cap of 3 downstream connections, which the test
  exceeds;
- Debian's ``prometheus`` (scrape and rule evaluation every second, a temporary data
  directory) with ``deploy/observability/prometheus/alerts.yml`` loaded, scraping the
  ext_proc server's and the comparator's /metrics and every Envoy's admin
  /stats/prometheus.

The load comes in rounds a few scrapes apart, so that every counter is seen before and
after it grows and every rate is non-zero: valid requests (documents, queries,
``dimensions``, base64, a long input that is truncated), requests the gateway rejects,
upstream 500s, requests the gateway's admission control refuses (its policy copy has
the smallest budget, 1 MiB, and one large rewrite holds it while the upstream is
slow), and the Envoy-side failures above. Then each dashboard query goes through
``/api/v1/query`` with Grafana's ``$__rate_interval`` replaced by a concrete window,
and must return at least one finite sample; each query of the Envoy and overload
panels must also show the failure it is there for (a sample above 0), but for the
ones listed in ``ZERO_HERE_BY_DESIGN`` with the reason.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import signal
import socket
import sys
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from extproc.core.policy import GatewayPolicy
from testing_support.envoy import Envoy, EnvoySpec, loopback_settings, rendered
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import Gateway, GatewaySpec
from testing_support.http import Reply, answers_ok, http, metric_value
from testing_support.processes import Process, free_port, wait_until
from testing_support.qwen import QWEN_MODEL, REPO, SHIPPED_QWEN_POLICY
from testing_support.serve import Serve, ServeSpec
from tests.fake_legacy import FakeLegacy
from tests.harness import Envoys, Gateways, Servers

pytestmark = pytest.mark.alone  # 1 s message timeouts, admission refusals, SIGSTOP

OBSERVABILITY = REPO / "deploy" / "observability"
DASHBOARD = OBSERVABILITY / "grafana" / "dashboards" / "gateway.json"
ALERTS = OBSERVABILITY / "prometheus" / "alerts.yml"

READY_TIMEOUT_S = 90.0
READY_SHADOW = "extproc shadow ready:"
SCRAPED_TIMEOUT_S = 30.0
ROUNDS = 3
WORKERS = 2  # `extproc run`'s default here: one per usable CPU
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

# The gateway's admission budget here: the smallest allowed. One request of
# ADMISSION_HOLDER_INPUTS inputs cut to 256-d (~1.1 MB of estimated work) is over it
# and admitted alone; while it waits on the slow upstream, every other request waits
# ADMISSION_WAIT_MS and is refused.
SMALL_BUDGET = {"max_inflight_bytes": 1024 * 1024, "admission_wait_ms": 100}
ADMISSION_HOLDER_INPUTS = 128
REFUSED_PER_ROUND = 5  # by admission control, by the overloaded Envoy
TIMEOUTS_PER_ROUND = 2  # messages to the stopped processor
FAILURES_AT_THE_END = 3  # streams to the processor gone for good
MESSAGE_TIMEOUT = "1s"  # far above an answer (about 1 ms), even on a loaded machine
CONNECTION_CAP = 3

# Queries of the Envoy and overload panels that return data here (Envoy exports the
# counter at 0 from its start) but cannot show the failure they watch for, and why.
# Every other query naming an envoy_ series or the admission counter must be above 0.
ZERO_HERE_BY_DESIGN = {
    "sum by (instance) (rate(envoy_http_ext_proc_failure_mode_allowed[$__rate_interval]))": (
        "every shipped config fails closed (failure_mode_allow: false), so no Envoy here "
        "lets a request through without the processor; the series shows a config that does"
    ),
}


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


def get_json(url: str) -> Any:
    return http("GET", url, timeout=10).json()


@dataclass(frozen=True)
class Shadow:
    process: Process
    url: str  # where clients send embeddings requests
    http_url: str  # the comparator's /summary and /metrics


def start_shadow(
    baseline: str, candidate: str, qwen_dir: Path, log_dir: Path, workers: int
) -> Shadow:
    """`extproc shadow` whose candidate-side policy has no query instruction, started
    (ready once it logs READY_SHADOW)."""
    policy = yaml.safe_load(SHIPPED_QWEN_POLICY.read_text())
    policy["models"][0]["prompts"] = {"query": "{text}"}
    policy_path = log_dir / "no-query-instruction.yaml"
    policy_path.write_text(yaml.safe_dump(policy))
    listen, http_port = free_port(), free_port()
    argv = [
        *(sys.executable, "-m", "extproc", "shadow"),
        *("--baseline", baseline, "--candidate", candidate),
        *("--listen", f"127.0.0.1:{listen}", "--http", f"127.0.0.1:{http_port}"),
        *("--config", str(policy_path), "--tokenizer", f"{QWEN_MODEL}={qwen_dir}"),
        *("--grace", "1", "--workers", str(workers)),
    ]
    process = Process.start(argv, log_dir / "shadow.log", name="extproc shadow")
    return Shadow(process, f"http://127.0.0.1:{listen}", f"http://127.0.0.1:{http_port}")


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


@dataclass(frozen=True)
class ScrapeJob:
    name: str
    targets: list[str]  # host:port
    path: str = "/metrics"


def start_prometheus(jobs: list[ScrapeJob], log_dir: Path) -> Prometheus:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed (scripts/ci-system-deps.sh installs it)")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": job.name,
                "metrics_path": job.path,
                "static_configs": [{"targets": job.targets}],
            }
            for job in jobs
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
    process = Process.start(argv, log_dir / "prometheus.log", name="prometheus")
    prometheus = Prometheus(process, f"http://127.0.0.1:{port}")
    process.wait_until(lambda: answers_ok(f"{prometheus.url}/-/ready"), 30, "prometheus ready")
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


# --------------------------------------------------------------------------- Envoys


def ext_proc_filters(config: dict[str, Any]) -> list[dict[str, Any]]:
    (listener,) = config["static_resources"]["listeners"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return [
        f["typed_config"]
        for f in hcm["http_filters"]
        if f["typed_config"]["@type"].endswith(".ext_proc.v3.ExternalProcessor")
    ]


def overload_monitor(config: dict[str, Any], suffix: str) -> dict[str, Any]:
    (monitor,) = [
        m for m in config["overload_manager"]["resource_monitors"] if m["name"].endswith(suffix)
    ]
    typed: dict[str, Any] = monitor["typed_config"]
    return typed


@dataclass(frozen=True)
class ProcessorFaults:
    """An Envoy in front of an ``extproc serve`` of its own, with a short
    ``message_timeout``: the server stopped by PID for a moment (messages time out),
    then for good (streams fail)."""

    server: Serve
    envoy: Envoy

    def round(self, last: bool) -> list[Reply]:
        doc = {"model": QWEN_MODEL, "input": "Lisbon is in Portugal."}
        served = http("POST", self.envoy.embeddings_url, doc, timeout=30)
        assert served.status == 200, served  # the processor answers between the faults
        replies = []
        self.server.process.signal(signal.SIGSTOP)
        try:
            replies += [
                http("POST", self.envoy.embeddings_url, doc, timeout=30)
                for _ in range(TIMEOUTS_PER_ROUND)
            ]
        finally:
            self.server.process.signal(signal.SIGCONT)
        if last:
            assert self.server.stop() == 0, self.server.log()
            replies += [
                http("POST", self.envoy.embeddings_url, doc, timeout=30)
                for _ in range(FAILURES_AT_THE_END)
            ]
        return replies


@contextlib.contextmanager
def start_processor_faults(
    upstream: FakeUpstream, policy: GatewayPolicy, servers: Servers, envoys: Envoys
) -> Iterator[ProcessorFaults]:
    with servers.own(ServeSpec()) as server:
        config = rendered(loopback_settings(upstream.url, server.port), policy)
        for ext_proc in ext_proc_filters(config):
            ext_proc["message_timeout"] = MESSAGE_TIMEOUT
        with envoys.own(EnvoySpec.of(config, "processor-faults")) as envoy:
            yield ProcessorFaults(server, envoy)


@contextlib.contextmanager
def start_overloaded_envoy(
    upstream: FakeUpstream, policy: GatewayPolicy, envoys: Envoys
) -> Iterator[Envoy]:
    """An Envoy over its heap budget (its overload manager refuses every request) with
    a global cap of CONNECTION_CAP downstream connections."""
    config = rendered(loopback_settings(upstream.url), policy)
    overload_monitor(config, ".fixed_heap")["max_heap_size_bytes"] = 1024 * 1024
    cap = overload_monitor(config, ".global_downstream_max_connections")
    cap["max_active_downstream_connections"] = CONNECTION_CAP
    with envoys.own(EnvoySpec.of(config, "overloaded")) as envoy:
        active = "envoy_overload_envoy_overload_actions_stop_accepting_requests_active"
        envoy.process.wait_until(lambda: envoy.series(active) == 1, 30, "overload manager active")
        yield envoy


def overload_round(envoy: Envoy, held: list[socket.socket]) -> list[Reply]:
    """REFUSED_PER_ROUND requests, then CONNECTION_CAP + 2 connections held open (two
    over the cap) until the next round, or the end of the test."""
    for sock in held:
        sock.close()
    held.clear()
    # The connections of the round before are gone before new requests come.
    envoy.process.wait_until(
        lambda: envoy.series("envoy_listener_downstream_cx_active") == 0, 10, "connections closed"
    )
    replies = [
        http("POST", envoy.embeddings_url, {"model": QWEN_MODEL, "input": "x"}, timeout=10)
        for _ in range(REFUSED_PER_ROUND)
    ]
    for _ in range(CONNECTION_CAP + 2):
        held.append(socket.create_connection(("127.0.0.1", envoy.port), timeout=5))
    return replies


def admission_round(gateway: Gateway, upstream: FakeUpstream, workers: int) -> dict[int, int]:
    """One large rewrite per ext_proc process holds its whole admission budget (each
    worker has its own) while the upstream is slow; the REFUSED_PER_ROUND requests sent
    meanwhile are refused."""
    holder = {
        "model": QWEN_MODEL,
        "input": [f"Document {i}." for i in range(ADMISSION_HOLDER_INPUTS)],
        "dimensions": 256,
    }
    small = {"model": QWEN_MODEL, "input": "hello", "dimensions": 256}
    statuses: dict[int, int] = {}
    arrived = len(upstream.received)
    upstream.fault = "slow"
    upstream.slow_seconds = 2.0
    try:
        with ThreadPoolExecutor(2 * workers + 2) as pool:
            held = []
            deadline = time.monotonic() + 20
            # Envoy picks the worker: a holder sent to one already full is refused
            # (not counted here; the gateway's own metrics do) and sent again.
            while len(upstream.received) - arrived < workers:
                assert time.monotonic() < deadline, "the large rewrites never reached the upstream"
                reached = len(upstream.received)
                attempt = pool.submit(gateway.embeddings, holder, timeout=60)
                while len(upstream.received) == reached and not attempt.done():
                    assert time.monotonic() < deadline, "a large rewrite got no answer"
                    time.sleep(0.02)
                if len(upstream.received) > reached:
                    held.append(attempt)
                else:
                    assert is_overloaded(attempt.result()), attempt.result()
            for _ in range(REFUSED_PER_ROUND):
                reply = gateway.embeddings(small, timeout=30)
                assert is_overloaded(reply), reply
                statuses[reply.status] = statuses.get(reply.status, 0) + 1
            assert [h.result().status for h in held] == [200] * workers
    finally:
        upstream.fault = "none"
    statuses[200] = statuses.get(200, 0) + workers
    return statuses


def is_overloaded(reply: Reply) -> bool:
    """Envoy's or the server's 503 `overloaded` envelope, with Retry-After."""
    return (
        reply.status == 503
        and "retry-after" in reply.headers
        and reply.json()["error"]["code"] == "overloaded"
    )


# --------------------------------------------------------------------------- fixture


@dataclass(frozen=True)
class Evaluated:
    results: dict[Query, dict[str, Any]]
    gateway_metrics: str
    statuses: dict[int, int]  # the gateway's answers (admission control's included)
    pairs: int
    fault_replies: list[Reply]  # the processor-faults Envoy's, while its server was stopped
    overload_replies: list[Reply]  # the overloaded Envoy's
    envoys: dict[str, str]  # role -> the instance Prometheus scraped it as
    alerts: list[dict[str, Any]]
    rules: list[dict[str, Any]]
    seconds: float


EXPECTED_PENDING = {
    "ExtprocShadowNotReady",
    "ExtprocUpstream5xxRatioHigh",
    "ExtprocAdmissionSaturated",
    "ExtprocEnvoyProcessorFailing",
    "ExtprocEnvoyOverloaded",
}


@pytest.fixture(scope="module")
def evaluated(
    request: pytest.FixtureRequest,
    qwen_dir: Path,
    qwen_policy: GatewayPolicy,
    gateways: Gateways,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Evaluated]:
    servers: Servers = request.getfixturevalue("servers")
    envoy_pool: Envoys = request.getfixturevalue("envoys")
    workers = WORKERS
    started = time.monotonic()
    logs = tmp_path_factory.mktemp("observability")
    policy_copy = logs / "policy.yaml"
    policy_doc = yaml.safe_load(SHIPPED_QWEN_POLICY.read_text())
    policy_copy.write_text(yaml.safe_dump({"limits": SMALL_BUDGET, **policy_doc}, sort_keys=False))
    with ExitStack() as cleanup:
        upstream = cleanup.enter_context(FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir))
        legacy = cleanup.enter_context(FakeLegacy(tokenizer_dir=qwen_dir))
        # The shadow set-up starts while the gateway and the Envoys do.
        shadow = start_shadow(legacy.url, upstream.url, qwen_dir, logs, workers)
        cleanup.callback(shadow.process.stop)
        spec = GatewaySpec(upstream.url, policy=policy_copy, workers=workers)
        gateway = cleanup.enter_context(gateways.own(spec, folder=logs))
        faults = cleanup.enter_context(
            start_processor_faults(upstream, qwen_policy, servers, envoy_pool)
        )
        overloaded = cleanup.enter_context(
            start_overloaded_envoy(upstream, qwen_policy, envoy_pool)
        )
        shadow.process.wait_line(READY_SHADOW, READY_TIMEOUT_S)
        held: list[socket.socket] = []
        cleanup.callback(lambda: [sock.close() for sock in held])
        envoys = {
            "gateway": gateway.admin_url.removeprefix("http://"),
            "processor-faults": faults.envoy.admin,
            "overloaded": overloaded.admin,
        }
        prometheus = start_prometheus(
            [
                ScrapeJob("extproc", [gateway.metrics_url.removeprefix("http://")]),
                ScrapeJob("extproc-shadow", [shadow.http_url.removeprefix("http://")]),
                ScrapeJob("envoy", list(envoys.values()), "/stats/prometheus"),
            ],
            logs,
        )
        cleanup.callback(prometheus.process.stop)
        wait_until(
            lambda: prometheus.value('count(up{job=~"extproc|extproc-shadow|envoy"} == 1)') == 5,
            SCRAPED_TIMEOUT_S,
            "every target scraped",
            [prometheus.process],
        )

        statuses: dict[int, int] = {}
        sent_to_shadow = 0
        fault_replies: list[Reply] = []
        overload_replies: list[Reply] = []
        for round_number in range(ROUNDS):
            if round_number == 1:
                # A policy change the gateway reloads, where live reload exists.
                policy_copy.write_text(policy_copy.read_text() + "# reloaded by the test\n")
            for counted in (
                gateway_round(gateway, upstream),
                admission_round(gateway, upstream, workers),
            ):
                for status, count in counted.items():
                    statuses[status] = statuses.get(status, 0) + count
            sent_to_shadow += shadow_round(shadow)
            fault_replies += faults.round(last=round_number == ROUNDS - 1)
            overload_replies += overload_round(overloaded, held)
            if round_number < ROUNDS - 1:
                time.sleep(ROUND_GAP_S)

        # Everything counted has been scraped: Prometheus agrees with the processes.
        gateway_metrics = gateway.metrics()
        requests = metric_value(gateway_metrics, "extproc_requests_total")
        refused = metric_value(gateway_metrics, "extproc_admission_rejected_total")
        wait_until(
            lambda: get_json(f"{shadow.http_url}/summary")["pairs"] >= sent_to_shadow,
            SCRAPED_TIMEOUT_S,
            "pairs compared",
            [shadow.process],
        )
        failed = faults.envoy.series("envoy_http_ext_proc_streams_failed")
        overload_closed = overloaded.series("envoy_http_downstream_rq_overload_close")
        wait_until(
            lambda: (
                prometheus.value("sum(extproc_requests_total)") == requests
                and prometheus.value("sum(extproc_admission_rejected_total)") == refused
                and prometheus.value("sum(extproc_shadow_pairs_total)") >= sent_to_shadow
                and prometheus.value("sum(envoy_http_ext_proc_streams_failed)") == failed
                and prometheus.value("sum(envoy_http_downstream_rq_overload_close)")
                == overload_closed
            ),
            SCRAPED_TIMEOUT_S,
            "final counters scraped",
            [prometheus.process],
        )
        results = {query: prometheus.query(query.promql) for query in QUERIES}
        # The rules run every second too: give them a few evaluations on the last scrape.
        deadline = time.monotonic() + 10
        while True:
            alerts = get_json(f"{prometheus.url}/api/v1/alerts")["data"]["alerts"]
            pending = {a["labels"]["alertname"] for a in alerts if a["state"] == "pending"}
            if pending >= EXPECTED_PENDING or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        groups = get_json(f"{prometheus.url}/api/v1/rules")["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        yield Evaluated(
            results,
            gateway_metrics,
            statuses,
            sent_to_shadow,
            fault_replies,
            overload_replies,
            envoys,
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
    """The load did what the queries need: successes, gateway rejections, upstream 5xx,
    admission refusals; every request to a failing or overloaded Envoy got the clean
    503 `overloaded`."""
    assert evaluated.statuses.get(200, 0) >= ROUNDS * 10, evaluated.statuses
    assert evaluated.statuses.get(400, 0) >= ROUNDS * 4, evaluated.statuses
    assert evaluated.statuses.get(500, 0) == ROUNDS * 2, evaluated.statuses
    assert evaluated.statuses.get(503, 0) == ROUNDS * REFUSED_PER_ROUND, evaluated.statuses
    assert evaluated.pairs == ROUNDS * 5
    faults = ROUNDS * TIMEOUTS_PER_ROUND + FAILURES_AT_THE_END
    assert len(evaluated.fault_replies) == faults
    assert len(evaluated.overload_replies) == ROUNDS * REFUSED_PER_ROUND
    for reply in evaluated.fault_replies + evaluated.overload_replies:
        assert is_overloaded(reply), reply


def envoy_or_overload(query: Query) -> bool:
    return "envoy_" in query.expr or "extproc_admission_rejected_total" in query.expr


def test_the_envoy_and_overload_panels_show_the_failures_caused(evaluated: Evaluated) -> None:
    """Each query of the Envoy and overload panels saw what it is there for (a sample
    above 0: failed and timed-out streams, refused requests and connections, heap and
    connection pressure, admission refusals), but those that cannot here, listed with
    their reason; and each of those lists still names a query of the dashboard."""
    queries = [q for q in QUERIES if envoy_or_overload(q)]
    assert len(queries) >= 11, queries
    blank = [
        f"{q.panel} ({q.ref}): {q.promql} -> {evaluated.results[q]}"
        for q in queries
        if q.expr not in ZERO_HERE_BY_DESIGN
        and not any(v > 0 for v in finite_samples(evaluated.results[q]))
    ]
    assert not blank, "\n".join(blank)
    assert set(ZERO_HERE_BY_DESIGN) <= {q.expr for q in queries}
    (scraped,) = [q for q in QUERIES if q.panel == "Envoys scraped"]
    assert finite_samples(evaluated.results[scraped]) == [len(evaluated.envoys)]


def test_the_envoy_panels_name_the_envoy_that_failed(evaluated: Evaluated) -> None:
    """Per-Envoy series put each failure on the Envoy where it was caused."""

    def positive_instances(panel: str, ref: str) -> set[str]:
        (query,) = [q for q in QUERIES if q.panel == panel and q.ref == ref]
        return {
            s["metric"]["instance"]
            for s in evaluated.results[query]["result"]
            if float(s["value"][1]) > 0
        }

    faults, overloaded = evaluated.envoys["processor-faults"], evaluated.envoys["overloaded"]
    assert positive_instances("ext_proc stream failures seen by Envoy", "A") == {faults}
    assert positive_instances("ext_proc stream failures seen by Envoy", "B") == {faults}
    assert positive_instances("503 overloaded, by who refused", "A") == {overloaded}
    assert positive_instances("Connections refused at the cap", "A") == {overloaded}
    assert positive_instances("Envoy resource pressure", "B") == {overloaded}
    assert overloaded in positive_instances("Envoy resource pressure", "A")


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
    """Every rule evaluates without error against what the processes export; the
    conditions the load creates are pending (their `for` has not elapsed), the Envoy
    ones on the Envoy that was made to fail, and the processes that are up raise
    nothing."""
    assert len(evaluated.rules) == 8
    for rule in evaluated.rules:
        assert rule["health"] == "ok", rule
    active: dict[str, set[tuple[str, str]]] = {}
    for alert in evaluated.alerts:
        labels = alert["labels"]
        active.setdefault(labels["alertname"], set()).add(
            (alert["state"], labels.get("instance", ""))
        )
    assert set(active) == EXPECTED_PENDING, evaluated.alerts
    assert {state for states in active.values() for state, _ in states} == {"pending"}
    faults, overloaded = evaluated.envoys["processor-faults"], evaluated.envoys["overloaded"]
    assert active["ExtprocEnvoyProcessorFailing"] == {("pending", faults)}
    assert active["ExtprocEnvoyOverloaded"] == {("pending", overloaded)}
