"""The rerank contract on the core alone (sans-I/O): each dialect read and written,
what the upstream is asked, and what the client gets back (order, scores, top_n,
documents, errors), for vLLM's answer and Dynamo's bare array."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from extproc.core.api_errors import ApiError
from extproc.core.contract import Contract
from extproc.core.endpoint import ClientAnswer, Forward
from extproc.core.policy import PolicyError, load_policy_text
from extproc.core.request_headers import unknown_path
from extproc.core.tasks.rerank import RerankPlan
from extproc.service.contract_loading import load_contract
from tests.fake_rerank import write_word_tokenizer

WORDS = [f"w{i}" for i in range(400)]


@pytest.fixture(scope="module")
def pair_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT-style tokenizer ([CLS] a [SEP] b [SEP]), a word per token."""
    return write_word_tokenizer(tmp_path_factory.mktemp("pair-tokenizer"), WORDS)


def policy(entries: str, tokenizer: Path | None = None, top: str = "") -> Contract:
    overrides = {"ranker": tokenizer} if tokenizer is not None else {}
    text = top + "rerankers:\n" + entries
    return load_contract(load_policy_text(text, tokenizer_overrides=overrides))


TEI = """
  - name: ranker
    dialect: TEI
    upstream: {kind: vllm}
"""
COHERE = """
  - name: ranker
    upstream_model: up-ranker
    dialect: COHERE_V1
    top_n: 3
"""


def ask(c: Contract, path: str, body: dict[str, Any] | bytes) -> Forward[RerankPlan]:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    endpoint = c.routes.at(path)
    if endpoint is None:  # as the stream answers a path no endpoint serves
        raise unknown_path()
    forward: Forward[RerankPlan] = endpoint.forward(raw, c, clock=time.monotonic)
    return forward


def upstream_path(c: Contract, path: str) -> str:
    endpoint = c.routes.at(path)
    assert endpoint is not None, path
    return endpoint.upstream_path


def respond(c: Contract, path: str, plan: RerankPlan, status: int, body: bytes) -> ClientAnswer:
    endpoint = c.routes.at(path)
    assert endpoint is not None, path
    answer = endpoint.answer(plan, status, body)
    assert answer is not None
    return answer


def refused(c: Contract, path: str, body: dict[str, Any] | bytes) -> tuple[int, Any]:
    with pytest.raises(ApiError) as caught:
        ask(c, path, body)
    status, out = c.policy.errors.answer(caught.value)
    return status, orjson.loads(out)


def vllm_answer(logits: list[float]) -> bytes:
    """vLLM's /rerank answer with use_activation false: best first, documents included."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    results = [
        {"index": i, "document": {"text": f"doc {i}"}, "relevance_score": logits[i]} for i in order
    ]
    usage = {"prompt_tokens": 42, "total_tokens": 42}
    return orjson.dumps({"id": "rerank-1", "model": "m", "usage": usage, "results": results})


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


LOGITS = [0.5, -1.25, 2.0, 0.5]
DOCS = ["a b", "c", "d e f", "g"]


def test_tei_request_and_answer() -> None:
    c = policy(TEI)
    forward = ask(c, "/rerank", {"query": "q", "texts": DOCS})
    assert upstream_path(c, "/rerank") == "/rerank"
    sent = orjson.loads(forward.upstream_body)
    assert sent == {"model": "ranker", "query": "q", "documents": DOCS, "use_activation": False}
    answer = respond(c, "/rerank", forward.plan, 200, vllm_answer(LOGITS))
    got = orjson.loads(answer.body)
    # best first; the tie (0.5) to the earlier document; the sigmoid (TEI's default)
    assert [r["index"] for r in got] == [2, 0, 3, 1]
    assert [r["score"] for r in got] == pytest.approx(
        [sig(LOGITS[i]) for i in (2, 0, 3, 1)], abs=1e-12
    )
    assert all(set(r) == {"index", "score"} for r in got)
    raw = ask(c, "/rerank", {"query": "q", "texts": DOCS, "raw_scores": True, "return_text": True})
    got = orjson.loads(respond(c, "/rerank", raw.plan, 200, vllm_answer(LOGITS)).body)
    assert [r["score"] for r in got] == [2.0, 0.5, 0.5, -1.25]
    assert [r["text"] for r in got] == ["d e f", "a b", "g", "c"]


def test_cohere_request_and_answer() -> None:
    c = policy(COHERE)
    body = {"model": "ranker", "query": "q", "documents": ["a b", {"text": "c"}, "d e f", "g"]}
    forward = ask(c, "/v1/rerank", {**body, "return_documents": True})
    assert orjson.loads(forward.upstream_body)["model"] == "up-ranker"
    got = orjson.loads(respond(c, "/v1/rerank", forward.plan, 200, vllm_answer(LOGITS)).body)
    assert set(got) == {"id", "results", "meta"} and got["meta"] == {
        "api_version": {"version": "1"}
    }
    results = got["results"]
    assert [r["index"] for r in results] == [2, 0, 3]  # the policy's top_n
    assert results[0] == {
        "index": 2,
        "relevance_score": pytest.approx(sig(2.0)),
        "document": {"text": "d e f"},
    }
    top1 = ask(c, "/v1/rerank", {**body, "top_n": 1})
    got = orjson.loads(respond(c, "/v1/rerank", top1.plan, 200, vllm_answer(LOGITS)).body)
    assert [r["index"] for r in got["results"]] == [2] and "document" not in got["results"][0]


def test_raw_legacy_scores_and_jina_and_v2() -> None:
    c = policy(
        COHERE.replace("COHERE_V1", "JINA")
        + "    scores: RAW\n"
        + """  - name: v2ranker
    dialect: COHERE_V2
