"""The embeddings dialects on the core alone (sans-I/O): each one's request read into
what the upstream is asked (prompts, truncation, Matryoshka sizes, the raw-vector
switch), each one's answer written from an upstream's answer (keys in order, values
exactly), its errors in its own words, shape and status, and the policy's rules for
the paths they serve."""

from __future__ import annotations

import base64
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from extproc.core.api_errors import ApiError
from extproc.core.contract import Contract
from extproc.core.endpoint import ClientAnswer, Forward
from extproc.core.plan import ResponsePlan
from extproc.core.policy import PolicyError, load_policy_text
from extproc.service.contract_loading import load_contract
from testing_support.qwen import QWEN_EOS, QWEN_MODEL

QUERY_PROMPT = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)
ALL = """
    serves:
      - dialect: TEI
      - dialect: TEI
        path: /
      - dialect: COHERE_V1
      - dialect: COHERE_V2
      - dialect: OLLAMA
      - dialect: OLLAMA_EMBEDDINGS
        normalized: false
      - dialect: JINA
"""


def policy_text(kind: str = "vllm", serves: str = ALL, extra: str = "") -> str:
    return f"""
models:
  - name: {QWEN_MODEL}
    preset: qwen3-embedding-0.6b
    max_tokens: 48
    encoding_profile: OPENAI
    upstream: {{kind: {kind}}}
    other_names: [qwen3]
    matryoshka: {{min_dimensions: 32}}
{extra}{serves}"""


def contract(qwen_dir: Path, kind: str = "vllm", **kwargs: str) -> Contract:
    text = policy_text(kind, **kwargs)
    return load_contract(load_policy_text(text, tokenizer_overrides={QWEN_MODEL: qwen_dir}))


@pytest.fixture(scope="module")
def vllm(qwen_dir: Path) -> Contract:
    return contract(qwen_dir, extra="    quantization: {scaling: SYMMETRIC}\n")


@pytest.fixture(scope="module")
def dynamo(qwen_dir: Path) -> Contract:
    """Every dialect but Ollama's older route, whose vectors Dynamo cannot give."""
    serves = ALL.replace("      - dialect: OLLAMA_EMBEDDINGS\n        normalized: false\n", "")
    return contract(qwen_dir, "dynamo", serves=serves)


def test_a_raw_route_on_dynamo_is_refused_at_load(qwen_dir: Path) -> None:
    with pytest.raises(PolicyError, match=r"serves\[5\]\.normalized: dynamo gives no vectors"):
        contract(qwen_dir, "dynamo")


def ask(c: Contract, path: str, body: dict[str, Any] | bytes) -> Forward[ResponsePlan]:
    endpoint = c.routes.at(path)
    assert endpoint is not None, path
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    forward: Forward[ResponsePlan] = endpoint.forward(raw, c, clock=time.monotonic)
    return forward


def sent(forward: Forward[ResponsePlan]) -> dict[str, Any]:
    assert forward.upstream_body is not None
    doc: dict[str, Any] = orjson.loads(forward.upstream_body)
    return doc


def refused(c: Contract, path: str, body: dict[str, Any] | bytes) -> tuple[int, Any]:
    endpoint = c.routes.at(path)
    assert endpoint is not None
    with pytest.raises(ApiError) as caught:
        ask(c, path, body)
    status, out = endpoint.errors.answer(caught.value)
    return status, orjson.loads(out)


VECTORS = np.asarray([np.linspace(-1, 1, 1024), np.linspace(1, -1, 1024) ** 3], dtype=np.float32)
UNIT = VECTORS / np.linalg.norm(VECTORS, axis=1, keepdims=True)


