"""Through a real Envoy and the real ext_proc server (started by `extproc run`),
in front of an upstream that reproduces Dynamo 1.6.1's measured answers
(testing_support/fake_upstream.py), with the real Qwen3 tokenizer and the shipped
Qwen3-Embedding-0.6B policy. These are the contract gateway's acceptance
checks."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import SHAPES, Gateway, GatewaySpec
from testing_support.http import Reply, http, metric_value
from testing_support.processes import free_port
from testing_support.qwen import QWEN_EOS, QWEN_MODEL, REPO
from tests.harness import Gateways

QUERY = "What is the capital city of France?"
QWEN3_PROMPT = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\n"
    f"Query:{QUERY}"
)


@pytest.fixture(scope="module", params=SHAPES)
def gateway(request: pytest.FixtureRequest, upstream: FakeUpstream, gateways: Gateways) -> Gateway:
    """Both shipped Envoy shapes: the two-filter standalone.yaml (what `extproc run`
    uses) and single-filter.yaml (what the mesh configurations use)."""
    return gateways.shared(GatewaySpec(upstream.url, shape=request.param))


@pytest.fixture(autouse=True)
def clean_upstream(upstream: FakeUpstream) -> None:
    upstream.reset()


def assert_envelope(reply: Reply, status: int) -> dict[str, Any]:
    assert reply.status == status, reply.body
    assert reply.headers.get("content-type", "").startswith("application/json")
    error = reply.error()
    assert "Traceback" not in error["message"]
    return error


def unit(v: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return v / np.linalg.norm(v)


# -- 1. dimensions -----------------------------------------------------------------


def test_dimensions_256_returns_renormalised_prefix(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    texts = ["Seoul is the capital of South Korea.", "서울은 대한민국의 수도이다."]
    reply = gateway.embeddings({"model": QWEN_MODEL, "input": texts, "dimensions": 256})
    assert reply.status == 200, reply.body
    doc = reply.json()
    (received,) = upstream.received
    assert "dimensions" not in received.json  # Dynamo would answer 500
    for item, text in zip(doc["data"], texts, strict=True):
        got = np.asarray(item["embedding"], dtype=np.float64)
        assert got.shape == (256,)
        assert abs(np.linalg.norm(got) - 1.0) < 1e-6
        native = upstream.embed_ids(upstream.tokenize(text)).astype(np.float64)
        np.testing.assert_allclose(got, unit(native[:256]), atol=1e-6)


def test_dimensions_native_is_a_noop(gateway: Gateway, upstream: FakeUpstream) -> None:
    reply = gateway.embeddings({"model": QWEN_MODEL, "input": "hello", "dimensions": 1024})
    assert reply.status == 200, reply.body
    assert len(reply.json()["data"][0]["embedding"]) == 1024
    assert "dimensions" not in upstream.received[0].json


# The shipped policy's legacy profile reads "256" as 256, like the legacy server's
# lax pydantic model (tests/test_legacy_leniency.py); "256.5" it refuses.
@pytest.mark.parametrize("dimensions", [0, -1, 31, 1025, 4096, 256.5, "256.5", True, [256]])
def test_bad_dimensions_are_400_and_never_forwarded(
    gateway: Gateway, upstream: FakeUpstream, dimensions: Any
) -> None:
    reply = gateway.embeddings({"model": QWEN_MODEL, "input": "x", "dimensions": dimensions})
    error = assert_envelope(reply, 400)
    assert error["param"] == "dimensions"
    assert upstream.received == []


# -- 2. query instructions -----------------------------------------------------------


def test_input_type_query_reaches_the_model_as_the_qwen3_prompt(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    reply = gateway.embeddings({"model": QWEN_MODEL, "input": QUERY, "input_type": "query"})
    assert reply.status == 200, reply.body
    (received,) = upstream.received
    assert received.json["input"] == [QWEN3_PROMPT]
    assert "input_type" not in received.json and "instruction" not in received.json
    assert reply.json()["usage"]["prompt_tokens"] == 28  # the seed's figure
    plain = gateway.embeddings({"model": QWEN_MODEL, "input": QUERY}).json()
    assert plain["usage"]["prompt_tokens"] == 9
    a = np.asarray(reply.json()["data"][0]["embedding"])
    b = np.asarray(plain["data"][0]["embedding"])
    assert float(a @ b) < 0.99  # the instruction really changed what was embedded


def test_instruction_replaces_the_task(gateway: Gateway, upstream: FakeUpstream) -> None:
    task = "Given a question, retrieve the FAQ entry that answers it"
    reply = gateway.embeddings({"model": QWEN_MODEL, "input": [QUERY], "instruction": task})
    assert reply.status == 200, reply.body
    assert upstream.received[0].json["input"] == [f"Instruct: {task}\nQuery:{QUERY}"]


def test_documents_get_no_prefix(gateway: Gateway, upstream: FakeUpstream) -> None:
    reply = gateway.embeddings({"model": QWEN_MODEL, "input": ["doc"], "input_type": "passage"})
    assert reply.status == 200
    assert upstream.received[0].json["input"] == ["doc"]


# -- 3. long input -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "The quick brown fox jumps over the lazy dog near the riverbank. " * 230,
        "대한민국의 수도는 서울이며 한강이 도시를 가로질러 흐른다. " * 200,
        "北京是中国的首都，也是政治和文化中心。😀🚀 " * 220,
    ],
    ids=["english", "korean", "chinese-emoji"],
)
def test_long_input_is_truncated_like_the_legacy_server(
    gateway: Gateway, upstream: FakeUpstream, text: str
) -> None:
    full = upstream.tokenize(text)
    assert len(full) >= 3000
    reply = gateway.embeddings({"model": QWEN_MODEL, "input": [text, "short one"]})
    assert reply.status == 200, reply.body
    (received,) = upstream.received
    long_ids, short_ids = received.json["input"]
    assert long_ids == full[:1023] + [QWEN_EOS]  # first limit-1 tokens + EOS
    assert short_ids == upstream.tokenize("short one")
    assert reply.json()["usage"]["prompt_tokens"] == 1024 + len(short_ids)


def test_token_id_input_out_of_range_is_400(gateway: Gateway, upstream: FakeUpstream) -> None:
    for bad in ([1, 2, 10_000_000], [[5, 6], [-1]]):
        error = assert_envelope(gateway.embeddings({"model": QWEN_MODEL, "input": bad}), 400)
        assert error["param"] == "input"
    assert upstream.received == []


def test_long_token_id_input_is_truncated(gateway: Gateway, upstream: FakeUpstream) -> None:
    ids = [*range(1000, 3999), QWEN_EOS]
    reply = gateway.embeddings({"model": QWEN_MODEL, "input": [ids]})
    assert reply.status == 200, reply.body
    assert upstream.received[0].json["input"] == [ids[:1023] + [QWEN_EOS]]


# -- 4. encoding_format (legacy profile) ---------------------------------------------


def test_legacy_profile_answers_floats_for_base64(gateway: Gateway, upstream: FakeUpstream) -> None:
    reply = gateway.embeddings({"model": QWEN_MODEL, "input": "hi", "encoding_format": "base64"})
    assert reply.status == 200
    embedding = reply.json()["data"][0]["embedding"]
    assert isinstance(embedding, list) and len(embedding) == 1024
    assert upstream.received[0].json.get("encoding_format", "float") == "float"


# -- 5. errors -------------------------------------------------------------------------

BAD_REQUESTS: list[tuple[str, bytes, int, str | None]] = [
    ("malformed-json", b'{"model": "Qwen/Qwen3-Embedding-0.6B", "input": ', 400, None),
    ("not-an-object", b'["hello"]', 400, None),
    ("model-missing", b'{"input": "x"}', 400, "model"),
    ("model-not-string", b'{"model": 5, "input": "x"}', 400, "model"),
    ("unknown-model", b'{"model": "text-embedding-3-small", "input": "x"}', 404, "model"),
    ("input-missing", b'{"model": "Qwen/Qwen3-Embedding-0.6B"}', 400, "input"),
    ("input-empty-list", b'{"model": "Qwen/Qwen3-Embedding-0.6B", "input": []}', 400, "input"),
    ("input-number", b'{"model": "Qwen/Qwen3-Embedding-0.6B", "input": 5}', 400, "input"),
    ("input-mixed", b'{"model": "Qwen/Qwen3-Embedding-0.6B", "input": ["a", 1]}', 400, "input"),
    (
        "input-null-item",
        b'{"model": "Qwen/Qwen3-Embedding-0.6B", "input": ["a", null]}',
        400,
        "input",
    ),
    (
        "encoding-bogus",
        b'{"model": "Qwen/Qwen3-Embedding-0.6B", "input": "x", "encoding_format": "bytes"}',
        400,
        "encoding_format",
    ),
    (
        "input-type-bogus",
        b'{"model": "Qwen/Qwen3-Embedding-0.6B", "input": "x", "input_type": "banana"}',
        400,
        "input_type",
    ),
    (
        "instruction-number",
        b'{"model": "Qwen/Qwen3-Embedding-0.6B", "input": "x", "instruction": 3}',
        400,
        "instruction",
    ),
    (
        "truncate-too-big",
        b'{"model": "Qwen/Qwen3-Embedding-0.6B", "input": "x", "truncate_prompt_tokens": 5000}',
        400,
        "truncate_prompt_tokens",
    ),
    (
        "nan-literal",
        b'{"model": "Qwen/Qwen3-Embedding-0.6B", "input": "x", "dimensions": NaN}',
        400,
        None,
    ),
]


@pytest.mark.parametrize(
    ("body", "status", "param"), [b[1:] for b in BAD_REQUESTS], ids=[b[0] for b in BAD_REQUESTS]
)
def test_bad_requests_get_an_envelope_and_never_reach_the_upstream(
    gateway: Gateway, upstream: FakeUpstream, body: bytes, status: int, param: str | None
) -> None:
    error = assert_envelope(gateway.embeddings(body), status)
    assert error["param"] == param
    if status == 400:
        assert error["type"] == "invalid_request_error"
    assert upstream.received == []


def test_too_many_inputs(gateway: Gateway, upstream: FakeUpstream) -> None:
    error = assert_envelope(gateway.embeddings({"model": QWEN_MODEL, "input": ["a"] * 2049}), 400)
    assert "2049" in error["message"] and error["param"] == "input"
    assert upstream.received == []


def test_largest_batch_with_dimensions_is_rewritten(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """2,048 inputs with `dimensions`: the response the rewrite route buffers (~11 MB of
    base64 from the upstream) must fit Envoy's stream buffer. The buffer filter's
    limit is that stream's limit; at 8 MiB every such request was a 500
    response_payload_too_large."""
    inputs = [f"document number {i} about topic {i % 17}" for i in range(2048)]
    reply = gateway.embeddings(
        {"model": QWEN_MODEL, "input": inputs, "dimensions": 256}, timeout=120
    )
    assert reply.status == 200, reply.body[:300]
    data = reply.json()["data"]
    assert len(data) == 2048 and {len(item["embedding"]) for item in data} == {256}


def test_chunked_body_over_the_limit_is_413(gateway: Gateway, upstream: FakeUpstream) -> None:
    """No content-length to refuse early: the gateway's own size check answers."""

    def chunks() -> Iterator[bytes]:
        yield b'{"model": "' + QWEN_MODEL.encode() + b'", "input": "'
        for _ in range(9):
            yield b"x" * (1024 * 1024)
        yield b'"}'

    body = b"".join(chunks())
    request = urllib.request.Request(
        f"{gateway.url}/v1/embeddings",
        data=iter([body[i : i + 65536] for i in range(0, len(body), 65536)]),
        method="POST",
        headers={"content-type": "application/json", "transfer-encoding": "chunked"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    assert status == 413, raw[:300]
    assert json.loads(raw)["error"]["code"] == "request_too_large"
    assert upstream.received == []


def test_oversized_body_is_413(gateway: Gateway, upstream: FakeUpstream) -> None:
    body = json.dumps({"model": QWEN_MODEL, "input": "x" * (9 * 1024 * 1024)}).encode()
    # Envoy may answer as soon as it sees the declared length and close while the
    # body is still being written: read the answer even if the write breaks.
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head + body)
        raw = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                raw += chunk
    status_line, _, rest = raw.partition(b"\r\n")
    assert status_line.split()[1] == b"413", raw[:300]
    payload = rest.partition(b"\r\n\r\n")[2]
    doc = json.loads(payload)
    assert doc["error"]["code"] == "request_too_large"
    assert upstream.received == []


def test_wrong_content_type_is_415(gateway: Gateway, upstream: FakeUpstream) -> None:
    reply = gateway.embeddings(
        b'{"model": "Qwen/Qwen3-Embedding-0.6B", "input": "x"}',
        headers={"content-type": "text/plain"},
    )
    assert_envelope(reply, 415)
    assert upstream.received == []


def test_empty_body_and_wrong_method(gateway: Gateway, upstream: FakeUpstream) -> None:
    assert_envelope(gateway.embeddings(b""), 400)
    assert_envelope(http("GET", f"{gateway.url}/v1/embeddings"), 405)
    assert upstream.received == []


def test_upstream_500_stays_a_5xx_server_error(gateway: Gateway, upstream: FakeUpstream) -> None:
    upstream.fault = "http500"
    error = assert_envelope(gateway.embeddings({"model": QWEN_MODEL, "input": "x"}), 500)
    assert error["type"] == "server_error"
    assert "500" in error["message"]
    # On the rewrite route the gateway's own response filter keeps the upstream's text.
    with_dims = {"model": QWEN_MODEL, "input": "x", "dimensions": 64}
    error = assert_envelope(gateway.embeddings(with_dims), 500)
    assert error["type"] == "server_error"
    assert "Internal server error" in error["message"]


@pytest.mark.parametrize("dimensions", [None, 64], ids=["plain-route", "rewrite-route"])
def test_worker_gone_is_503_not_404(
    gateway: Gateway, upstream: FakeUpstream, dimensions: int | None
) -> None:
    upstream.fault = "worker_gone"  # Dynamo: 404 with an empty body
    body = {"model": QWEN_MODEL, "input": "x", "dimensions": dimensions}
    error = assert_envelope(gateway.embeddings(body), 503)
    assert error["type"] == "server_error"


def test_upstream_down_is_a_503_envelope_that_says_when_to_retry(gateways: Gateways) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with gateways.own(GatewaySpec(dead)) as gw:
        plain = {"model": QWEN_MODEL, "input": "x"}
        rewritten = {"model": QWEN_MODEL, "input": "hello", "dimensions": 256}
        for body in (rewritten, plain):  # both routes
            reply = gw.embeddings(body)
            error = assert_envelope(reply, 503)
            assert reply.headers.get("retry-after") == "1", reply.headers
            assert (error["type"], error["code"]) == ("server_error", "upstream_unavailable")
            assert error["message"].startswith("The gateway could not get an answer from the")
            assert "{" not in error["message"]  # no Envoy response-code details
        # Still validated first: a client mistake stays a 400 even with the upstream down.
        assert_envelope(gw.embeddings({"model": QWEN_MODEL, "input": []}), 400)


def test_slow_upstream_is_a_504_envelope(upstream: FakeUpstream, gateways: Gateways) -> None:
    with gateways.own(GatewaySpec(upstream.url, args=("--upstream-timeout", "0.5"))) as gw:
        upstream.fault = "slow"
        upstream.slow_seconds = 2.0
        error = assert_envelope(gw.embeddings({"model": QWEN_MODEL, "input": "x"}), 504)
        assert error["type"] == "server_error"


# -- 6. pass-through -------------------------------------------------------------------


def test_other_paths_pass_through_untouched(gateway: Gateway, upstream: FakeUpstream) -> None:
    direct = http("GET", f"{upstream.url}/v1/models")
    via = http("GET", f"{gateway.url}/v1/models")
    assert via.status == direct.status == 200
    assert via.json()["data"] == direct.json()["data"]
    assert http("GET", f"{gateway.url}/health").status == 200


def test_request_needing_no_rewrite_is_forwarded_byte_for_byte(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    body = b'{"model":"Qwen/Qwen3-Embedding-0.6B","input":["plain text", "\xea\xb0\x80"], "user": "u1"}'
    reply = gateway.embeddings(body)
    assert reply.status == 200
    assert upstream.received[0].body == body


# -- the seed's workload -------------------------------------------------------------


def load_corpus() -> list[str]:
    lines = (REPO / "extproc" / "data" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    docs = [json.loads(line) for line in lines if line.strip()]
    return [d["text"] for d in docs if d["kind"] == "document"]


def test_seed_workload_all_200(gateway: Gateway) -> None:
    docs = load_corpus()
    assert len(docs) == 40
    batches = [docs[i : i + 8] for i in range(0, 40, 8)]

    def send(i: int) -> int:
        body = {"model": QWEN_MODEL, "input": batches[i % len(batches)], "dimensions": 256}
        return gateway.embeddings(body).status

    sequential = [send(i) for i in range(30)]
    with ThreadPoolExecutor(4) as pool:
        concurrent = list(pool.map(send, range(40)))
    assert sequential == [200] * 30
    assert concurrent == [200] * 40


def test_metrics_count_outcomes(gateway: Gateway) -> None:
    before = gateway.metrics()
    gateway.embeddings({"model": QWEN_MODEL, "input": []})
    gateway.embeddings({"model": QWEN_MODEL, "input": "q", "input_type": "query"})
    after = gateway.metrics()
    for name, labels in [
        ("extproc_requests_total", {"outcome": "rejected"}),
        ("extproc_requests_total", {"outcome": "rewritten"}),
        ("extproc_rewrites_total", {"kind": "instruction"}),
    ]:
        assert metric_value(after, name, **labels) == metric_value(before, name, **labels) + 1
    assert "Qwen" not in after  # no client-supplied values in label sets


# -- the OpenAI encoding profile ---------------------------------------------------------


OPENAI_POLICY = (
    "models:\n"
    "  - name: qwen3-openai\n"
    "    preset: qwen3-embedding-0.6b\n"
    f"    upstream_model: {QWEN_MODEL}\n"
    "    max_tokens: 1024\n"
    "    encoding_profile: OPENAI\n"
)


@pytest.fixture(scope="module")
def openai_gateway(upstream: FakeUpstream, gateways: Gateways, qwen_dir: Path) -> Gateway:
    spec = GatewaySpec(upstream.url, policy=OPENAI_POLICY, tokenizers=f"qwen3-openai={qwen_dir}")
    return gateways.shared(spec)


def b64_floats(text: str) -> np.ndarray[Any, Any]:
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


def test_openai_profile_base64_round_trips(openai_gateway: Gateway, upstream: FakeUpstream) -> None:
    body = {"model": "qwen3-openai", "input": ["a b c"], "encoding_format": "base64"}
    reply = openai_gateway.embeddings(body)
    assert reply.status == 200, reply.body
    assert upstream.received[0].json["model"] == QWEN_MODEL
    as_floats = openai_gateway.embeddings({**body, "encoding_format": "float"}).json()
    decoded = b64_floats(reply.json()["data"][0]["embedding"])
    np.testing.assert_array_equal(
        decoded, np.asarray(as_floats["data"][0]["embedding"], np.float32)
    )


def test_openai_profile_base64_with_dimensions(
    openai_gateway: Gateway, upstream: FakeUpstream
) -> None:
    body = {
        "model": "qwen3-openai",
        "input": "a b c",
        "encoding_format": "base64",
        "dimensions": 64,
    }
    reply = openai_gateway.embeddings(body)
    assert reply.status == 200, reply.body
    doc = reply.json()
    assert doc["model"] == "qwen3-openai"
    vector = b64_floats(doc["data"][0]["embedding"])
    native = upstream.embed_ids(upstream.tokenize("a b c"))
    np.testing.assert_allclose(vector, unit(native[:64].astype(np.float64)), atol=1e-6)