"""
    )
    body = {"model": "ranker", "query": "q", "documents": DOCS}
    forward = ask(c, "/v1/rerank", body)
    got = orjson.loads(respond(c, "/v1/rerank", forward.plan, 200, vllm_answer(LOGITS)).body)
    assert set(got) == {"model", "usage", "results"} and got["usage"] == {"total_tokens": 42}
    assert [r["relevance_score"] for r in got["results"]] == [2.0, 0.5, 0.5]  # raw, top 3
    assert got["results"][0]["document"] == {"text": "d e f"}  # Jina returns them by default
    v2 = ask(c, "/v2/rerank", {"model": "v2ranker", "query": "q", "documents": DOCS})
    got = orjson.loads(respond(c, "/v2/rerank", v2.plan, 200, vllm_answer(LOGITS)).body)
    assert got["meta"]["api_version"]["version"] == "2" and len(got["results"]) == 4
    # Cohere v2's per-document cut is the upstream's; nonsense is the client's mistake.
    cut = {"model": "v2ranker", "query": "q", "documents": DOCS, "max_tokens_per_doc": 3}
    assert orjson.loads(ask(c, "/v2/rerank", cut).upstream_body)["max_tokens_per_doc"] == 3
    for bad in (0, -1, "3", True):
        status, error = refused(c, "/v2/rerank", {**cut, "max_tokens_per_doc": bad})
        assert status == 400 and error["error"]["param"] == "max_tokens_per_doc", bad
    dynamo = policy("""  - name: v2ranker
    dialect: COHERE_V2
    upstream: {kind: dynamo}
