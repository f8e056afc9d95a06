"""The hostile-input corpus (tests/hostile_corpus.py) through a real Envoy and the
real ext_proc server (`extproc run`), in front of testing_support/fake_upstream.py.

Every request is written byte for byte on a loopback socket by a small bounded
HTTP/1.1 client (no HTTP library would send the framing lies). For each case:
the documented status and OpenAI envelope (or a 200 for the valid-but-hostile
ones), no traceback or exception name in the answer, and nothing at the upstream
unless the request was valid. Then the gateway must still be healthy: a good
request gets a 200 after the whole corpus has been thrown at it concurrently, its
log has no traceback and its metrics count no internal error.

One gateway per Envoy shape (standalone.yaml, what `extproc run` uses, and
single-filter.yaml, what the meshes use) serves the whole module. A second one per
shape, whose Envoy gives up on an unfinished request body after 2 s instead of the
shipped 60 s, shows that such a request ends in a bounded 408 envelope.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
import yaml

from extproc.core.api_errors import MAX_MESSAGE_CHARS
from testing_support.fake_upstream import FakeUpstream, Received
from testing_support.gateway import Gateway, GatewaySpec
from testing_support.http import envelope_error, http, metric_value
from testing_support.qwen import QWEN_MODEL, REPO
from tests.harness import Gateways
from tests.hostile_corpus import (
    ACCEPTED,
    BODY_NEVER_ENDS,
    CORPUS,
    FRAMING_ERRORS,
    REFUSED,
    SHAPES,
    HostileRequest,
    Outcome,
)

NATIVE_DIMENSIONS = 1024
QWEN_EOS = 151643
# Generous: an 8 MB body is parsed and its head tokenized in ~0.2 s, but other test
# processes share these two cores.
OVERLOADED_RETRIES = 20
ANSWER_TIMEOUT_S = 60.0
# Envoy closes a connection it refused 1 s after its answer (delayed_close_timeout).
FRAMING_CLOSE_BOUND_S = 5.0
# How long a request whose body never ends is watched under the shipped timeouts.
HELD_FOR_S = 1.5
# request_timeout of the impatient gateway's Envoy, and how late its 408 may be.
IMPATIENT_TIMEOUT_S = 2
TIMEOUT_SLACK_S = 8.0
# What a leaked stack trace or exception looks like in an answer.
LEAK = re.compile(
    rb"Traceback|File \"|\.py\b|line \d+, in |\b[A-Z][A-Za-z]*(?:Error|Exception)\b|site-packages"
)


# -- a bounded raw HTTP/1.1 client --------------------------------------------------


@dataclass(frozen=True)
class WireReply:
    """What came back on one connection. ``status`` is None when the connection
    closed (or the wait ended) before a status line; ``complete`` says whether the
    whole declared body arrived."""

    status: int | None
    headers: dict[str, str]
    body: bytes
    complete: bool
    seconds: float

    def envelope(self) -> dict[str, Any]:
        assert self.complete, f"incomplete answer: {self}"
        assert self.headers.get("content-type", "").startswith("application/json"), self
        error = envelope_error(self.body)
        assert len(error["message"]) <= MAX_MESSAGE_CHARS, len(error["message"])
        return error


class _Connection:
    """One loopback connection; every read ends by ``deadline`` (monotonic)."""

    def __init__(self, port: int, deadline: float) -> None:
        self.deadline = deadline
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5.0)
        self.buffer = b""
        self.eof = False

    def send(self, data: bytes) -> None:
        self.sock.settimeout(max(0.1, self.deadline - time.monotonic()))
        # Envoy may answer and close before taking it all (413): then read that answer.
        with contextlib.suppress(OSError):
            self.sock.sendall(data)

    def fill(self) -> bool:
        """Read more bytes; False at EOF, at a reset or when the deadline passed."""
        remaining = self.deadline - time.monotonic()
        if self.eof or remaining <= 0:
            return False
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(1 << 20)
        except (TimeoutError, ConnectionResetError):
            return False
        if not chunk:
            self.eof = True
            return False
        self.buffer += chunk
        return True

    def take_until(self, marker: bytes) -> bytes | None:
        while marker not in self.buffer:
            if not self.fill():
                return None
        head, _, self.buffer = self.buffer.partition(marker)
        return head

    def take(self, size: int) -> bytes | None:
        while len(self.buffer) < size:
            if not self.fill():
                return None
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def close(self) -> None:
        self.sock.close()


def _read_chunked(conn: _Connection) -> tuple[bytes, bool]:
    body = b""
    while True:
        size_line = conn.take_until(b"\r\n")
        if size_line is None:
            return body, False
        size = int(size_line.split(b";", 1)[0], 16)
        if size == 0:
            return body, conn.take_until(b"\r\n") is not None
        chunk = conn.take(size + 2)
        if chunk is None:
            return body, False
        body += chunk[:-2]


def exchange(port: int, wire: bytes, *, timeout: float = ANSWER_TIMEOUT_S) -> WireReply:
    """Send ``wire``, read one answer (bounded by ``timeout`` in all)."""
    started = time.monotonic()
    conn = _Connection(port, started + timeout)
    try:
        conn.send(wire)
        head = conn.take_until(b"\r\n\r\n")
        if head is None:
            return WireReply(None, {}, conn.buffer, False, time.monotonic() - started)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            data = conn.take(int(headers["content-length"]))
            body, complete = (data, True) if data is not None else (conn.buffer, False)
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body, complete = _read_chunked(conn)
        else:  # delimited by the close
            while conn.fill():
                pass
            body, complete = conn.buffer, conn.eof
        return WireReply(status, headers, body, complete, time.monotonic() - started)
    finally:
        conn.close()


def closes_within(port: int, wire: bytes, seconds: float) -> tuple[WireReply, bool]:
    """Send ``wire`` and read until the server closes; (what came, whether it closed)."""
    started = time.monotonic()
    conn = _Connection(port, started + seconds)
    try:
        conn.send(wire)
        while conn.fill():
            pass
        raw = conn.buffer
        status: int | None = None
        if raw.startswith(b"HTTP/1.1 "):
            status = int(raw.split(b" ", 2)[1])
        head, _, body = raw.partition(b"\r\n\r\n")
        headers = {}
        for line in head.decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        reply = WireReply(status, headers, body, False, time.monotonic() - started)
        return reply, conn.eof
    finally:
        conn.close()


def assert_no_leak(data: bytes) -> None:
    found = LEAK.search(data)
    assert found is None, f"internals leaked: {found.group(0)!r} in {data[:300]!r}"


# -- fixtures -------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def clean_upstream(upstream: FakeUpstream) -> None:
    upstream.reset()


@pytest.fixture(scope="module", params=sorted(SHAPES))
def shape(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def gateway(shape: str, upstream: FakeUpstream, gateways: Gateways) -> Gateway:
    gw = gateways.shared(GatewaySpec(upstream.url, shape=shape))
    gw.extra["module_log"] = gw.log_mark()  # what this module's requests make it log
    return gw


@pytest.fixture(scope="module")
def impatient_gateway(
    shape: str, upstream: FakeUpstream, gateways: Gateways, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """The shipped shape with one change: Envoy's request_timeout is 2 s, not 60 s."""
    folder = tmp_path_factory.mktemp(f"impatient-{shape}")
    config = yaml.safe_load((REPO / "envoy" / f"{shape}.yaml").read_text(encoding="utf-8"))
    (listener,) = config["static_resources"]["listeners"]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    manager["request_timeout"] = f"{IMPATIENT_TIMEOUT_S}s"
    template = folder / f"{shape}-impatient.yaml"
    template.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    with gateways.own(GatewaySpec(upstream.url, shape=template), folder=folder) as gw:
        yield gw


