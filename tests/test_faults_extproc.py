"""Faults of the processes around the gateway: the ext_proc server
SIGKILLed or SIGTERMed under load, Envoy killed and restarted under load.

The SIGKILL and SIGTERM cases run twice: against `extproc serve` alone (below), and
against one worker of `extproc run --workers 2` (tests/harness.py), whose launcher
restarts it while Envoy sends its share to the other worker
(extproc/runtime/worker_pool.py).

A real stack on 127.0.0.1, shared by the tests of this module and repaired between
them: `extproc serve` as its own process on a fixed port, a real Envoy rendered from
envoy/standalone.yaml by extproc/runtime/envoy_config.py (as `extproc run` does) pointing at
it, and testing_support/fake_upstream.FakeUpstream (Dynamo flavour) behind Envoy. The load is
requests that MUST be rewritten: ``input_type: query`` (the Qwen3 instruction must
reach the model) and, for half the clients, also ``dimensions: 256`` (the response
is rewritten too, on standalone.yaml's rewrite route). Every wait is bounded; each
process is stopped by its own PID. Measured times are printed (run with ``-s``).

Order: SIGKILL (the server is restarted inside the test), Envoy restart (the same
server keeps serving), SIGTERM last (it leaves the server stopped). On SIGTERM, the
in-flight requests whose response needs ext_proc (``dimensions``: a second stream on
standalone.yaml's rewrite route, opened when the upstream answers) must finish too:
the server keeps accepting streams while any of its streams is open.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import client as http_client
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.core.policy import GatewayPolicy
from testing_support.envoy import Envoy, EnvoySpec, loopback_settings, rendered, start_envoy
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import Gateway, GatewaySpec
from testing_support.http import envelope_error, http, metric_value
from testing_support.qwen import QWEN_MODEL
from testing_support.serve import Serve, ServeSpec, start_serve
from tests.harness import Gateways

pytestmark = pytest.mark.alone  # SIGKILL and SIGTERM under load, reconnect bounds

INSTRUCTION = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)
GRACE_S = 5.0  # `extproc serve --grace`
CLIENTS = 8
START_TIMEOUT_S = 60.0
# From the restarted server's SERVING to the first 200: Envoy reconnecting. (The
# restart itself, Python and the tokenizer loading, takes 3-20 s on a loaded 2-core box.)
RECONNECT_BOUND_S = 5.0
# With several workers, from a worker's death to the last request that can fail for it:
# Envoy ejects it at the first stream that cannot reach it and its health check (every
# second) keeps it out; only streams already on it, or started in that instant, fail.
EJECT_BOUND_S = 2.0
WORKERS = 2


# -- the stack -------------------------------------------------------------------------


def health(port: int, timeout: float = 1.0) -> str:
    """The server's gRPC health ("SERVING", "NOT_SERVING") or the RPC's error code."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError as error:
            return str(error.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


SERVE = ServeSpec(metrics=True, grace=GRACE_S)


@dataclass
class Stack:
    """`extproc serve` on a fixed port behind an Envoy on fixed ports, each restarted
    there by a test that stopped it."""

    upstream: FakeUpstream
    folder: Path
    envoy_spec: EnvoySpec
    grpc_port: int
    serve: Serve | None = None
    envoy: Envoy | None = None

    @property
    def url(self) -> str:
        assert self.envoy is not None
        return self.envoy.embeddings_url

    def start_serve(self) -> float:
        """Start `extproc serve` on the stack's fixed port; seconds until SERVING."""
        started = time.monotonic()
        self.serve = start_serve(SERVE, self.folder, port=self.grpc_port, wait=False)
        self.serve.process.wait_until(
            lambda: health(self.grpc_port) == "SERVING", START_TIMEOUT_S, "extproc serve SERVING"
        )
        return time.monotonic() - started

    def start_envoy(self) -> float:
        """Start Envoy on the stack's fixed ports; seconds until /ready."""
        started = time.monotonic()
        self.envoy = start_envoy(self.envoy_spec, self.folder, wait=False)
        self.envoy.wait_ready(START_TIMEOUT_S)
        return time.monotonic() - started

    def ensure_up(self) -> None:
        if self.serve is None or not self.serve.process.alive():
            self.start_serve()
        if self.envoy is None or not self.envoy.process.alive():
            self.start_envoy()
        # Envoy connects to ext_proc on demand: one real request proves the path.
        deadline = time.monotonic() + START_TIMEOUT_S
        while call(self.url, query_body("warm-up"))[0] != 200:
            assert time.monotonic() < deadline, "the stack did not answer 200"
            time.sleep(0.1)
        self.upstream.reset()

    def serve_log(self) -> str:
        assert self.serve is not None
        return self.serve.log()

    def stop(self) -> None:
        if self.envoy is not None:
            self.envoy.stop()
        if self.serve is not None:
            self.serve.stop(GRACE_S + 5)


@pytest.fixture(scope="module")
def stack_once(
    qwen_policy: GatewayPolicy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("faults-extproc")
    with FakeUpstream(flavour="dynamo") as upstream:
        settings = loopback_settings(upstream.url)
        spec = EnvoySpec.of(rendered(settings, qwen_policy), "faults")
        stack = Stack(upstream, folder, spec, settings.extproc_port)
        try:
            yield stack
        finally:
            stack.stop()


@pytest.fixture
def stack(stack_once: Stack) -> Stack:
    """The shared stack, with both processes running and answering (restarted if a
    previous test left one down)."""
    stack_once.ensure_up()
    return stack_once


@dataclass
class RunStack:
    """`extproc run --workers 2` in front of its own fake Dynamo: the launcher's workers
    are the processors; the test kills or stops one of them by PID."""

    upstream: FakeUpstream
    gateway: Gateway

    @property
    def url(self) -> str:
        return f"{self.gateway.url}/v1/embeddings"

    def worker(self, index: int) -> tuple[int, str]:
        """(PID, address) of worker ``index`` as the launcher last started it."""
        pid = self.gateway.worker_pids()[index]
        return pid, self.gateway.extproc_addresses[index - 1]

    def ensure_up(self) -> None:
        """Every worker serving (restarted by the launcher if a test stopped one) and
        the gateway answering 200."""
        deadline = time.monotonic() + START_TIMEOUT_S
        for address in self.gateway.extproc_addresses:
            port = int(address.rsplit(":", 1)[1])
            while health(port) != "SERVING":
                assert self.gateway.process.alive(), self.gateway.log()
                assert time.monotonic() < deadline, f"worker {address} not serving"
                time.sleep(0.05)
        while call(self.url, query_body("warm-up"))[0] != 200:
            assert time.monotonic() < deadline, "the gateway did not answer 200"
            time.sleep(0.1)
        self.upstream.reset()


@pytest.fixture(scope="module")
def run_stack_once(qwen_dir: Path, gateways: Gateways) -> Iterator[RunStack]:
    """`extproc run --workers 2`, whose workers the tests kill (the launcher restarts
    them), in front of a fake Dynamo of its own."""
    with (
        FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir) as upstream,
        gateways.own(GatewaySpec(upstream.url, workers=WORKERS), clean_exit=False) as gateway,
    ):
        yield RunStack(upstream, gateway)


@pytest.fixture
def run_stack(run_stack_once: RunStack) -> RunStack:
    run_stack_once.ensure_up()
    return run_stack_once


# -- clients -----------------------------------------------------------------------------


def query_body(text: str, dimensions: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": QWEN_MODEL, "input": [text], "input_type": "query"}
    if dimensions is not None:
        body["dimensions"] = dimensions
    return body


def call(url: str, body: dict[str, Any], timeout: float = 30.0) -> tuple[int | None, bytes, str]:
    """(status or None, body, error): one request on its own connection; a connection
    error or a cut body is reported, never raised."""
    host_port = url.split("/")[2]
    host, port = host_port.rsplit(":", 1)
    conn = http_client.HTTPConnection(host, int(port), timeout=timeout)
    status: int | None = None
    try:
        conn.request(
            "POST", "/v1/embeddings", orjson.dumps(body), {"content-type": "application/json"}
        )
        response = conn.getresponse()
        status = response.status
        return status, response.read(), ""
    except (OSError, http_client.HTTPException) as error:
        return status, b"", f"{type(error).__name__}: {error}"
    finally:
        conn.close()


@dataclass(frozen=True)
class Outcome:
    kind: str  # "query" (request rewrite only) or "dims" (request and response rewrite)
    started: float
    ended: float
    status: int | None
    body: bytes
    error: str


class Load:
    """``CLIENTS`` threads, each sending requests back to back until stopped; even
    clients send query-only requests, odd ones query + ``dimensions: 256``."""

    def __init__(self, url: str, clients: int = CLIENTS) -> None:
        self.url = url
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)
        ]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=35)
        assert not any(t.is_alive() for t in self._threads), "a client is stuck"

    def _client(self, index: int) -> None:
        kind = "dims" if index % 2 else "query"
        n = 0
        while not self._stop.is_set():
            n += 1
            started = time.monotonic()
            body = query_body(f"client {index} question {n}?", 256 if kind == "dims" else None)
            status, reply, error = call(self.url, body)
            with self._lock:
                self.outcomes.append(Outcome(kind, started, time.monotonic(), status, reply, error))
            if status != 200:
                time.sleep(0.05)  # back off like a real client (and leave CPU to the restart)

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)

    def wait_for(self, predicate: Callable[[Outcome], bool], count: int, timeout: float) -> float:
        """Wait until ``count`` outcomes satisfy ``predicate``; the time it happened."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            matching = [o for o in self.snapshot() if predicate(o)]
            if len(matching) >= count:
                return sorted(o.ended for o in matching)[count - 1]
            time.sleep(0.02)
        raise AssertionError(
            f"not {count} such outcomes in {timeout} s: {summary(self.snapshot())}"
        )


def summary(outcomes: list[Outcome]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for o in outcomes:
        key = f"{o.kind}:{o.status}:{o.error.split(':')[0]}" if o.error else f"{o.kind}:{o.status}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def assert_good_200(outcome: Outcome) -> None:
    """A 200 carries the right vectors: one 1,024-d (query) or 256-d unit vector."""
    doc = orjson.loads(outcome.body)
    (item,) = doc["data"]
    vector = np.asarray(item["embedding"], dtype=np.float64)
    assert vector.shape == ((256,) if outcome.kind == "dims" else (1024,)), outcome
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
    # Qwen3 instruction + query + EOS: never the bare query's handful of tokens.
    assert doc["usage"]["prompt_tokens"] > 20, doc["usage"]


def assert_fail_closed(outcome: Outcome) -> None:
    """A retryable 503 in the OpenAI envelope (what failure_mode_allow: false gives)."""
    assert outcome.status == 503 and not outcome.error, outcome
    assert envelope_error(outcome.body)["type"] == "server_error", outcome


def assert_upstream_saw_only_rewritten(upstream: FakeUpstream) -> int:
    """Every embeddings request the upstream got carries the instruction and no
    legacy-only field: nothing un-rewritten slipped through. Returns how many."""
    seen = [r for r in upstream.received if r.path == "/v1/embeddings"]
    for received in seen:
        assert received.json is not None
        assert all(str(text).startswith(INSTRUCTION) for text in received.json["input"]), received
        assert not {"input_type", "instruction", "dimensions"} & set(received.json), received
    return len(seen)


# -- 1. ext_proc SIGKILLed under load -------------------------------------------------------


@dataclass(frozen=True)
class Recovery:
    killed: float
    serving: float  # the processor serves again
    first_ok: float  # the first 200 through it after that
    note: str


def sigkill_serve(stack: Stack, load: Load) -> Recovery:
    """`extproc serve` alone: clients meet the dead processor until the test restarts it."""
    assert stack.serve is not None
    killed = time.monotonic()
    stack.serve.process.signal(signal.SIGKILL)
    stack.serve.process.popen.wait(5)
    # Let the clients meet the dead processor for a while.
    load.wait_for(lambda o: o.started > killed + 0.05, 2 * CLIENTS, timeout=10)
    time.sleep(0.5)
    restarted = time.monotonic()
    stack.start_serve()  # the SAME port
    serving = time.monotonic()
    first_ok = load.wait_for(
        lambda o: o.status == 200 and o.started > restarted, 1, timeout=RECONNECT_BOUND_S
    )
    return Recovery(
        killed,
        serving,
        first_ok,
        f"restart -> SERVING {serving - restarted:.2f} s, restart -> first 200 "
        f"{first_ok - restarted:.2f} s",
    )


def sigkill_worker(run: RunStack, load: Load) -> Recovery:
    """A worker of `extproc run --workers 2`: the launcher restarts it on its port, and
    Envoy sends it streams again once its health check passes."""
    pid, address = run.worker(1)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    deadline = killed + START_TIMEOUT_S
    while f"worker 1 serving again (pid {run.gateway.worker_pids()[1]})" not in run.gateway.log():
        assert time.monotonic() < deadline, run.gateway.log()
        time.sleep(0.02)
    serving = time.monotonic()
    before = run.gateway.streams_per_worker()[address]
    while run.gateway.streams_per_worker()[address] < before + CLIENTS:
        assert time.monotonic() < serving + RECONNECT_BOUND_S, "Envoy never used it again"
        time.sleep(0.02)
    first_ok = time.monotonic()
    assert run.gateway.worker_pids()[1] != pid
    return Recovery(
        killed, serving, first_ok, f"kill -> restarted worker serving {serving - killed:.2f} s"
    )


@pytest.fixture(params=[1, WORKERS], ids=["extproc-serve", f"run-{WORKERS}-workers"])
def sigkilled(
    request: pytest.FixtureRequest,
) -> tuple[int, str, FakeUpstream, Callable[[Load], Recovery]]:
    """(workers, url, upstream, kill-and-recover) of the stack under test."""
    if request.param == 1:
        stack: Stack = request.getfixturevalue("stack")
        return 1, stack.url, stack.upstream, lambda load: sigkill_serve(stack, load)
    run: RunStack = request.getfixturevalue("run_stack")
    return WORKERS, run.url, run.upstream, lambda load: sigkill_worker(run, load)


def test_extproc_sigkill_under_load_fails_closed_and_recovers(
    sigkilled: tuple[int, str, FakeUpstream, Callable[[Load], Recovery]],
) -> None:
    workers, url, upstream, kill_and_recover = sigkilled
    with Load(url) as load:
        load.wait_for(lambda o: o.status == 200, 2 * CLIENTS, timeout=30)
        recovery = kill_and_recover(load)
        load.wait_for(
            lambda o: o.status == 200 and o.started > recovery.first_ok, 2 * CLIENTS, timeout=10
        )
    outcomes = load.snapshot()
    failed = [o for o in outcomes if o.status != 200]
    print(
        f"\n[sigkill, {workers} worker(s)] outcomes {summary(outcomes)}; {recovery.note}; "
        f"SERVING seen -> first 200 {recovery.first_ok - recovery.serving:+.3f} s (health is "
        f"polled: <= 0 means at once), kill -> first 200 "
        f"{recovery.first_ok - recovery.killed:.2f} s; failures started up to "
        f"{max((o.started - recovery.killed for o in failed), default=0):+.3f} s after the kill"
    )
    if workers == 1:
        assert failed, "the kill did not reach any client: nothing was tested"
    else:
        # The other worker took the load at once: only streams already on the dead
        # one, or started in the instant before Envoy ejected it, failed.
        assert all(o.started < recovery.killed + EJECT_BOUND_S for o in failed), summary(failed)
    for outcome in failed:
        assert_fail_closed(outcome)  # 503 envelope, never a cut connection or another 5xx
    # Envoy fails a request on its processor's gRPC error until the server's OK has
    # arrived, even after the server's last reply: a request whose reply left in the
    # instant before the kill, but not the stream's end, has its 200 cut after the
    # headers (docs/envoy-facts.md). That is a transport error a client retries, never
    # a wrong body, and only for requests in flight at the kill.
    cut = [o for o in outcomes if o.status == 200 and o.error]
    assert all(o.started < recovery.killed for o in cut), summary(cut)
    assert len(cut) <= 2 * CLIENTS // 8, summary(cut)
    for outcome in outcomes:
        if outcome.status == 200 and not outcome.error:
            assert_good_200(outcome)
    assert assert_upstream_saw_only_rewritten(upstream) >= 4 * CLIENTS
    assert recovery.first_ok - recovery.serving < RECONNECT_BOUND_S
    # Recovered for good: everything after the first 200 is a 200 again.
    assert all(o.status == 200 for o in outcomes if o.started > recovery.first_ok), summary(
        outcomes
    )


# -- 2. Envoy killed and restarted under load ------------------------------------------------
# (before the SIGTERM case, which leaves the server stopped: one restart fewer)


def test_envoy_restart_under_load_keeps_the_extproc_server(stack: Stack) -> None:
    assert stack.serve is not None and stack.envoy is not None
    serve_pid = stack.serve.process.pid
    with Load(stack.url) as load:
        load.wait_for(lambda o: o.status == 200, 2 * CLIENTS, timeout=30)
        killed = time.monotonic()
        stack.envoy.process.signal(signal.SIGKILL)
        stack.envoy.process.popen.wait(5)
        load.wait_for(lambda o: o.started > killed + 0.05, CLIENTS, timeout=10)
        restarted = time.monotonic()
        envoy_ready_s = stack.start_envoy()  # the SAME listener and admin ports
        first_ok = load.wait_for(
            lambda o: o.status == 200 and o.started > restarted, 1, timeout=RECONNECT_BOUND_S
        )
        load.wait_for(lambda o: o.status == 200 and o.started > first_ok, 2 * CLIENTS, timeout=10)
    outcomes = load.snapshot()
    print(
        f"\n[envoy restart] outcomes {summary(outcomes)}; new Envoy ready in "
        f"{envoy_ready_s:.2f} s, kill -> first 200 {first_ok - killed:.2f} s"
    )
    # The ext_proc server was never restarted and serves the new Envoy's streams.
    assert stack.serve.process.pid == serve_pid and stack.serve.process.alive()
    assert health(stack.grpc_port) == "SERVING"
    assert all(o.status == 200 for o in outcomes if o.started > first_ok), summary(outcomes)
    for outcome in outcomes:
        if outcome.error:
            # No Envoy listening (refused), or the dying Envoy cut the connection, also
            # after a 200 status line (IncompleteRead): a client-visible failure to
            # retry, never a complete answer.
            continue
        if outcome.status == 200:
            assert_good_200(outcome)
        else:
            assert_fail_closed(outcome)
    assert assert_upstream_saw_only_rewritten(stack.upstream) >= 4 * CLIENTS
    log = stack.serve_log()
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]
    # Streams the dead Envoy left open were all closed on the server's side.
    metrics_url = f"{stack.serve.metrics_url}/metrics"
    deadline = time.monotonic() + 10
    while metric_value(http("GET", metrics_url).body.decode(), "extproc_active_streams") != 0:
        assert time.monotonic() < deadline, "ext_proc streams leaked after Envoy died"
        time.sleep(0.1)


# -- 3. ext_proc SIGTERMed under load -------------------------------------------------------


class HealthWatch:
    """A gRPC health Watch opened before the signal: it sees NOT_SERVING even though
    the draining server refuses new RPCs (a Check after SIGTERM cannot get through)."""

    def __init__(self, port: int) -> None:
        self.seen: list[tuple[float, str]] = []
        self._channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = health_pb2_grpc.HealthStub(self._channel)
        self._call = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for reply in self._call:
                name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                self.seen.append((time.monotonic(), str(name)))
        except grpc.RpcError as error:
            self.seen.append((time.monotonic(), f"rpc:{error.code().name}"))

    def wait_for(self, status: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, seen in list(self.seen):
                if seen == status:
                    return at
            time.sleep(0.01)
        raise AssertionError(f"health never said {status}: {self.seen}")

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(timeout=5)
        self._channel.close()


@dataclass(frozen=True)
class SigtermRun:
    in_flight: list[Outcome]  # sent before SIGTERM, reached the upstream before it
    late: Outcome  # sent after SIGTERM, during the drain
    watch: list[tuple[float, str]]
    check_during_drain: str
    termed: float
    not_serving: float
    exited: float
    exit_code: int
    drain_s: float  # "stopping" to "stopped" in the server's log


def _log_time(log: str, marker: str) -> float:
    (line,) = [line for line in log.splitlines() if marker in line]
    clock = line.split()[1]  # 2026-01-01 12:00:00,123 INFO ...
    hours, minutes, seconds = clock.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds.replace(",", "."))


def _log_seconds(log: str, start: str, end: str) -> float:
    return (_log_time(log, end) - _log_time(log, start)) % 86400  # across midnight too


SLOW_S = 1.0  # how long the in-flight requests wait for the upstream


@dataclass(frozen=True)
class SigtermTarget:
    """The processor to SIGTERM: its PID and port, how to wait for its exit (status,
    time), and the log whose "stopping:"/"stopped" lines time its drain."""

    pid: int
    port: int
    wait_exit: Callable[[float], tuple[int, float]]
    log: Callable[[], str]
    log_marker: str  # what starts the server's own log lines


@dataclass(frozen=True)
class SigtermStack:
    url: str
    upstream: FakeUpstream
    target: Callable[[], SigtermTarget]  # chosen once the requests are in flight


def serve_stack(stack: Stack) -> SigtermStack:
    stack.ensure_up()
    serve = stack.serve
    assert serve is not None

    def wait_exit(timeout_s: float) -> tuple[int, float]:
        code = serve.process.popen.wait(timeout_s)
        return code, time.monotonic()

    target = SigtermTarget(serve.process.pid, stack.grpc_port, wait_exit, stack.serve_log, "")
    return SigtermStack(stack.url, stack.upstream, lambda: target)


def worker_stack(run: RunStack) -> SigtermStack:
    """SIGTERM goes to the worker holding the most streams now (Envoy chose where)."""
    run.ensure_up()

    def target() -> SigtermTarget:
        addresses = run.gateway.extproc_addresses
        active = run.gateway.streams_per_worker("rq_active")
        busiest = max(addresses, key=lambda a: active.get(a, 0))
        assert active.get(busiest, 0) > 0, active
        index = 1 + addresses.index(busiest)
        pid, _ = run.worker(index)

        def wait_exit(timeout_s: float) -> tuple[int, float]:
            deadline = time.monotonic() + timeout_s
            exited = f"worker {index} (pid {pid}) exited with status "
            while exited not in run.gateway.log():
                assert time.monotonic() < deadline, f"worker pid {pid} did not exit"
                time.sleep(0.02)
            when = time.monotonic()
            status = run.gateway.log().split(exited, 1)[1].split()[0]
            return int(status), when

        port = int(busiest.rsplit(":", 1)[1])
        marker = f"worker {index}: extproc.service.server: "
        return SigtermTarget(pid, port, wait_exit, run.gateway.log, marker)

    return SigtermStack(run.url, run.upstream, target)


@pytest.fixture(
    scope="module", params=[1, WORKERS], ids=["extproc-serve", f"run-{WORKERS}-workers"]
)
def sigterm_run(request: pytest.FixtureRequest) -> SigtermRun:
    """One SIGTERM under load, shared by the tests that read it: ``CLIENTS`` requests
    are held by a slow upstream (so they are in flight: past the ext_proc request
    phase, waiting for their answer) when `extproc serve` (or the worker of `extproc
    run --workers 2` that holds most of them) gets SIGTERM."""
    if request.param == 1:
        stack = serve_stack(request.getfixturevalue("stack_once"))
    else:
        stack = worker_stack(request.getfixturevalue("run_stack_once"))
    stack.upstream.fault = "slow"
    stack.upstream.slow_seconds = SLOW_S
    in_flight: dict[int, Outcome] = {}

    def send(i: int) -> None:
        kind = "dims" if i % 2 else "query"
        started = time.monotonic()
        status, body, error = call(
            stack.url, query_body(f"in flight {i}?", 256 if kind == "dims" else None)
        )
        in_flight[i] = Outcome(kind, started, time.monotonic(), status, body, error)

    # The response rewrites first: their streams stay open on the server until the
    # upstream answers, so the target is chosen among the processors holding them.
    # Then the query-only ones.
    threads = []
    target: SigtermTarget | None = None
    for kind in (1, 0):
        for i in range(kind, CLIENTS, 2):
            threads.append(threading.Thread(target=send, args=(i,)))
            threads[-1].start()
        deadline = time.monotonic() + 10
        while len(stack.upstream.received) < len(threads):
            assert time.monotonic() < deadline, "the requests did not reach the upstream"
            time.sleep(0.005)
        target = target or stack.target()
    assert target is not None
    watch = HealthWatch(target.port)
    try:
        watch.wait_for("SERVING", timeout=5)
        termed = time.monotonic()
        os.kill(target.pid, signal.SIGTERM)
        not_serving = watch.wait_for("NOT_SERVING", timeout=2)
        check_during_drain = health(target.port)
        watch.close()  # an open Watch is an RPC in flight too: it would hold the drain
        late_started = time.monotonic()
        late = Outcome("query", late_started, 0.0, *call(stack.url, query_body("late?"), 10))
        for thread in threads:
            thread.join(timeout=SLOW_S + 10)
        exit_code, exited = target.wait_exit(GRACE_S + 5)
    finally:
        watch.close()
    log = target.log()
    run = SigtermRun(
        in_flight=[in_flight[i] for i in sorted(in_flight)],
        late=late,
        watch=watch.seen,
        check_during_drain=check_during_drain,
        termed=termed,
        not_serving=not_serving,
        exited=exited,
        exit_code=exit_code,
        drain_s=_log_seconds(log, f"{target.log_marker}stopping:", f"{target.log_marker}stopped"),
    )
    print(
        f"\n[sigterm, {request.param} worker(s)] in flight {summary(run.in_flight)}, late "
        f"{run.late.status}; health watch NOT_SERVING after {not_serving - termed:.3f} s "
        f"(Check during the drain: {check_during_drain}); drain {run.drain_s:.2f} s; exit "
        f"{exit_code} after {exited - termed:.2f} s (grace {GRACE_S:g} s, upstream holds "
        f"requests {SLOW_S:g} s)"
    )
    assert_upstream_saw_only_rewritten(stack.upstream)
    stack.upstream.reset()
    return run


def test_extproc_sigterm_drains_in_flight_requests(sigterm_run: SigtermRun) -> None:
    run = sigterm_run
    # Health turns NOT_SERVING at once (seen on a Watch opened before the signal; a
    # new Check is refused while the server drains, which a prober reads as not ready).
    assert run.not_serving - run.termed < 1.0, run.watch
    assert run.check_during_drain in ("NOT_SERVING", "UNAVAILABLE")
    # No client error at all for the requests already in flight whose response needs
    # no ext_proc (query-only: the request phase was done before SIGTERM). Their
    # ext_proc stream stays open until the exchange ends, so the drain waits for them.
    queries = [o for o in run.in_flight if o.kind == "query"]
    assert len(queries) == CLIENTS // 2
    for outcome in queries:
        assert outcome.status == 200 and not outcome.error, outcome
        assert_good_200(outcome)
    # It exited only once they had their answers (however long they still had to go
    # when the signal came: that depends on how busy the machine is).
    last = max(o.ended for o in queries)
    assert run.exited >= last, "the server did not wait for its in-flight streams"
    # Exits by itself, within the grace period.
    assert run.exit_code == 0
    assert run.drain_s < GRACE_S
    assert run.exited - run.termed < GRACE_S
    # A NEW request after SIGTERM, while in-flight streams keep the server draining,
    # is still processed (the server keeps accepting streams until none is open) or,
    # once it has stopped, fails closed (503 envelope). Either way never forwarded
    # without its instruction. With several `extproc serve` endpoints
    # (tests/test_scale_out.py) Envoy sends new streams to the others.
    if run.late.status == 200:
        assert_good_200(run.late)
    else:
        assert_fail_closed(run.late)


def test_extproc_sigterm_in_flight_response_rewrites_finish(sigterm_run: SigtermRun) -> None:
    dims = [o for o in sigterm_run.in_flight if o.kind == "dims"]
    assert len(dims) == CLIENTS // 2
    for outcome in dims:
        # Whatever happens, never a 200 with bad vectors: a failure is a 503 envelope.
        if outcome.status != 200:
            assert_fail_closed(outcome)
    for outcome in dims:
        assert outcome.status == 200 and not outcome.error, outcome
        assert_good_200(outcome)
