"""Clean overload through a real Envoy: admission control in the ext_proc server
(a small budget in a test policy, so it is cheap), Envoy-side processor failures and
Envoy's own overload manager all answer a 503 ``overloaded`` envelope with
Retry-After, and every client gets an answer."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from pathlib import Path

import orjson
import pytest

from extproc.core.policy import GatewayPolicy
from extproc.runtime.envoy_config import EnvoySettings
from testing_support.envoy import EnvoySpec, loopback_settings, rendered
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import SHAPES, Gateway, GatewaySpec
from testing_support.http import Reply, http, metric_value, post
from testing_support.processes import rss_mb
from testing_support.qwen import QWEN_MODEL, SHIPPED_QWEN_POLICY
from tests.harness import Envoys, Gateways

# 2,048 inputs cut to 256-d: ~18 MiB of estimated work, far over this budget, so such
# a request is admitted only alone.
SMALL_BUDGET = """limits:
  max_inflight_bytes: 1048576
  admission_wait_ms: 100
  retry_after_s: 2
"""
BIG = {"model": QWEN_MODEL, "input": [f"doc {i}" for i in range(2048)], "dimensions": 256}
SMALL = {"model": QWEN_MODEL, "input": "hello", "dimensions": 256}


def assert_overloaded(reply: Reply, retry_after: str) -> str:
    """A 503 envelope, code overloaded, a clean message, Retry-After."""
    assert reply.status == 503, reply.body[:300]
    assert reply.headers.get("retry-after") == retry_after, reply.headers
    assert reply.headers.get("content-type") == "application/json"
    error = reply.error()
    assert (error["type"], error["code"]) == ("server_error", "overloaded")
    message = str(error["message"])
    # No Envoy internals, no empty slot: what the old 5xx mapper showed under load.
    assert "ext_proc" not in message and "  " not in message and "()" not in message
    return message


def budget_gateway(
    budget: str, request: pytest.FixtureRequest, upstream: FakeUpstream, gateways: Gateways
) -> Iterator[Gateway]:
    """A gateway of the shape ``request.param`` whose policy has ``budget``'s limits."""
    policy = budget + SHIPPED_QWEN_POLICY.read_text()
    with gateways.own(GatewaySpec(upstream.url, shape=request.param, policy=policy)) as gw:
        yield gw


@pytest.fixture(scope="module", params=SHAPES)
def gateway(
    request: pytest.FixtureRequest, upstream: FakeUpstream, gateways: Gateways
) -> Iterator[Gateway]:
    yield from budget_gateway(SMALL_BUDGET, request, upstream, gateways)


@pytest.mark.alone  # a bound on the refused request's wait
def test_past_the_budget_a_request_gets_503_overloaded(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    upstream.reset()
    before = metric_value(gateway.metrics(), "extproc_admission_rejected_total")
    waited_before = metric_value(gateway.metrics(), "extproc_admission_waited_total")
    upstream.fault = "slow"  # the big request holds its share while the upstream works
    upstream.slow_seconds = 3.0
    with ThreadPoolExecutor(1) as pool:
        big = pool.submit(gateway.embeddings, BIG, timeout=60)
        deadline = time.monotonic() + 20
        while not upstream.received and time.monotonic() < deadline:
            time.sleep(0.05)
        assert upstream.received, "the big request never reached the upstream"
        held = metric_value(gateway.metrics(), "extproc_admission_in_flight_bytes")
        assert held > 1024 * 1024  # alone, over the whole budget
        started = time.monotonic()
        refused = gateway.embeddings(SMALL, timeout=30)
        waited = time.monotonic() - started
        message = assert_overloaded(refused, "2")
        assert message == "The gateway is at capacity; retry after 2 s."
        assert waited < 2.5, waited  # a bounded wait (100 ms) then the answer, not a queue
        assert big.result().status == 200
    assert len(upstream.received) == 1  # the refused one never reached it
    text = gateway.metrics()
    assert metric_value(text, "extproc_admission_rejected_total") == before + 1
    assert metric_value(text, "extproc_admission_waited_total") == waited_before + 1
    assert metric_value(text, "extproc_admission_in_flight_bytes") == 0
    upstream.fault = "none"
    assert gateway.embeddings(SMALL).status == 200  # room again


@pytest.mark.alone  # the memory after a burst
def test_a_burst_gets_200s_and_503s_and_nothing_else(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    upstream.reset()
    upstream.fault = "slow"
    upstream.slow_seconds = 0.5
    idle_mb = rss_mb(gateway.process.pid)  # `extproc run` serves ext_proc in-process
    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda _: gateway.embeddings(BIG, timeout=60), range(12)))
    statuses = sorted(r.status for r in replies)
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) >= 1 and statuses.count(503) >= 1, statuses
    for reply in replies:
        if reply.status == 503:
            assert_overloaded(reply, "2")
        else:
            assert len(reply.json()["data"]) == 2048
    assert metric_value(gateway.metrics(), "extproc_admission_in_flight_bytes") == 0
    # Memory goes back: within 5 s of the burst, at most 1.5x the size before it.
    deadline = time.monotonic() + 5
    while rss_mb(gateway.process.pid) > 1.5 * idle_mb and time.monotonic() < deadline:
        time.sleep(0.25)
    assert rss_mb(gateway.process.pid) <= 1.5 * idle_mb, (idle_mb, rss_mb(gateway.process.pid))