# What the upstream must get for the long valid inputs: the legacy server's
# truncation (first 1,023 tokens + EOS for text; the first 1,024 of bare ids).
CUT_TO_THE_LIMIT: dict[str, Callable[[FakeUpstream], list[list[int]]]] = {
    "huge-text-near-the-body-limit": lambda up: [up.tokenize("ab " * 2000)[:1023] + [QWEN_EOS]],
    "flat-token-ids-past-max-inputs": lambda _: [list(range(1000, 2024))],
}


# The legacy profile's lax reading: what the upstream gets instead of the client's value.
CONVERTED: dict[str, tuple[str, Any]] = {
    "utf8-bom-first": ("input", "hello"),
    "input-bool-token-id": ("input", [1]),
    "truncate-string": ("truncate_prompt_tokens", 8),
    "truncate-bool": ("truncate_prompt_tokens", 1),
}


def _ids(cases: list[HostileRequest]) -> list[str]:
    return [case.name for case in cases]


# -- the corpus -----------------------------------------------------------------------


@pytest.mark.parametrize("case", REFUSED, ids=_ids(REFUSED))
def test_refused_with_the_documented_envelope(
    case: HostileRequest, gateway: Gateway, upstream: FakeUpstream
) -> None:
    reply = exchange(gateway.port, case.wire())
    assert reply.status == case.expected.status, reply
    error = reply.envelope()
    assert (error["type"], error["param"], error["code"]) == (
        case.expected.type,
        case.expected.param,
        case.expected.code,
    ), error
    assert_no_leak(reply.body)
    assert upstream.received == []


