"""The fake upstream answers as docs/upstreams.md records Dynamo 1.6.1 and vLLM 0.32.

These are quick tests: loopback only, every request has a timeout, and no model is run.
"""

from __future__ import annotations

import base64
import http.client
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import orjson
import pytest

from testing_support.fake_upstream import FakeUpstream

MODEL = "Qwen/Qwen3-Embedding-0.6B"
QUERY = "What is the capital city of France?"
INSTRUCTION = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)
TIMEOUT = 10.0
GENERIC_500 = {"message": "Internal server error", "type": "Internal Server Error", "code": 500}


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return orjson.loads(self.body)


def call(
    fake: FakeUpstream,
    payload: Any = None,
    *,
    raw: bytes | None = None,
    path: str = "/v1/embeddings",
    method: str = "POST",
    content_type: str = "application/json",
) -> Answer:
    data = raw if raw is not None else (None if payload is None else orjson.dumps(payload))
    headers = {"content-type": content_type} if data is not None else {}
    request = urllib.request.Request(fake.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            got = {k.lower(): v for k, v in response.headers.items()}
            return Answer(response.status, got, response.read())
    except urllib.error.HTTPError as error:
        with error:
            got = {k.lower(): v for k, v in error.headers.items()}
            return Answer(error.code, got, error.read())


def embed(fake: FakeUpstream, payload: dict[str, Any]) -> Answer:
    return call(fake, {"model": MODEL, **payload})


def vectors(answer: Answer) -> list[np.ndarray[Any, Any]]:
    return [np.asarray(d["embedding"], dtype=np.float32) for d in answer.json()["data"]]


@pytest.fixture(scope="module")
def dynamo_server() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        yield fake


@pytest.fixture(scope="module")
def vllm_server() -> Iterator[FakeUpstream]:
    with FakeUpstream(flavour="vllm") as fake:
        yield fake


@pytest.fixture
def dynamo(dynamo_server: FakeUpstream) -> FakeUpstream:
    dynamo_server.reset()
    return dynamo_server


@pytest.fixture
def vllm(vllm_server: FakeUpstream) -> FakeUpstream:
    vllm_server.reset()
    return vllm_server


# ----------------------------------------------------------------------------- Dynamo, 200s


def test_dynamo_success_body_has_no_id_and_float32_vectors(dynamo: FakeUpstream) -> None:
    answer = embed(dynamo, {"input": ["hello", "world"]})
    assert answer.status == 200
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert list(body) == ["object", "data", "model", "usage"]  # no id, no created
    assert body["object"] == "list" and body["model"] == MODEL
    tokens = [dynamo.tokenize("hello"), dynamo.tokenize("world")]
    total = sum(len(t) for t in tokens)
    assert body["usage"] == {"prompt_tokens": total, "total_tokens": total}
    for index, (item, ids) in enumerate(zip(body["data"], tokens, strict=True)):
        assert item["object"] == "embedding" and item["index"] == index
        expected = dynamo.embed_ids(ids)
        assert len(item["embedding"]) == 1024
        np.testing.assert_array_equal(np.asarray(item["embedding"], dtype=np.float32), expected)
        assert abs(float(np.linalg.norm(expected)) - 1.0) < 1e-6
        # printed as float32's shortest repr, as Dynamo does
        assert orjson.dumps(expected, option=orjson.OPT_SERIALIZE_NUMPY) in answer.body


def test_qwen3_token_counts_and_instruction_changes_the_vector(dynamo: FakeUpstream) -> None:
    plain = embed(dynamo, {"input": QUERY})
    instructed = embed(dynamo, {"input": INSTRUCTION + QUERY})
    assert plain.json()["usage"]["prompt_tokens"] == 9
    assert instructed.json()["usage"]["prompt_tokens"] == 28
    assert dynamo.tokenize(QUERY)[-1] == 151643
    cosine = float(vectors(plain)[0] @ vectors(instructed)[0])
    assert cosine < 0.9


def test_base64_is_little_endian_float32_of_the_float_answer(dynamo: FakeUpstream) -> None:
    as_float = embed(dynamo, {"input": [QUERY, "hello"]})
    as_b64 = embed(dynamo, {"input": [QUERY, "hello"], "encoding_format": "base64"})
    assert as_b64.status == 200
    for item, vector in zip(as_b64.json()["data"], vectors(as_float), strict=True):
        raw = base64.b64decode(item["embedding"])
        assert len(raw) == 4 * 1024
        np.testing.assert_array_equal(np.frombuffer(raw, dtype="<f4"), vector)


def test_token_id_input_is_used_as_is(dynamo: FakeUpstream) -> None:
    ids = dynamo.tokenize(QUERY)
    text = vectors(embed(dynamo, {"input": QUERY}))[0]
    single = embed(dynamo, {"input": ids})
    assert single.json()["usage"]["prompt_tokens"] == len(ids)
    np.testing.assert_array_equal(vectors(single)[0], text)
    batch = embed(dynamo, {"input": [ids, dynamo.tokenize("hello")]})
    assert len(batch.json()["data"]) == 2
    np.testing.assert_array_equal(vectors(batch)[0], text)
    # no EOS is added to token ids
    without_eos = vectors(embed(dynamo, {"input": ids[:-1]}))[0]
    np.testing.assert_array_equal(without_eos, dynamo.embed_ids(ids[:-1]))
    assert float(without_eos @ text) < 0.99


def test_unknown_fields_are_ignored(dynamo: FakeUpstream) -> None:
    plain = embed(dynamo, {"input": QUERY})
    extra = embed(dynamo, {"input": QUERY, "input_type": "query", "instruction": "x", "foo": 1})
    assert extra.status == 200
    np.testing.assert_array_equal(vectors(extra)[0], vectors(plain)[0])


def test_empty_string_is_the_eos_token(dynamo: FakeUpstream) -> None:
    answer = embed(dynamo, {"input": [""]})
    assert answer.status == 200
    assert answer.json()["usage"]["prompt_tokens"] == 1


def test_truncate_prompt_tokens_keeps_the_last_tokens(dynamo: FakeUpstream) -> None:
    ids = list(range(1000, 3000))
    answer = embed(dynamo, {"input": ids, "truncate_prompt_tokens": 100})
    assert answer.status == 200
    assert answer.json()["usage"]["prompt_tokens"] == 100
    np.testing.assert_array_equal(vectors(answer)[0], dynamo.embed_ids(ids[-100:]))
    assert embed(dynamo, {"input": ids, "truncate_prompt_tokens": -1}).status == 200
    too_big = embed(dynamo, {"input": ids, "truncate_prompt_tokens": 2000})
    assert (too_big.status, too_big.json()) == (500, GENERIC_500)


# ----------------------------------------------------------------------------- Dynamo, errors


@pytest.mark.parametrize(
    ("payload", "status", "expected"),
    [
        ({"input": QUERY, "dimensions": 256}, 500, GENERIC_500),
        ({"input": QUERY, "dimensions": 1024}, 500, GENERIC_500),
        ({"input": [1] * 1025}, 500, GENERIC_500),
        ({"input": ["short", "hello " * 1100]}, 500, GENERIC_500),
        ({"input": "a" * (18 * 1024 + 1)}, 500, GENERIC_500),
        ({"input": []}, 400, {"message": "Invalid request", "type": "Bad Request", "code": 400}),
        (
            {"input": QUERY, "model": "wrong-name"},
            404,
            {"message": "Model not found", "type": "Not Found", "code": 404},
        ),
    ],
    ids=["dims-256", "dims-native", "1025-ids", "1025-tokens", "chars", "empty", "wrong-model"],
)
def test_dynamo_error_table(
    dynamo: FakeUpstream, payload: dict[str, Any], status: int, expected: dict[str, Any]
) -> None:
    answer = embed(dynamo, payload)
    assert (answer.status, answer.json()) == (status, expected)


def test_dynamo_limit_is_inclusive(dynamo: FakeUpstream) -> None:
    answer = embed(dynamo, {"input": [7] * 1024})
    assert answer.status == 200 and answer.json()["usage"]["prompt_tokens"] == 1024


def test_dynamo_deserialisation_errors_are_flat_400s(dynamo: FakeUpstream) -> None:
    truncated = b'{"model":"' + MODEL.encode() + b'","input":'
    answer = call(dynamo, raw=truncated)
    assert answer.status == 400
    assert answer.json() == {
        "message": "Failed to deserialize the JSON body into the target type: EOF while parsing "
        f"a value at line 1 column {len(truncated)}",
        "type": "Bad Request",
        "code": 400,
    }
    missing = call(dynamo, {"input": QUERY})
    assert missing.status == 400 and "missing field `model`" in missing.json()["message"]
    assert set(missing.json()) == {"message", "type", "code"}
    bogus = embed(dynamo, {"input": QUERY, "encoding_format": "bogus"})
    assert bogus.status == 400 and bogus.json()["type"] == "Bad Request"
    assert call(dynamo, {"model": MODEL, "input": QUERY}, content_type="text/plain").status == 415


def test_models_health_and_other_paths(dynamo: FakeUpstream) -> None:
    models = call(dynamo, path="/v1/models", method="GET")
    assert models.status == 200
    (entry,) = models.json()["data"]
    assert entry["id"] == MODEL and entry["owned_by"] == "nvidia"
    assert entry["context_window"] == 1024
    health = call(dynamo, path="/health", method="GET")
    assert health.status == 200 and health.json()["status"] == "healthy"
    other = call(dynamo, path="/v1/chat/completions", method="POST", payload={})
    assert other.status == 404 and other.json()["code"] == 404


# ----------------------------------------------------------------------------- faults


def test_fault_http500_answers_everything_with_the_generic_500(dynamo: FakeUpstream) -> None:
    dynamo.fault = "http500"
    for answer in (embed(dynamo, {"input": QUERY}), call(dynamo, path="/health", method="GET")):
        assert (answer.status, answer.json()) == (500, GENERIC_500)
    dynamo.reset()
    assert embed(dynamo, {"input": QUERY}).status == 200


def test_fault_worker_gone_is_an_empty_404(dynamo: FakeUpstream) -> None:
    dynamo.fault = "worker_gone"
    answer = embed(dynamo, {"input": QUERY})
    assert answer.status == 404
    assert answer.body == b""
    assert answer.headers["content-length"] == "0"
    assert "content-type" not in answer.headers
    assert call(dynamo, path="/v1/models", method="GET").json()["data"] == []


def test_fault_slow_delays_the_answer(dynamo: FakeUpstream) -> None:
    dynamo.fault = "slow"
    dynamo.slow_seconds = 0.3
    started = time.monotonic()
    assert embed(dynamo, {"input": QUERY}).status == 200
    assert time.monotonic() - started >= 0.3


def test_received_keep_alive_and_chunked_bodies(dynamo: FakeUpstream) -> None:
    payload = orjson.dumps({"model": MODEL, "input": QUERY, "input_type": "query"})
    conn = http.client.HTTPConnection("127.0.0.1", dynamo.port, timeout=TIMEOUT)
    try:
        conn.request("POST", "/v1/embeddings", body=payload, headers={"X-Test": "a"})
        first = conn.getresponse()
        first.read()
        sock = conn.sock
        chunks = iter([payload[:10], payload[10:]])
        conn.request(
            "POST",
            "/v1/embeddings",
            body=chunks,
            headers={"content-type": "application/json"},
            encode_chunked=True,
        )
        second = conn.getresponse()
        second.read()
        assert conn.sock is sock  # the same kept-alive connection
    finally:
        conn.close()
    # http.client sends no content-type unless told: the first answer is Dynamo's 415
    assert (first.status, second.status) == (415, 200)
    got = dynamo.received
    assert [r.method for r in got] == ["POST", "POST"]
    assert got[0].headers["x-test"] == "a" and got[0].path == "/v1/embeddings"
    assert got[1].headers["transfer-encoding"] == "chunked"
    assert got[1].body == payload
    assert got[1].json == {"model": MODEL, "input": QUERY, "input_type": "query"}
    dynamo.reset()
    assert dynamo.received == []


def test_stop_closes_kept_alive_connections() -> None:
    fake = FakeUpstream(dim=8, max_model_len=16).start()
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=TIMEOUT)
    try:
        conn.request("GET", "/health")
        conn.getresponse().read()
        fake.stop()
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            conn.request("GET", "/health")
            conn.getresponse().read()
    finally:
        conn.close()
        fake.stop()