def upstream_answer(rows: np.ndarray, tokens: int = 9) -> bytes:
    """vLLM's answer to a base64 request (what the gateway asks when it rewrites)."""
    data = [
        {"object": "embedding", "index": i, "embedding": base64.b64encode(r.tobytes()).decode()}
        for i, r in enumerate(rows.astype("<f4"))
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return orjson.dumps(
        {"id": "x", "object": "list", "data": data, "model": QWEN_MODEL, "usage": usage}
    )


def answer(c: Contract, path: str, forward: Forward[ResponsePlan], rows: np.ndarray) -> Any:
    endpoint = c.routes.at(path)
    assert endpoint is not None
    written = endpoint.answer(forward.plan, 200, upstream_answer(rows), clock=time.monotonic)
    assert isinstance(written, ClientAnswer) and written.status == 200
    return orjson.loads(written.body)


# -- TEI -------------------------------------------------------------------------------


def test_tei_reads_inputs_prompt_name_and_truncation(vllm: Contract) -> None:
    forward = ask(vllm, "/embed", {"inputs": ["a b", "c"], "prompt_name": "query"})
    assert sent(forward)["input"] == [QUERY_PROMPT + "a b", QUERY_PROMPT + "c"]
    assert sent(forward)["model"] == QWEN_MODEL  # its requests name none: the path's
    cut = ask(
        vllm, "/embed", {"inputs": "w " * 80, "truncate": True, "truncation_direction": "Left"}
    )
    (ids,) = sent(cut)["input"]
    assert len(ids) == 48 and ids[-1] == QWEN_EOS  # cut on the left, the end kept


def test_tei_answers_a_list_of_vectors_even_for_one_string(vllm: Contract) -> None:
    forward = ask(vllm, "/", {"inputs": "one"})
    got = answer(vllm, "/", forward, UNIT[:1])
    assert isinstance(got, list) and len(got) == 1
    assert np.array_equal(np.asarray(got[0], dtype=np.float32), UNIT[0])


def test_tei_normalize_false_asks_vllm_for_the_pooled_vector(vllm: Contract) -> None:
    forward = ask(vllm, "/embed", {"inputs": ["one", "two"], "normalize": False})
    assert sent(forward)["use_activation"] is False
    got = answer(vllm, "/embed", forward, VECTORS)
    assert np.allclose(np.linalg.norm(np.asarray(got), axis=1), np.linalg.norm(VECTORS, axis=1))


def test_tei_errors_are_teis(vllm: Contract, dynamo: Contract) -> None:
    assert refused(vllm, "/embed", {"inputs": "w " * 80, "truncate": False}) == (
        413,
        {
            "error": "'inputs' is longer than the model's 48 tokens (prompt and special "
            "tokens included); send it shorter.",
            "error_type": "Validation",
        },
    )
    status, body = refused(vllm, "/embed", {"prompt_name": "query"})
    assert (status, body["error"]) == (422, "Missing required parameter: 'inputs'.")
    status, body = refused(vllm, "/embed", {"inputs": "a", "truncation_direction": "up"})
    assert (status, list(body)) == (422, ["error", "error_type"])
    status, body = refused(dynamo, "/embed", {"inputs": "a", "normalize": False})
    assert status == 422 and "normalisation" in body["error"]


# -- Cohere ----------------------------------------------------------------------------


def test_cohere_maps_input_types_truncate_and_sizes(vllm: Contract) -> None:
    query = ask(vllm, "/v1/embed", {"texts": ["x"], "input_type": "search_query"})
    assert sent(query)["input"] == [QUERY_PROMPT + "x"]
    # A symmetric task with no template of its own: embedded as a document (no prompt).
    clustering = ask(vllm, "/v1/embed", {"texts": ["x"], "input_type": "clustering"})
    assert sent(clustering)["input"] == ["x"]
    start = ask(vllm, "/v2/embed", {"model": "qwen3", "texts": ["w " * 80], "truncate": "START"})
    assert sent(start)["input"][0][-1] == QWEN_EOS
    capped = ask(vllm, "/v2/embed", {"model": "qwen3", "texts": ["w " * 80], "max_tokens": 8})
    assert len(sent(capped)["input"][0]) == 8
    sized = ask(vllm, "/v2/embed", {"model": "qwen3", "texts": ["x"], "output_dimension": 256})
    assert sized.plan.dimensions == 256


def test_cohere_v1_answers_floats_without_types(vllm: Contract) -> None:
    forward = ask(vllm, "/v1/embed", {"texts": ["a", "b"]})
    got = answer(vllm, "/v1/embed", forward, UNIT)
    assert list(got) == ["id", "embeddings", "texts", "meta", "response_type"]
    assert got["response_type"] == "embeddings_floats" and got["texts"] == ["a", "b"]
    assert np.array_equal(np.asarray(got["embeddings"], dtype=np.float32), UNIT)
    assert got["meta"] == {"api_version": {"version": "1"}, "billed_units": {"input_tokens": 9}}


def test_cohere_v2_answers_each_type_asked(vllm: Contract) -> None:
    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    body = {"model": "qwen3", "texts": ["a", "b"], "embedding_types": types}
    got = answer(vllm, "/v2/embed", ask(vllm, "/v2/embed", body), UNIT)
    assert got["response_type"] == "embeddings_by_type"
    by_type = got["embeddings"]
    assert list(by_type) == types
    assert by_type["int8"] == np.rint(np.clip(UNIT, -1, 1) * 127).astype(int).tolist()
    bits = np.packbits(UNIT > 0, axis=1).astype(int)
    assert by_type["ubinary"] == bits.tolist()
    assert by_type["binary"] == (bits - 128).tolist()
    assert [base64.b64decode(s) for s in by_type["base64"]] == [r.tobytes() for r in UNIT]
    assert got["meta"]["api_version"] == {"version": "2"}


def test_cohere_refuses_what_it_cannot_answer(vllm: Contract, dynamo: Contract) -> None:
    v2 = {"model": "qwen3", "texts": ["a"]}
    assert refused(dynamo, "/v2/embed", {**v2, "embedding_types": ["int8"]})[1] == {
        "message": f"int8 embeddings are not available for {QWEN_MODEL!r}: its policy names "
        "no quantisation rule; ask for float, binary or ubinary."
    }
    assert refused(vllm, "/v2/embed", {"texts": ["a"]}) == (
        400,
        {"message": "Missing required parameter: 'model'."},
    )
    assert refused(vllm, "/v2/embed", {"model": "nope", "texts": ["a"]})[0] == 404
    assert refused(vllm, "/v1/embed", {"texts": "a"}) == (
        400,
        {"message": "'texts' must be an array of strings."},
    )
    # OpenAI's names never reach a Cohere client: its own field's name instead.
    status, body = refused(vllm, "/v2/embed", {**v2, "output_dimension": 7})
    assert status == 400 and body["message"].startswith("'output_dimension' must be")
    status, body = refused(vllm, "/v1/embed", {"texts": ["a"], "input_type": "nope"})
    assert body["message"].startswith("Unsupported input_type 'nope'")


# -- Ollama ----------------------------------------------------------------------------


def test_ollama_embed_answers_its_fields_with_the_name_it_was_sent(vllm: Contract) -> None:
    forward = ask(vllm, "/api/embed", {"model": "qwen3", "input": ["a", "b"], "keep_alive": "5m"})
    assert set(sent(forward)) == {"model", "input", "encoding_format"}  # keep_alive is not
    got = answer(vllm, "/api/embed", forward, UNIT)
    assert list(got) == [
        "model",
        "embeddings",
        "total_duration",
        "load_duration",
        "prompt_eval_count",
    ]
    assert got["model"] == "qwen3" and got["prompt_eval_count"] == 9
    assert isinstance(got["total_duration"], int) and got["total_duration"] >= 0
    assert np.array_equal(np.asarray(got["embeddings"], dtype=np.float32), UNIT)


def test_ollama_older_route_is_one_pooled_vector(vllm: Contract) -> None:
    forward = ask(vllm, "/api/embeddings", {"model": "qwen3", "prompt": "a"})
    assert sent(forward)["use_activation"] is False  # the path's `normalized: false`
    got = answer(vllm, "/api/embeddings", forward, VECTORS[:1])
    assert list(got) == ["embedding"]
    assert np.array_equal(np.asarray(got["embedding"], dtype=np.float32), VECTORS[0])


def test_ollama_errors(vllm: Contract) -> None:
    assert (
        refused(vllm, "/api/embed", {"model": "qwen3", "input": "w " * 80, "truncate": False})[0]
        == 400
    )
    assert refused(vllm, "/api/embeddings", {"model": "qwen3", "prompt": ["a"]}) == (
        400,
        {"error": "'prompt' must be a string."},
    )
    assert refused(vllm, "/api/embed", {"input": "a"}) == (
        400,
        {"error": "Missing required parameter: 'model'."},
    )


# -- Jina ------------------------------------------------------------------------------


def test_jina_reads_task_objects_and_types(vllm: Contract) -> None:
    body = {
        "model": "qwen3",
        "input": [{"text": "a"}, "b"],
        "task": "retrieval.query",
        "embedding_type": ["float", "ubinary"],
    }
    forward = ask(vllm, "/v1/embeddings", body)
    assert sent(forward)["input"] == [QUERY_PROMPT + "a", QUERY_PROMPT + "b"]
    got = answer(vllm, "/v1/embeddings", forward, UNIT)
    item = got["data"][0]
    assert list(item["embedding"]) == ["float", "ubinary"]
    assert item["embedding"]["ubinary"] == np.packbits(UNIT[0] > 0).astype(int).tolist()
    single = ask(vllm, "/v1/embeddings", {**body, "embedding_type": "binary"})
    got = answer(vllm, "/v1/embeddings", single, UNIT)
    assert got["data"][1]["embedding"] == (np.packbits(UNIT[1] > 0).astype(int) - 128).tolist()


def test_an_openai_request_on_a_jina_path_is_openais(vllm: Contract) -> None:
    """No Jina field: the request and its plan are OpenAI's, which may travel."""
    forward = ask(vllm, "/v1/embeddings", {"model": QWEN_MODEL, "input": "a"})
    assert forward.plan.dialect == "openai" and forward.upstream_body is None
    assert ResponsePlan.from_json(forward.plan.to_json() or "") == forward.plan


def test_a_jina_plan_travels_with_its_answer_options(vllm: Contract) -> None:
    body = {"model": "qwen3", "input": "a", "embedding_type": ["binary", "float"]}
    plan = ask(vllm, "/v1/embeddings", body).plan
    text = plan.to_json()
    # The clock's reading stays behind: only a timed dialect's writer reads it, on
    # a route that carries the whole exchange.
    assert text is not None and ResponsePlan.from_json(text) == replace(plan, started=0.0)


def test_jina_refuses_late_chunking(vllm: Contract) -> None:
    status, body = refused(
        vllm, "/v1/embeddings", {"model": "qwen3", "input": "a", "late_chunking": True}
    )
    assert (status, body["error"]["param"]) == (400, "late_chunking")


# -- the policy's paths ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("serves", "message"),
    [
        ("      - dialect: TEI\n        path: /rerank\n", "is a reranker's path"),
        ("      - dialect: COHERE_V1\n        path: /v1/embeddings\n", "is OpenAI's"),
        (
            "      - dialect: TEI\n      - dialect: OLLAMA\n        path: /embed\n",
            "is tei's already",
        ),
        ("      - dialect: TEI\n        path: embed\n", "is not a path as routes compare it"),
    ],
)
def test_a_path_is_one_dialects(qwen_dir: Path, serves: str, message: str) -> None:
    rerank = "rerankers:\n  - name: r\n    dialect: TEI\n    tokenizer: {path: x}\n    upstream: {kind: vllm}\n"
    text = policy_text(serves="    serves:\n" + serves) + rerank
    with pytest.raises(PolicyError, match=message):
        load_policy_text(text, tokenizer_overrides={QWEN_MODEL: qwen_dir})