@pytest.mark.parametrize("case", ACCEPTED, ids=_ids(ACCEPTED))
def test_valid_hostile_request_is_answered(
    case: HostileRequest, gateway: Gateway, upstream: FakeUpstream
) -> None:
    reply = exchange(gateway.port, case.wire())
    assert reply.status == 200, reply
    assert reply.complete
    doc = orjson.loads(reply.body)
    assert [item["index"] for item in doc["data"]] == list(range(case.inputs))
    for item in doc["data"]:
        assert len(item["embedding"]) == (case.dimensions or NATIVE_DIMENSIONS)
    (received,) = upstream.received
    if case.forwarded_as_sent:
        assert received.body == case.body  # de-chunked by the fake when chunked
        return
    assert isinstance(received.json, dict) and received.json["model"] == QWEN_MODEL
    assert not {"input_type", "instruction", "dimensions"} & set(received.json)
    if case.name in CUT_TO_THE_LIMIT:
        assert received.json["input"] == CUT_TO_THE_LIMIT[case.name](upstream)
    if case.name in CONVERTED:  # the converted value, never the client's spelling
        field, value = CONVERTED[case.name]
        assert received.json[field] == value and type(received.json[field]) is type(value)


@pytest.mark.parametrize("case", FRAMING_ERRORS, ids=_ids(FRAMING_ERRORS))
def test_framing_error_is_refused_by_envoy(
    case: HostileRequest, shape: str, gateway: Gateway, upstream: FakeUpstream
) -> None:
    if shape in case.enveloped_in:
        reply = exchange(gateway.port, case.wire())
        assert reply.status == case.expected.status, reply
        error = reply.envelope()
        # The client's mistake: a client error code, never a 5xx mapper's.
        assert (error["type"], error["code"]) == (case.expected.type, case.expected.code), error
        assert_no_leak(reply.body)
    else:
        # Envoy's codec refuses these before there is a request: at most a status
        # line (no body), then the connection closes (see hostile_corpus.py).
        reply, closed = closes_within(gateway.port, case.wire(), FRAMING_CLOSE_BOUND_S)
        assert closed, f"connection still open after {FRAMING_CLOSE_BOUND_S} s: {reply}"
        assert reply.status in (None, case.expected.status), reply
        assert_no_leak(reply.body)
    assert upstream.received == []


@dataclass(frozen=True)
class Unfinished:
    """Every request whose body never ends, sent at once (each on its connection): what
    came back on each by case, and what reached the upstream meanwhile."""

    replies: dict[str, WireReply]
    forwarded: list[Received]