""")
    status, error = refused(dynamo, "/v2/rerank", cut)
    assert status == 400 and "max_tokens_per_doc" in error["error"]["message"]


def test_dynamos_bare_array() -> None:
    """Dynamo's SGLang answer: sigmoid scores in a bare array, no raw switch; turned
    back into logits for a client that wants them."""
    c = policy(TEI.replace("kind: vllm", "kind: dynamo"))
    forward = ask(c, "/rerank", {"query": "q", "texts": DOCS, "raw_scores": True})
    assert upstream_path(c, "/rerank") == "/v1/rerank"
    assert orjson.loads(forward.upstream_body)["return_documents"] is False
    bare = orjson.dumps([{"index": i, "score": sig(x)} for i, x in enumerate(LOGITS)])
    got = orjson.loads(respond(c, "/rerank", forward.plan, 200, bare).body)
    assert [r["score"] for r in got] == pytest.approx([2.0, 0.5, 0.5, -1.25], abs=1e-9)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{", None),
        ({"texts": ["a"]}, "query"),
        ({"query": "", "texts": ["a"]}, "query"),
        ({"query": "q", "texts": []}, "texts"),
        ({"query": "q", "texts": ["a", 1]}, "texts"),
        ({"query": "q", "texts": ["a"], "raw_scores": "yes"}, "raw_scores"),
        ({"query": "q", "texts": ["a"], "truncation_direction": "Up"}, "truncation_direction"),
    ],
)
def test_tei_mistakes_in_teis_error_shape(body: Any, param: str | None) -> None:
    c = policy(TEI, top="errors: {shape: TEI, status: {malformed: 422, invalid: 422}}\n")
    status, got = refused(c, "/rerank", body)
    assert (
        status == 422 and set(got) == {"error", "error_type"} and got["error_type"] == "Validation"
    )


def test_models_and_paths() -> None:
    c = policy(COHERE + COHERE.replace("name: ranker", "name: other"))
    assert (
        refused(c, "/v1/rerank", {"query": "q", "documents": ["a"]})[1]["error"]["param"] == "model"
    )
    status, got = refused(c, "/v1/rerank", {"model": "nope", "query": "q", "documents": ["a"]})
    assert status == 404 and got["error"]["code"] == "model_not_found"
    assert refused(c, "/v2/rerank", {"query": "q", "documents": ["a"]})[0] == 404
    status, _ = refused(
        c, "/v1/rerank", {"model": "ranker", "query": "q", "documents": ["a"], "top_n": 0}
    )
    assert status == 400


def test_upstream_errors_and_bad_answers() -> None:
    c = policy(TEI, top="errors: {shape: TEI}\n")
    plan = ask(c, "/rerank", {"query": "q", "texts": DOCS}).plan
    for status, body, want in (
        (500, b'{"message": "boom"}', 500),
        (404, b"", 503),
        (400, b'{"error": {"message": "too long"}}', 400),
        (200, b'{"results": [{"index": 0, "relevance_score": 1.0}]}', 502),  # one of four
        (200, b"[]", 502),
        (200, b"not json", 502),
    ):
        answer = respond(c, "/rerank", plan, status, body)
        assert answer.status == want, (status, body)
        assert set(orjson.loads(answer.body)) == {"error", "error_type"}


def test_long_pairs_cut_or_refused(pair_tokenizer: Path) -> None:
    entry = TEI + "    max_tokens: 20\n    tokenizer: {path: x}\n"
    c = policy(entry, pair_tokenizer)
    short = {"query": "w1 w2", "texts": ["w3 w4", "w5"]}
    assert "truncate_prompt_tokens" not in orjson.loads(ask(c, "/rerank", short).upstream_body)
    long = {"query": "w1 w2", "texts": ["w3", " ".join(WORDS[:30])]}  # 2 + 30 + 3 > 20
    assert orjson.loads(ask(c, "/rerank", long).upstream_body)["truncate_prompt_tokens"] == 20
    status, got = refused(c, "/rerank", {**long, "truncate": False})
    assert status == 413 and "20" in got["error"]["message"]
    at_limit = {"query": "w1 w2", "texts": [" ".join(WORDS[:15])]}  # 2 + 15 + 3 = 20
    assert "truncate_prompt_tokens" not in orjson.loads(ask(c, "/rerank", at_limit).upstream_body)
    refusing = policy(entry + "    truncation: {refuse: true}\n", pair_tokenizer)
    assert refused(refusing, "/rerank", long)[0] == 413
    assert "truncate_prompt_tokens" in orjson.loads(
        ask(refusing, "/rerank", {**long, "truncate": True}).upstream_body
    )
    # A left cut the upstream cannot make is refused, and only when a pair is cut.
    status, got = refused(c, "/rerank", {**long, "truncation_direction": "Left"})
    assert status == 400 and got["error"]["param"] == "truncation_direction"
    assert "from the right" in got["error"]["message"]
    assert ask(c, "/rerank", {**short, "truncation_direction": "Left"}).plan.input_count == 2


@pytest.mark.parametrize(
    ("entries", "field"),
    [
        ("  - name: r\n", "rerankers[0].dialect"),
        ("  - name: r\n    dialect: TEI\n    path: /v1/embeddings\n", "rerankers[0].path"),
        (
            "  - name: r\n    dialect: TEI\n    upstream: {kind: tei}\n",
            "rerankers[0].upstream.kind",
        ),
        ("  - name: r\n    dialect: TEI\n    max_tokens: 10\n", "rerankers[0].tokenizer"),
        (
            "  - name: r\n    dialect: TEI\n  - name: s\n    dialect: COHERE_V1\n    path: /rerank\n",
            "rerankers[1].dialect",
        ),
    ],
)
def test_bad_rerankers_are_named(entries: str, field: str) -> None:
    with pytest.raises(PolicyError, match=field.replace(".", r"\.").replace("[", r"\[")):
        policy(entries)