def test_a_tei_path_serves_one_model(qwen_dir: Path) -> None:
    one = policy_text(serves="    serves: [{dialect: TEI}]\n")
    other = one.replace(f"name: {QWEN_MODEL}", "name: other", 1).replace("models:\n", "", 1)
    other = other.replace("other_names: [qwen3]", "other_names: [q2]")
    with pytest.raises(PolicyError, match="tei requests name no model"):
        load_policy_text(one + other, tokenizer_overrides={QWEN_MODEL: qwen_dir, "other": qwen_dir})


def test_a_path_no_entry_serves_is_no_route(vllm: Contract, qwen_dir: Path) -> None:
    plain = contract(qwen_dir, serves="")
    assert plain.routes.at("/embed") is None and plain.routes.left_alone("/embed")
    assert vllm.routes.at("/embed") is not None and not vllm.routes.left_alone("/embed")


# -- the tools' side: each dialect's clients, written and read ----------------------


@pytest.mark.parametrize(
    "path", ["/embed", "/", "/v1/embed", "/v2/embed", "/api/embed", "/v1/embeddings"]
)
def test_what_the_tools_write_the_gateway_reads_and_back(vllm: Contract, path: str) -> None:
    endpoint = vllm.routes.at(path)
    assert endpoint is not None
    dialect = endpoint.dialect
    plain = {"model": "qwen3", "input": ["a", "b"], "input_type": "query"}
    if dialect.name == "ollama":
        plain.pop("input_type")  # Ollama has no role field: its writer says it cannot
        assert dialect.write_request({**plain, "input_type": "query"}) is None
    written = dialect.write_request(plain)
    assert written is not None
    forward = ask(vllm, path, written)
    expected = [QUERY_PROMPT + "a", QUERY_PROMPT + "b"] if "input_type" in plain else ["a", "b"]
    assert sent(forward)["input"] == expected
    upstream = upstream_answer(UNIT)
    reply = endpoint.answer(forward.plan, 200, upstream, clock=time.monotonic)
    # None: the upstream's answer goes as it is (an OpenAI request on a Jina path)
    read = dialect.read_answer(upstream if reply is None else reply.body)
    assert read is not None and np.array_equal(read.vectors, UNIT)