def send_unfinished(port: int, upstream: FakeUpstream, timeout: float) -> Unfinished:
    upstream.reset()
    with ThreadPoolExecutor(len(BODY_NEVER_ENDS)) as pool:
        replies = list(
            pool.map(lambda c: exchange(port, c.wire(), timeout=timeout), BODY_NEVER_ENDS)
        )
    by_case = {case.name: reply for case, reply in zip(BODY_NEVER_ENDS, replies, strict=True)}
    return Unfinished(by_case, list(upstream.received))


@pytest.fixture(scope="module")
def held(gateway: Gateway, upstream: FakeUpstream) -> Unfinished:
    return send_unfinished(gateway.port, upstream, HELD_FOR_S)


@pytest.fixture(scope="module")
def timed_out(impatient_gateway: Gateway, upstream: FakeUpstream) -> Unfinished:
    return send_unfinished(impatient_gateway.port, upstream, IMPATIENT_TIMEOUT_S + TIMEOUT_SLACK_S)


@pytest.mark.parametrize("case", BODY_NEVER_ENDS, ids=_ids(BODY_NEVER_ENDS))
def test_unfinished_body_is_held_not_forwarded(case: HostileRequest, held: Unfinished) -> None:
    """Shipped timeouts: Envoy waits for the rest of the body (up to its 60 s
    request_timeout); meanwhile nothing is forwarded and nothing is answered."""
    reply = held.replies[case.name]
    assert reply.status is None and reply.body == b"", reply
    assert held.forwarded == []


@pytest.mark.parametrize("case", BODY_NEVER_ENDS, ids=_ids(BODY_NEVER_ENDS))
def test_unfinished_body_ends_in_a_bounded_408(case: HostileRequest, timed_out: Unfinished) -> None:
    reply = timed_out.replies[case.name]
    assert reply.status == case.expected.status == 408, reply
    assert reply.seconds >= IMPATIENT_TIMEOUT_S - 0.5, reply
    error = reply.envelope()
    assert error["type"] == case.expected.type
    assert_no_leak(reply.body)
    assert timed_out.forwarded == []


# -- and after all of it ----------------------------------------------------------------


def test_gateway_survives_the_whole_corpus(gateway: Gateway, upstream: FakeUpstream) -> None:
    """All of it again, four at a time; then a good request, a clean log, no
    internal error counted. Only the valid requests may have reached the upstream.
    Four 8 MB bodies at once can fill the admission budget: the one that does not fit
    gets a 503 `overloaded` with Retry-After and is sent again after it, as a client
    would, until it gets its answer."""
    port = gateway.port
    cases = [case for case in CORPUS if case.outcome is not Outcome.BODY_NEVER_ENDS]

    def send(case: HostileRequest) -> tuple[str, int | None]:
        if case.outcome is Outcome.FRAMING_ERROR:
            reply, _ = closes_within(port, case.wire(), FRAMING_CLOSE_BOUND_S)
        else:
            reply = exchange(port, case.wire())
            for _ in range(OVERLOADED_RETRIES):
                if reply.status != 503 or reply.envelope()["code"] != "overloaded":
                    break
                time.sleep(float(reply.headers["retry-after"]))
                reply = exchange(port, case.wire())
        assert_no_leak(reply.body)
        return case.name, reply.status

    with ThreadPoolExecutor(4) as pool:
        statuses = dict(pool.map(send, cases))
    server_errors = {name: s for name, s in statuses.items() if s is not None and s >= 500}
    assert server_errors == {}
    unexpected = {
        case.name: statuses[case.name]
        for case in cases
        if case.outcome in (Outcome.REFUSED, Outcome.ANSWERED)
        and statuses[case.name] != case.expected.status
    }
    assert unexpected == {}  # the same answers as one at a time
    answered = [case.name for case in cases if case.outcome is Outcome.ANSWERED]
    assert len(upstream.received) == len(answered)

    upstream.reset()
    good = http(
        "POST", f"{gateway.url}/v1/embeddings", {"model": QWEN_MODEL, "input": "still here?"}
    )
    assert good.status == 200, good.body
    assert len(upstream.received) == 1

    log = gateway.log(since=gateway.extra["module_log"])
    assert "Traceback" not in log, log[-3000:]
    assert re.search(r" (ERROR|CRITICAL) |\[envoy\]\[(error|critical)\]", log) is None, log[-3000:]
    metrics = gateway.metrics()
    assert metric_value(metrics, "extproc_stream_anomalies_total", message="internal_error") == 0
    assert metric_value(metrics, "extproc_requests_total", outcome="rejected") > 0