# ----------------------------------------------------------------------------- Matryoshka


def test_matryoshka_cut_is_renormalised() -> None:
    with FakeUpstream(dim=64, max_model_len=32, is_matryoshka=True) as fake:
        answer = embed(fake, {"input": QUERY, "dimensions": 16})
        assert answer.status == 200
        (vector,) = vectors(answer)
        expected = fake.embed_ids(fake.tokenize(QUERY), 16)
        np.testing.assert_array_equal(vector, expected)
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-6
        head = fake.embed_ids(fake.tokenize(QUERY))[:16]
        np.testing.assert_allclose(expected, head / np.linalg.norm(head), rtol=1e-6)
        for bad in (0, 65):
            assert embed(fake, {"input": QUERY, "dimensions": bad}).status == 500


# ----------------------------------------------------------------------------- vLLM flavour


def test_vllm_success_body_has_id_and_created(vllm: FakeUpstream) -> None:
    answer = call(vllm, {"input": ["hello", "world"]})  # model omitted: the served one
    assert answer.status == 200
    body = answer.json()
    assert {"id", "created", "object", "model", "data", "usage"} <= set(body)
    assert body["model"] == MODEL
    assert body["usage"]["completion_tokens"] == 0
    np.testing.assert_array_equal(vectors(answer)[0], vllm.embed_ids(vllm.tokenize("hello")))