def test_the_older_ollama_route_says_one_text_only(vllm: Contract) -> None:
    endpoint = vllm.routes.at("/api/embeddings")
    assert endpoint is not None
    older = endpoint.dialect
    assert older.write_request({"model": "qwen3", "input": ["a", "b"]}) is None
    assert older.write_request({"model": "qwen3", "input": ["a"]}) == {
        "model": "qwen3",
        "prompt": "a",
    }


@pytest.mark.parametrize(
    "path", ["/embed", "/v1/embed", "/v2/embed", "/api/embed", "/api/embeddings"]
)
def test_a_dialect_reads_no_other_dialects_answer(vllm: Contract, path: str) -> None:
    """What learn's discovery rests on: an answer's shape names its dialect."""
    endpoint = vllm.routes.at(path)
    assert endpoint is not None
    written = endpoint.dialect.write_request({"model": "qwen3", "input": ["a"]})
    assert written is not None
    forward = ask(vllm, path, written)
    reply = endpoint.answer(forward.plan, 200, upstream_answer(UNIT[:1]), clock=time.monotonic)
    assert reply is not None
    readers = {
        other: vllm.routes.at(other)
        for other in ("/embed", "/v1/embed", "/api/embed", "/api/embeddings", "/v1/embeddings")
    }
    reading = {
        other: e.dialect.read_answer(reply.body) is not None
        for other, e in readers.items()
        if (
            e is not None
            and e.dialect.name not in (endpoint.dialect.name, "cohere_v1", "cohere_v2")
        )
        or other == path
    }
    assert reading.pop(path, True)
    assert not any(reading.values()), reading