# Room for one 2,048-input rewrite (~18.5 MiB of work) or one declared 7 MB body
# (3 x 7 MB = 21 MB), not both; a request of unknown length reserves 3 x 8 MiB at its
# headers and must come down to its body's share to let a 7 MB body in.
HEADERS_BUDGET = """limits:
  max_inflight_bytes: 31457280
  admission_wait_ms: 100
  retry_after_s: 2
"""
# Over 1 MB (seven digits), so standalone.yaml's route that sends the request headers
# takes it too; one long input, cut by its head (cheap to tokenize).
DECLARED_LARGE = orjson.dumps({"model": QWEN_MODEL, "input": "word " * 1_400_000})


@pytest.fixture(scope="module", params=SHAPES)
def headers_gateway(
    request: pytest.FixtureRequest, upstream: FakeUpstream, gateways: Gateways
) -> Iterator[Gateway]:
    yield from budget_gateway(HEADERS_BUDGET, request, upstream, gateways)


def envoy_messages(gateway: Gateway) -> int:
    """ext_proc messages Envoy has sent, all filters together."""
    admin = re.search(r"admin (127\.0\.0\.1:\d+)", gateway.ready_line)
    assert admin, gateway.ready_line
    stats = http("GET", f"http://{admin.group(1)}/stats?filter=stream_msgs_sent").body.decode()
    return sum(int(n) for n in re.findall(r"stream_msgs_sent: (\d+)", stats))


def wait_until_received(upstream: FakeUpstream, count: int) -> None:
    deadline = time.monotonic() + 20
    while len(upstream.received) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(upstream.received) >= count, "the upstream never got the request"


def test_a_declared_large_body_is_refused_at_its_headers(
    headers_gateway: Gateway, upstream: FakeUpstream
) -> None:
    """While a rewrite holds the budget, a body declared too large for the rest gets
    the 503 `overloaded` envelope from the request headers: the server admitted the
    declared size there, so Envoy never sent it the body (one message for that
    request), and the upstream never saw it. Envoy answers while the body may still
    be arriving and then closes the connection; the client reads the answer as
    urllib3 and httpcore do (bench/burst.py)."""
    upstream.reset()
    gateway = headers_gateway
    before = gateway.metrics()
    upstream.fault = "slow"
    upstream.slow_seconds = 3.0
    with ThreadPoolExecutor(1) as pool:
        big = pool.submit(gateway.embeddings, BIG, timeout=60)
        wait_until_received(upstream, 1)
        messages = envoy_messages(gateway)
        reply, _ = post(gateway.url, DECLARED_LARGE, timeout=30)
        assert envoy_messages(gateway) - messages == 1  # the request headers alone
        assert_overloaded(reply, "2")
        assert big.result().status == 200
    assert len(upstream.received) == 1
    after = gateway.metrics()
    rejected = "extproc_admission_rejected_total"
    assert metric_value(after, rejected, stage="headers") == (
        metric_value(before, rejected, stage="headers") + 1
    )
    assert metric_value(after, rejected, stage="request") == metric_value(
        before, rejected, stage="request"
    )
    assert metric_value(after, "extproc_admission_in_flight_bytes") == 0
    upstream.fault = "none"
    served, _ = post(gateway.url, DECLARED_LARGE, timeout=60)  # room again: served
    assert served.status == 200, served.body[:300]


def test_a_reservation_of_unknown_length_settles_to_the_body(
    headers_gateway: Gateway, upstream: FakeUpstream
) -> None:
    """A chunked body reserves the body limit's work at its headers (24 MiB here,
    most of the budget), then only its own once the body has come: while it waits on
    the upstream, a declared 7 MB body (21 MB of work) is admitted and served."""
    upstream.reset()
    gateway = headers_gateway
    upstream.fault = "slow"
    upstream.slow_seconds = 3.0
    host, port = gateway.url.removeprefix("http://").rsplit(":", 1)

    def chunked() -> int:
        connection = HTTPConnection(host, int(port), timeout=60)
        try:
            body = orjson.dumps(SMALL)
            connection.request(
                "POST",
                "/v1/embeddings",
                body=iter([body[:10], body[10:]]),
                headers={"content-type": "application/json"},
                encode_chunked=True,
            )
            response = connection.getresponse()
            response.read()
            return response.status
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        unsized = pool.submit(chunked)
        wait_until_received(upstream, 1)
        held = metric_value(gateway.metrics(), "extproc_admission_in_flight_bytes")
        assert 0 < held < 1024 * 1024, held  # its body's share, not the 24 MiB reserved
        upstream.fault = "none"  # the next one is answered at once
        reply, _ = post(gateway.url, DECLARED_LARGE, timeout=60)
        assert reply.status == 200, reply.body[:300]
        assert unsized.result() == 200
    assert metric_value(gateway.metrics(), "extproc_admission_in_flight_bytes") == 0