@pytest.mark.parametrize(
    ("payload", "status", "kind", "message_part"),
    [
        (
            {"model": MODEL, "input": QUERY, "dimensions": 256},
            400,
            "BadRequestError",
            f"Model '{MODEL}' does not support Matryoshka embeddings; dimensions must be unset "
            "(received dimensions=256).",
        ),
        (
            {"model": MODEL, "input": [1] * 1025},
            400,
            "BadRequestError",
            "This model's maximum context length is 1024 tokens. However, your prompt contains "
            "at least 1025 input tokens",
        ),
        (
            {"model": MODEL, "input": "a" * (18 * 1024 + 1)},
            400,
            "BadRequestError",
            "(more than 18432 characters, which is the upper bound for 1024 input tokens)",
        ),
        ({"model": "wrong-name", "input": QUERY}, 404, "NotFoundError", "`wrong-name`"),
        ({"model": MODEL, "input": []}, 400, "BadRequestError", "at least one prompt"),
    ],
    ids=["dimensions", "tokens", "chars", "wrong-model", "empty"],
)
def test_vllm_error_table(
    vllm: FakeUpstream, payload: dict[str, Any], status: int, kind: str, message_part: str
) -> None:
    answer = call(vllm, payload)
    assert answer.status == status
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == kind and error["code"] == status
    assert message_part in error["message"]


def test_vllm_health_is_an_empty_200(vllm: FakeUpstream) -> None:
    health = call(vllm, path="/health", method="GET")
    assert (health.status, health.body) == (200, b"")


# ----------------------------------------------------------------------------- speed


def test_embed_ids_is_fast(dynamo: FakeUpstream) -> None:
    ids = list(range(20_000, 21_000))
    dynamo.embed_ids(ids)
    best = min(_timed(lambda: dynamo.embed_ids(ids)) for _ in range(5))
    assert best < 0.010


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started
