"""Split migration through a real Envoy and the real ext_proc server (`extproc run
--upstream DYNAMO --legacy LEGACY`, both shipped Envoy shapes): POST /v1/embeddings
still goes through the contract to the Dynamo fake; every other request reaches a
legacy stand-in exactly as the client sent it (method, path and query, headers, body
byte for byte, streamed), and the stand-in's answers (2xx, 4xx, 5xx, chunked and
streamed) come back unchanged.

Measured here (printed with `pytest -s`): the bytes compared on the legacy route and
the time of a few-MB multipart upload through the gateway against the same upload
sent to the stand-in directly."""

from __future__ import annotations

import hashlib
import http.client
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import orjson
import pytest
import yaml

from extproc.core.policy import GatewayPolicy
from extproc.runtime.envoy_config import (
    LEGACY_CLUSTER,
    EnvoySettings,
    Upstream,
    load_template,
    render,
    with_legacy,
)
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import SHAPES, Gateway, GatewaySpec
from testing_support.processes import free_port
from testing_support.qwen import QWEN_MODEL, REPO
from tests.harness import Gateways
from tests.legacy_stand_in import (
    LEGACY_422,
    LEGACY_500,
    STREAM_CHUNKS,
    WAIT_S,
    LegacyStandIn,
)

UPLOAD_BYTES = 6 * 1024 * 1024
QUERY = "What is the capital city of France?"


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


def send(
    base_url: str,
    method: str,
    target: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
    try:
        conn.request(method, target, body=body, headers=headers or {})
        reply = conn.getresponse()
        return Response(reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read())
    finally:
        conn.close()


def multipart_audio(size: int) -> tuple[bytes, str]:
    boundary = "----legacy-audio-" + os.urandom(8).hex()
    audio = os.urandom(size)
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-large\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="speech.wav"\r\n'
            f"Content-Type: audio/wav\r\n\r\n"
        ).encode()
        + audio
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


# -- fixtures ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dynamo(upstream: FakeUpstream) -> FakeUpstream:
    return upstream


@pytest.fixture(scope="module", params=SHAPES)
def gateway(
    request: pytest.FixtureRequest, dynamo: FakeUpstream, legacy: LegacyStandIn, gateways: Gateways
) -> Gateway:
    return gateways.shared(GatewaySpec(dynamo.url, shape=request.param, legacy=legacy.url))


@pytest.fixture(autouse=True)
def clean(dynamo: FakeUpstream, legacy: LegacyStandIn) -> None:
    dynamo.reset()
    legacy.reset()


# -- embeddings stay on the contract -------------------------------------------------


def test_ready_line_names_both_servers(
    gateway: Gateway, dynamo: FakeUpstream, legacy: LegacyStandIn
) -> None:
    assert f"-> {dynamo.url}, every other path -> {legacy.url}" in gateway.ready_line


@pytest.mark.parametrize(
    "target", ["/v1/embeddings", "/v1/embeddings?api-version=1", "//v1/./embeddings"]
)
def test_embeddings_are_rewritten_and_reach_dynamo_only(
    gateway: Gateway, dynamo: FakeUpstream, legacy: LegacyStandIn, target: str
) -> None:
    body = orjson.dumps(
        {"model": QWEN_MODEL, "input": QUERY, "input_type": "query", "dimensions": 256}
    )
    reply = send(gateway.url, "POST", target, body, {"content-type": "application/json"})
    assert reply.status == 200, reply.body
    assert len(orjson.loads(reply.body)["data"][0]["embedding"]) == 256
    (received,) = dynamo.received
    assert "dimensions" not in received.json and "input_type" not in received.json
    assert legacy.state.seen == []


def test_embeddings_errors_are_the_gateways_and_reach_nobody(
    gateway: Gateway, dynamo: FakeUpstream, legacy: LegacyStandIn
) -> None:
    for method, target, body, status in [
        ("POST", "/v1/embeddings", b"{not json", 400),
        ("GET", "/v1/embeddings", None, 405),
        ("POST", "/v1/embeddings/extra", b"{}", 404),
    ]:
        reply = send(gateway.url, method, target, body, {"content-type": "application/json"})
        assert reply.status == status, (target, reply)
        assert set(orjson.loads(reply.body)["error"]) == {"message", "type", "param", "code"}
    assert dynamo.received == [] and legacy.state.seen == []


# -- everything else goes to the legacy server, untouched -----------------------------