# -- path spellings and bodyless requests (formerly known gaps, fixed in envoy/*.yaml) --------

GOOD_BODY = orjson.dumps({"model": QWEN_MODEL, "input": "What is the capital city of France?"})


def _post(path: str, body: bytes, *, headers: str = "Content-Type: application/json\r\n") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: gw\r\n{headers}Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("latin-1") + body


@pytest.mark.parametrize(
    "path", ["//v1/embeddings", "/v1/./embeddings", "/v1/%65mbeddings", "/v1//embeddings"]
)
def test_other_spellings_of_the_path_are_validated(
    path: str, gateway: Gateway, upstream: FakeUpstream
) -> None:
    """normalize_path + merge_slashes: every spelling reaches the embeddings route, so a
    bad body is refused by the gateway and a good one is rewritten like any other."""
    bad = exchange(gateway.port, _post(path, b'{"model": 5, "input": "x"}'))
    assert bad.status == 400, bad
    assert bad.envelope()["param"] == "model"
    assert upstream.received == []
    good = exchange(
        gateway.port,
        _post(path, orjson.dumps({**orjson.loads(GOOD_BODY), "input_type": "query"})),
    )
    assert good.status == 200, good
    (received,) = upstream.received
    assert received.path == "/v1/embeddings"
    assert b"Instruct: " in received.body


@pytest.mark.parametrize("path", ["/v1/embeddings/", "/v1/embeddings/x", "/v1/embeddings//"])
def test_paths_below_the_endpoint_are_404(
    path: str, gateway: Gateway, upstream: FakeUpstream
) -> None:
    reply = exchange(gateway.port, _post(path, GOOD_BODY))
    assert reply.status == 404, reply
    assert reply.envelope()["code"] == "unknown_url"
    assert upstream.received == []


@pytest.mark.parametrize(
    "head",
    [
        pytest.param("Content-Length: 00\r\n", id="content-length-00"),
        pytest.param("Content-Length: 0\r\n", id="content-length-0"),
    ],
)
def test_bodyless_post_is_400(head: str, gateway: Gateway, upstream: FakeUpstream) -> None:
    wire = (
        "POST /v1/embeddings HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        f"{head}Connection: close\r\n\r\n"
    ).encode("latin-1")
    reply = exchange(gateway.port, wire)
    assert reply.status == 400, reply
    assert reply.envelope()["type"] == "invalid_request_error"
    assert upstream.received == []


def test_bodyless_post_without_content_length(gateway: Gateway, upstream: FakeUpstream) -> None:
    """HTTP/1.1 POST with neither Content-Length nor Transfer-Encoding: an empty body.
    The server sees the request headers (end of stream) and answers 400 itself:
    single-filter.yaml always sends them, standalone.yaml on its route for bodies of
    unknown length (which no route could otherwise tell from an HTTP/2 request that
    streams a body without a length)."""
    wire = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\n\r\n"
    )
    reply = exchange(gateway.port, wire)
    assert reply.status == 400, reply
    assert reply.envelope()["type"] == "invalid_request_error"
    assert upstream.received == []


def test_body_without_content_type_reaches_the_upstream_as_json(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    reply = exchange(gateway.port, _post("/v1/embeddings", GOOD_BODY, headers=""))
    assert reply.status == 200, reply
    (received,) = upstream.received
    assert received.headers.get("content-type") == "application/json"
