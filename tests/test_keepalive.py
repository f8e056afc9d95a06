"""HTTP/1.1 keep-alive through a real Envoy and the real ext_proc server (both shipped
Envoy shapes): an answer the gateway gives itself after reading the request whole
keeps the client's connection, as an upstream's 4xx does; an answer given before the
body was read whole (413 over the buffer limit) closes it.

Each check uses ONE raw socket, so a silent reconnect (as http.client does) cannot
hide a closed connection."""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import brotli
import orjson
import pytest

from extproc.core.policy import GatewayPolicy
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import SHAPES, Gateway, GatewaySpec
from testing_support.qwen import QWEN_MODEL
from tests.harness import Gateways

ANSWER_TIMEOUT_S = 30.0
# Envoy closes a connection it has marked for closing 1 s after the answer
# (delayed_close_timeout); generous for two shared cores.
CLOSE_BOUND_S = 5.0
GOOD_BODY = orjson.dumps({"model": QWEN_MODEL, "input": "hello"})


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


class OneConnection:
    """One HTTP/1.1 connection to 127.0.0.1; every read is bounded in time."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=ANSWER_TIMEOUT_S)
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, method: str, path: str, body: bytes, content_type: str) -> None:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.sock.sendall(head + body)

    def _fill(self) -> bool:
        chunk = self.sock.recv(1 << 16)
        self.buffer += chunk
        return bool(chunk)

    def answer(self) -> Answer:
        while b"\r\n\r\n" not in self.buffer:
            assert self._fill(), f"connection closed before an answer: {self.buffer[:200]!r}"
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        size = int(headers["content-length"])
        while len(self.buffer) < size:
            assert self._fill(), "connection closed in the middle of a body"
        body, self.buffer = self.buffer[:size], self.buffer[size:]
        return Answer(int(status_line.split()[1]), headers, body)

    def closed_within(self, seconds: float) -> bool:
        """True when the peer closes (EOF or reset) within ``seconds``."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            self.sock.settimeout(remaining)
            try:
                if not self.sock.recv(1 << 16):
                    return True
            except TimeoutError:
                return False
            except ConnectionResetError:
                return True
        return False

    def send_coded(self, body: bytes, coding: str) -> None:
        head = (
            f"POST /v1/embeddings HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
            f"Content-Encoding: {coding}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.sock.sendall(head + body)

    def request(self, body: bytes, content_type: str = "application/json") -> Answer:
        self.send("POST", "/v1/embeddings", body, content_type)
        return self.answer()


@dataclass(frozen=True)
class Served:
    gateway: Gateway
    upstream: FakeUpstream
    shape: str  # the Envoy template: standalone, single-filter


@pytest.fixture(scope="module", params=SHAPES)
def served(request: pytest.FixtureRequest, fake_dynamo: FakeUpstream, gateways: Gateways) -> Served:
    """The Dynamo fake and `extproc run` in front of it, for each shipped Envoy shape."""
    gateway = gateways.shared(GatewaySpec(fake_dynamo.url, shape=request.param))
    return Served(gateway, fake_dynamo, request.param)


@pytest.fixture
def upstream(served: Served) -> FakeUpstream:
    served.upstream.reset()
    return served.upstream


@pytest.fixture
def connection(served: Served) -> Iterator[OneConnection]:
    conn = OneConnection(served.gateway.url)
    yield conn
    conn.close()


def test_a_gateway_400_then_a_200_on_one_connection(
    connection: OneConnection, upstream: FakeUpstream
) -> None:
    rejected = connection.request(b"{not json")
    assert rejected.status == 400, rejected
    assert orjson.loads(rejected.body)["error"]["code"] == "invalid_json"
    assert rejected.headers.get("connection") != "close", rejected.headers
    served = connection.request(GOOD_BODY)
    assert served.status == 200, served
    assert len(orjson.loads(served.body)["data"]) == 1
    # Only the good request reached the upstream.
    assert len(upstream.received) == 1


def test_every_kind_of_gateway_answer_keeps_the_connection(
    connection: OneConnection, upstream: FakeUpstream
) -> None:
    """400 (bad field, empty body), 404 (unknown model), 405, 415: all read whole."""
    cases: list[tuple[str, bytes, str, int]] = [
        (
            "POST",
            orjson.dumps({"model": QWEN_MODEL, "input": "x", "dimensions": 3}),
            "application/json",
            400,
        ),
        ("POST", b"", "application/json", 400),
        ("POST", orjson.dumps({"model": "nope", "input": "x"}), "application/json", 404),
        ("GET", b"", "application/json", 405),
        ("POST", GOOD_BODY, "text/plain", 415),
    ]
    for method, body, content_type, status in cases:
        connection.send(method, "/v1/embeddings", body, content_type)
        answer = connection.answer()
        assert answer.status == status, (method, body, answer)
        assert answer.headers.get("connection") != "close", (status, answer.headers)
    assert connection.request(GOOD_BODY).status == 200
    assert len(upstream.received) == 1


def test_a_chunked_body_over_the_limit_is_a_413(
    connection: OneConnection, upstream: FakeUpstream, served: Served
) -> None:
    """Over the policy's max_request_bytes, chunked: no declared length to judge by.
    single-filter.yaml buffers a request body up to its listener limit (sized for
    the largest response), so the gateway reads it whole, then answers 413 and keeps
    the connection. standalone.yaml takes a body of unknown length on its route that
    admits the request headers first, and buffers it only up to max_request_bytes
    (the route's request_body_buffer_limit), so such a body never reaches the
    server: Envoy answers 413 before it is whole, and closes the connection. (With a
    Content-Length over the limit, both answer from the request headers.)"""
    body = orjson.dumps({"model": QWEN_MODEL, "input": "x" * (9 * 1024 * 1024)})

    def write() -> None:
        # standalone.yaml: Envoy stops reading once it has answered.
        with contextlib.suppress(OSError):
            connection.sock.sendall(
                b"POST /v1/embeddings HTTP/1.1\r\nHost: gateway\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            )

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    answer = connection.answer()
    assert answer.status == 413, answer
    assert orjson.loads(answer.body)["error"]["code"] == "request_too_large"
    if served.shape == "single-filter":
        writer.join(ANSWER_TIMEOUT_S)
        assert answer.headers.get("connection") != "close", answer.headers
        assert connection.request(GOOD_BODY).status == 200
        assert len(upstream.received) == 1
    else:
        assert answer.headers.get("connection") == "close", answer.headers
        assert connection.closed_within(CLOSE_BOUND_S)
        writer.join(ANSWER_TIMEOUT_S)
        assert upstream.received == []


def test_a_413_before_the_body_was_read_whole_closes(
    connection: OneConnection, upstream: FakeUpstream, qwen_policy: GatewayPolicy
) -> None:
    """A body declared bigger than Envoy's buffer, of which only a part past that
    limit is ever sent: the answer (Envoy's 413, or the gateway's from the declared
    length) necessarily comes before the body is whole, and the connection closes:
    nobody knows where a next request would start."""
    declared = qwen_policy.max_response_bytes() + 8 * 2**20
    sent = qwen_policy.max_response_bytes() + 2 * 2**20
    head = (
        "POST /v1/embeddings HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        f"Content-Length: {declared}\r\n\r\n"
    ).encode()

    def write() -> None:
        # Envoy stops reading once it has answered: the write may block, then break.
        with contextlib.suppress(OSError):
            connection.sock.sendall(head + b'{"input": "' + b"x" * sent)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    answer = connection.answer()
    assert answer.status == 413, answer
    assert orjson.loads(answer.body)["error"]["code"] == "request_too_large"
    assert answer.headers.get("connection") == "close", answer
    assert connection.closed_within(CLOSE_BOUND_S)
    writer.join(ANSWER_TIMEOUT_S)
    assert upstream.received == []


def test_answers_to_compressed_bodies_keep_the_connection(
    served: Served, connection: OneConnection, upstream: FakeUpstream
) -> None:
    """standalone.yaml reads a compressed body whole before it answers (request_coding),
    decoded or not; single-filter.yaml answers 415 from the request headers, and Envoy
    still reads the (small) body: either way the next request gets its answer on the
    same connection."""
    decoded = served.shape == "standalone"
    bomb = gzip.compress(b" " * (16 << 20))
    cases: list[tuple[bytes, str, int, str | None]] = [
        (gzip.compress(GOOD_BODY), "gzip", 200, None),
        (brotli.compress(GOOD_BODY), "br", 200, None),
        (GOOD_BODY, "gzip", 400, "invalid_compressed_body"),  # not gzip at all
        (gzip.compress(GOOD_BODY)[:-12], "gzip", 400, "invalid_compressed_body"),
        (bomb, "gzip", 413, "request_too_large"),
        (b"\0" * 1_400_000, "gzip", 413, "request_too_large"),  # over 1.25 MiB as sent
        (GOOD_BODY, "deflate", 415, "unsupported_content_encoding"),
        (GOOD_BODY, "gzip, br", 415, "unsupported_content_encoding"),
    ]
    for body, coding, decoded_status, decoded_code in cases:
        status, code = decoded_status, decoded_code
        if not decoded and coding in ("gzip", "br"):
            status, code = 415, "unsupported_content_encoding"
        connection.send_coded(body, coding)
        answer = connection.answer()
        assert answer.status == status, (coding, answer)
        if code is not None:
            assert orjson.loads(answer.body)["error"]["code"] == code, answer
        assert answer.headers.get("connection") != "close", (coding, answer.headers)
        assert connection.request(GOOD_BODY).status == 200, coding