def test_a_reloaded_budget_changes_what_is_admitted(
    upstream: FakeUpstream, gateways: Gateways, tmp_path: Path
) -> None:
    """A reload that raises `max_inflight_bytes` admits next to a rewrite in flight
    what the smaller budget refused, and one that lowers it refuses it again."""
    upstream.reset()
    policy = tmp_path / "policy.yaml"
    policy.write_text(SMALL_BUDGET + SHIPPED_QWEN_POLICY.read_text())
    raised = (
        SMALL_BUDGET.replace("1048576", str(64 * 1024 * 1024)) + SHIPPED_QWEN_POLICY.read_text()
    )

    def beside_a_rewrite(gateway: Gateway) -> Reply:
        """A small request while a 2,048-input rewrite (~18 MiB of work) is in flight."""
        upstream.fault, upstream.slow_seconds = "slow", 1.5
        with ThreadPoolExecutor(1) as pool:
            big = pool.submit(gateway.embeddings, BIG, timeout=60)
            wait_until_received(upstream, len(upstream.received) + 1)
            reply = gateway.embeddings(SMALL, timeout=30)
            assert big.result().status == 200
        upstream.fault = "none"
        return reply

    def reload(gateway: Gateway, text: str) -> None:
        def count() -> float:
            return metric_value(
                gateway.metrics(), "extproc_policy_reloads_total", outcome="reloaded"
            )

        before = count()
        policy.write_text(text)
        deadline = time.monotonic() + 30
        while count() == before:
            assert time.monotonic() < deadline, gateway.log()
            time.sleep(0.1)

    with gateways.own(GatewaySpec(upstream.url, policy=policy)) as gateway:
        assert_overloaded(beside_a_rewrite(gateway), "2")
        reload(gateway, raised)
        assert beside_a_rewrite(gateway).status == 200
        reload(gateway, SMALL_BUDGET + SHIPPED_QWEN_POLICY.read_text())
        assert_overloaded(beside_a_rewrite(gateway), "2")
        log = gateway.log()
    assert log.count("admission: budget") == 2, log


@pytest.fixture
def envoy_settings(upstream: FakeUpstream) -> EnvoySettings:
    """Nothing listens on its processor's port."""
    return loopback_settings(upstream.url)


def test_processor_unreachable_is_a_clean_503(
    envoy_settings: EnvoySettings,
    qwen_policy: GatewayPolicy,
    envoys: Envoys,
    upstream: FakeUpstream,
) -> None:
    """Envoy's ext_proc failure (nothing listens on the processor's port) gets the
    same clean answer, not "could not get an answer:  (ext_proc_error_gRPC_error_...)"."""
    upstream.reset()
    config = rendered(envoy_settings, qwen_policy)
    with envoys.own(EnvoySpec.of(config)) as envoy:
        assert_overloaded(http("POST", envoy.embeddings_url, SMALL), "1")
        stats = http("GET", f"{envoy.admin_url}/stats?filter=ext_proc")
        # Envoy counts its side of the failure (docs/metrics.md: the Envoy series worth watching).
        assert b"http.embeddings.ext_proc.streams_failed: 1" in stats.body, stats.body
    assert upstream.received == []


def test_envoys_overload_manager_answers_503_overloaded(
    envoy_settings: EnvoySettings,
    qwen_policy: GatewayPolicy,
    envoys: Envoys,
    upstream: FakeUpstream,
) -> None:
    """A heap budget Envoy is already over: every request is refused by Envoy itself,
    with the envelope and Retry-After. (Nothing listens on the processor's port here,
    which gives the same answer: Envoy's own counters tell the overload manager's
    refusal from a failed ext_proc stream.)"""
    upstream.reset()
    config = rendered(envoy_settings, qwen_policy)
    monitors = config["overload_manager"]["resource_monitors"]
    (heap,) = [m for m in monitors if m["name"].endswith("fixed_heap")]
    heap["typed_config"]["max_heap_size_bytes"] = 1024 * 1024
    active = "envoy_overload_envoy_overload_actions_stop_accepting_requests_active"
    with envoys.own(EnvoySpec.of(config)) as envoy:
        # The monitor refreshes every 0.25 s.
        envoy.process.wait_until(lambda: envoy.series(active) == 1, 10, "overload active")
        assert_overloaded(http("POST", envoy.embeddings_url, SMALL), "1")
        assert envoy.series("envoy_http_downstream_rq_overload_close") == 1
        assert envoy.series("envoy_http_ext_proc_streams_started") == 0  # no filter ran
    assert upstream.received == []