def test_rerank_reaches_legacy_byte_for_byte(
    gateway: Gateway, dynamo: FakeUpstream, legacy: LegacyStandIn
) -> None:
    body = orjson.dumps(
        {"model": "bge-reranker", "query": QUERY, "documents": ["Paris", "Lyon", "Nice"]}
    )
    headers = {
        "content-type": "application/json",
        "authorization": "Bearer legacy-token",
        "x-tenant": "team-a",
        "accept": "application/json",
        "user-agent": "legacy-client/1.0",
    }
    reply = send(gateway.url, "POST", "/v1/rerank?top_n=2&return_documents=false", body, headers)
    assert reply.status == 200, reply.body
    assert len(orjson.loads(reply.body)["results"]) == 3
    assert reply.headers["x-legacy-server"] == "seed-fastapi"
    (seen,) = legacy.state.seen
    assert (seen.method, seen.target) == ("POST", "/v1/rerank?top_n=2&return_documents=false")
    assert seen.body_sha256 == hashlib.sha256(body).hexdigest() and seen.body_bytes == len(body)
    for name, value in headers.items():
        assert seen.header(name) == value, name
    assert seen.header("content-length") == str(len(body))
    assert dynamo.received == []


def test_multipart_audio_upload_reaches_legacy_byte_for_byte(
    gateway: Gateway, dynamo: FakeUpstream, legacy: LegacyStandIn
) -> None:
    body, content_type = multipart_audio(UPLOAD_BYTES)
    digest = hashlib.sha256(body).hexdigest()
    reply = send(
        gateway.url, "POST", "/v1/audio/transcriptions", body, {"content-type": content_type}
    )
    assert reply.status == 200, reply.body
    assert orjson.loads(reply.body) == {"text": "hello", "bytes": len(body), "sha256": digest}
    (seen,) = legacy.state.seen
    assert seen.header("content-type") == content_type
    assert (seen.body_bytes, seen.body_sha256) == (len(body), digest)
    assert dynamo.received == []
    print(f"\nbytes compared on the legacy route: {len(body):,} (multipart upload, SHA-256 equal)")


def test_upload_bigger_than_every_gateway_limit_reaches_legacy(
    gateway: Gateway, legacy: LegacyStandIn, qwen_policy: GatewayPolicy
) -> None:
    """Above the embeddings body cap and the listener's buffer limit: the legacy
    route has no limit of its own."""
    size = qwen_policy.max_response_bytes() + 4 * 2**20
    body, content_type = multipart_audio(size)
    reply = send(
        gateway.url, "POST", "/v1/audio/transcriptions", body, {"content-type": content_type}
    )
    assert reply.status == 200, reply.body[:300]
    assert orjson.loads(reply.body)["sha256"] == hashlib.sha256(body).hexdigest()
    assert len(body) > qwen_policy.limits.max_request_bytes


def test_upload_streams_to_legacy_before_the_client_has_finished(
    gateway: Gateway, legacy: LegacyStandIn
) -> None:
    """Half the body is sent, and the legacy server must already be reading it: no
    filter on that route holds the request back until it is whole."""
    body, content_type = multipart_audio(UPLOAD_BYTES)
    half = len(body) // 2
    host, port = gateway.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
    try:
        conn.putrequest("POST", "/v1/audio/transcriptions")
        conn.putheader("content-type", content_type)
        conn.putheader("content-length", str(len(body)))
        conn.endheaders(body[:half])
        deadline = time.monotonic() + WAIT_S
        while legacy.state.body_progress == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert legacy.state.body_progress > 0, "the legacy server got nothing before the end"
        assert legacy.state.seen == []  # still reading: the request is not whole yet
        conn.send(body[half:])
        reply = conn.getresponse()
        assert reply.status == 200
        assert orjson.loads(reply.read())["sha256"] == hashlib.sha256(body).hexdigest()
    finally:
        conn.close()


def test_streamed_answer_reaches_the_client_chunk_by_chunk(
    gateway: Gateway, legacy: LegacyStandIn
) -> None:
    """The stand-in holds its second chunk until the client has read the first
    through the gateway: a buffered route would deadlock until the wait ends."""
    host, port = gateway.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
    try:
        conn.request("GET", "/v1/stream", headers={"accept": "text/event-stream"})
        reply = conn.getresponse()
        assert reply.status == 200
        assert reply.getheader("transfer-encoding") == "chunked"
        started = time.monotonic()
        first = b""
        while len(first) < len(STREAM_CHUNKS[0]) and (piece := reply.read1(64)):
            first += piece
        assert first == STREAM_CHUNKS[0]
        assert time.monotonic() - started < WAIT_S / 2
        legacy.state.stream_release.set()
        assert first + reply.read() == b"".join(STREAM_CHUNKS)
    finally:
        conn.close()


LEGACY_ERRORS = {
    "/v1/rerank-invalid": (422, LEGACY_422, "application/json"),
    "/v1/broken": (500, LEGACY_500, "text/plain"),
    "/v1/no-such-thing": (404, b'{"detail":"Not Found"}', "application/json"),
}


@pytest.mark.parametrize("target", list(LEGACY_ERRORS))
def test_legacy_errors_come_back_as_they_are(
    gateway: Gateway, legacy: LegacyStandIn, target: str
) -> None:
    """No envelope, no custom_response on the legacy route: status, type and body
    are the legacy server's."""
    status, body, content_type = LEGACY_ERRORS[target]
    reply = send(
        gateway.url,
        "POST",
        target,
        b'{"model":"bge-reranker"}',
        {"content-type": "application/json"},
    )
    assert (reply.status, reply.body) == (status, body)
    assert reply.headers["content-type"] == content_type
    assert len(legacy.state.seen) == 1


@pytest.mark.parametrize("target", ["/v1/models", "/health"])
def test_models_and_health_are_the_legacy_servers(
    gateway: Gateway, dynamo: FakeUpstream, legacy: LegacyStandIn, target: str
) -> None:
    reply = send(gateway.url, "GET", target)
    direct = send(legacy.url, "GET", target)
    assert (reply.status, reply.body) == (direct.status, direct.body) == (200, reply.body)
    assert [s.target for s in legacy.state.seen] == [target, target]
    assert dynamo.received == []


def test_upload_time_through_the_gateway_vs_direct(gateway: Gateway, legacy: LegacyStandIn) -> None:
    body, content_type = multipart_audio(UPLOAD_BYTES)
    headers = {"content-type": content_type}
    times: dict[str, list[float]] = {"direct": [], "gateway": []}
    for _ in range(3):
        for name, url in (("direct", legacy.url), ("gateway", gateway.url)):
            started = time.perf_counter()
            reply = send(url, "POST", "/v1/audio/transcriptions", body, headers)
            times[name].append(time.perf_counter() - started)
            assert reply.status == 200
    direct, through = statistics.median(times["direct"]), statistics.median(times["gateway"])
    print(
        f"\n{len(body) / 2**20:.1f} MiB upload, median of 3: direct {direct * 1000:.1f} ms, "
        f"through the gateway {through * 1000:.1f} ms ({through / direct:.2f}x)"
    )
    # A loose bound on a shared machine: streaming adds a hop, not a buffering pass.
    assert through < direct * 10 + 2.0


def test_an_unreachable_legacy_server_is_a_503_envelope(
    dynamo: FakeUpstream, gateways: Gateways
) -> None:
    """Envoy's own answer (not the legacy server's), so it gets the envelope; the
    embeddings route is unaffected."""
    dead = f"http://127.0.0.1:{free_port()}"
    with gateways.own(GatewaySpec(dynamo.url, legacy=dead)) as gw:
        reply = send(gw.url, "GET", "/v1/models")
        assert reply.status == 503
        error = orjson.loads(reply.body)["error"]
        assert (error["type"], error["code"]) == ("server_error", "upstream_unavailable")
        body = orjson.dumps({"model": QWEN_MODEL, "input": "hello"})
        ok = send(gw.url, "POST", "/v1/embeddings", body, {"content-type": "application/json"})
        assert ok.status == 200


# -- the rendered config -------------------------------------------------------------


@pytest.mark.parametrize("shape", ["standalone", "single-filter"])
def test_without_legacy_the_rendered_config_is_unchanged(
    qwen_policy: GatewayPolicy, shape: str
) -> None:
    template = load_template(REPO / "envoy" / f"{shape}.yaml")
    settings = EnvoySettings(
        "127.0.0.1", 18080, 19901, 15051, Upstream.from_url("http://dynamo:8000")
    )
    rendered = render(template, settings, qwen_policy)
    assert LEGACY_CLUSTER not in yaml.safe_dump(rendered)
    with_split = render(
        template,
        EnvoySettings(
            "127.0.0.1",
            18080,
            19901,
            15051,
            Upstream.from_url("http://dynamo:8000"),
            legacy=Upstream.from_url("https://legacy.internal:9443"),
        ),
        qwen_policy,
    )
    assert with_split == with_legacy(rendered, Upstream.from_url("https://legacy.internal:9443"))
    clusters = {c["name"]: c for c in with_split["static_resources"]["clusters"]}
    assert clusters.keys() == {"upstream", "extproc", LEGACY_CLUSTER}
    tls = clusters[LEGACY_CLUSTER]["transport_socket"]["typed_config"]
    assert tls["sni"] == "legacy.internal"


def test_with_legacy_refuses_a_config_without_a_passthrough_route() -> None:
    config = load_template()
    for vhost in config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]["route_config"]["virtual_hosts"]:
        vhost["routes"] = [r for r in vhost["routes"] if r["name"] != "passthrough"]
    with pytest.raises(ValueError, match="passthrough"):
        with_legacy(config, Upstream.from_url("http://legacy:9000"))


def test_a_bad_legacy_url_stops_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "extproc", "run", "--upstream", "http://127.0.0.1:1"]
        + ["--legacy", "ftp://legacy"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--legacy" in result.stderr and "ftp://legacy" in result.stderr
