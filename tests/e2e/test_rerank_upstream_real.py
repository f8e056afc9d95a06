"""Reranking on the real servers: vLLM 0.32 serving the MiniLM cross-encoder
(`minilm-reranker`, made by scripts/setup-real-upstream.sh) and the two legacy rerank
servers over the same weights (tests/e2e/legacy_rerank_app.py: TEI's `/rerank`,
Cohere's v1 `/v1/rerank`).

What the project relies on: each legacy dialect answers as specified; vLLM's raw logit
(`use_activation: false`, on `/rerank` and on `/score`) is the legacy raw score of the
same pair; vLLM's default `relevance_score` is its sigmoid, the legacy relevance
score; `truncate_prompt_tokens: 256` cuts a pair as the legacy `truncate: true` does;
vLLM's answer keeps the shape measured in docs/upstreams.md ("Reranking").
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

import pytest

from testing_support.http import Reply, http
from testing_support.real_upstream import RERANKER_MODEL, Stack

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-4
LONG_TEXT = " ".join(["the harbour lights flickered as the ferry crossed the bay"] * 60)


def corpus(kind: str) -> list[str]:
    lines = (REPO / "extproc" / "data" / "corpus.jsonl").read_text().splitlines()
    return [row["text"] for row in map(json.loads, lines) if row["kind"] == kind]


# Two English and two Korean queries against the 40 documents of both languages: every
# pair fits in 256 tokens.
QUERIES = corpus("query")[:2] + corpus("query")[4:6]
DOCUMENTS = corpus("document")


def post(stack: Stack, path: str, body: dict[str, Any] | bytes) -> Reply:
    return http("POST", stack.url + path, body, timeout=120)


def ok(reply: Reply) -> Any:
    assert reply.status == 200, (reply.status, reply.body[:500])
    return reply.json()


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def by_index(results: list[dict[str, Any]], field: str) -> dict[int, float]:
    return {r["index"]: r[field] for r in results}


def assert_best_first(results: list[dict[str, Any]], field: str, count: int) -> None:
    scores = [r[field] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert sorted(r["index"] for r in results) == list(range(count))


def assert_close(a: dict[int, float], b: dict[int, float]) -> float:
    assert a.keys() == b.keys()
    worst = max(abs(a[i] - b[i]) for i in a)
    assert worst <= TOLERANCE, worst
    return worst


def tei_raw(tei: Stack, query: str, texts: list[str], **options: Any) -> dict[int, float]:
    body = {"query": query, "texts": texts, "raw_scores": True, **options}
    return by_index(ok(post(tei, "/rerank", body)), "score")


def vllm_rerank(vllm: Stack, query: str, documents: list[str], **options: Any) -> Any:
    body = {"model": RERANKER_MODEL, "query": query, "documents": documents, **options}
    return ok(post(vllm, "/rerank", body))


# ------------------------------------------------------------------ the legacy servers


def test_tei_dialect(legacy_tei_rerank: Stack) -> None:
    query, texts = QUERIES[0], DOCUMENTS[:8]
    answer = ok(post(legacy_tei_rerank, "/rerank", {"query": query, "texts": texts}))
    assert all(set(r) == {"index", "score"} for r in answer)
    assert_best_first(answer, "score", len(texts))
    assert all(0.0 < r["score"] < 1.0 for r in answer)

    body = {"query": query, "texts": texts, "raw_scores": True, "return_text": True}
    raw = ok(post(legacy_tei_rerank, "/rerank", body))
    assert_best_first(raw, "score", len(texts))
    assert all(r["text"] == texts[r["index"]] for r in raw)
    assert any(r["score"] < 0 for r in raw) or any(r["score"] > 1 for r in raw)  # logits
    scores = by_index(answer, "score")
    assert_close(scores, {r["index"]: sigmoid(r["score"]) for r in raw})


def test_tei_errors_and_truncation(legacy_tei_rerank: Stack) -> None:
    query = QUERIES[0]
    over = post(legacy_tei_rerank, "/rerank", {"query": query, "texts": [LONG_TEXT]})
    assert over.status == 413
    assert over.json()["error_type"] == "Validation"
    assert "256" in over.json()["error"]

    right = tei_raw(legacy_tei_rerank, query, [LONG_TEXT], truncate=True)
    left = tei_raw(
        legacy_tei_rerank, query, [LONG_TEXT], truncate=True, truncation_direction="Left"
    )
    assert abs(right[0] - left[0]) > 1e-3  # the side is applied

    for body in (
        {"query": query, "texts": []},
        {"query": query, "texts": "not a list"},
        {"query": query, "texts": ["a"], "truncation_direction": "right"},
        b'{"query": ',
    ):
        reply = post(legacy_tei_rerank, "/rerank", body)
        assert reply.status == 422, (body, reply.body)
        assert set(reply.json()) == {"error", "error_type"}
        assert reply.json()["error_type"] == "Validation"


def test_cohere_dialect(legacy_cohere_rerank: Stack, legacy_tei_rerank: Stack) -> None:
    query, texts = QUERIES[1], DOCUMENTS[:8]
    answer = ok(post(legacy_cohere_rerank, "/v1/rerank", {"query": query, "documents": texts}))
    assert set(answer) == {"id", "results", "meta"}
    uuid.UUID(answer["id"])
    assert answer["meta"] == {"api_version": {"version": "1"}}
    assert all(set(r) == {"index", "relevance_score"} for r in answer["results"])
    assert_best_first(answer["results"], "relevance_score", len(texts))
    raw = tei_raw(legacy_tei_rerank, query, texts)
    assert_close(
        by_index(answer["results"], "relevance_score"), {i: sigmoid(s) for i, s in raw.items()}
    )

    body = {
        "model": RERANKER_MODEL,
        "query": query,
        "documents": [{"text": t} for t in texts],
        "top_n": 3,
        "return_documents": True,
    }
    top = ok(post(legacy_cohere_rerank, "/v1/rerank", body))["results"]
    assert [r["index"] for r in top] == [r["index"] for r in answer["results"][:3]]
    assert all(r["document"] == {"text": texts[r["index"]]} for r in top)

    # an over-long pair is cut from the right, as TEI's `truncate: true`
    cut = ok(post(legacy_cohere_rerank, "/v1/rerank", {"query": query, "documents": [LONG_TEXT]}))
    truncated = tei_raw(legacy_tei_rerank, query, [LONG_TEXT], truncate=True)
    assert abs(cut["results"][0]["relevance_score"] - sigmoid(truncated[0])) <= TOLERANCE


def test_cohere_errors(legacy_cohere_rerank: Stack) -> None:
    query = QUERIES[1]
    unknown = post(
        legacy_cohere_rerank,
        "/v1/rerank",
        {"model": "rerank-english-v3.0", "query": query, "documents": ["a"]},
    )
    assert unknown.status == 404
    assert isinstance(unknown.json()["detail"], str)
    for body in (
        {"query": query, "documents": []},
        {"query": query, "documents": ["a"], "top_n": 0},
        {"documents": ["a"]},
        b'{"query": ',
    ):
        reply = post(legacy_cohere_rerank, "/v1/rerank", body)
        assert reply.status == 422, (body, reply.body)
        assert isinstance(reply.json()["detail"], list)


# ------------------------------------------------------------ vLLM against the legacy


def test_vllm_raw_logits_equal_legacy_raw_scores(
    vllm_reranker: Stack, legacy_tei_rerank: Stack
) -> None:
    worst = 0.0
    for query in QUERIES:
        legacy = tei_raw(legacy_tei_rerank, query, DOCUMENTS)
        rerank = vllm_rerank(vllm_reranker, query, DOCUMENTS, use_activation=False)
        worst = max(worst, assert_close(by_index(rerank["results"], "relevance_score"), legacy))
        score = ok(
            post(
                vllm_reranker,
                "/score",
                {
                    "model": RERANKER_MODEL,
                    "text_1": query,
                    "text_2": DOCUMENTS,
                    "use_activation": False,
                },
            )
        )
        worst = max(worst, assert_close(by_index(score["data"], "score"), legacy))
    print(f"\n[e2e] {len(QUERIES) * len(DOCUMENTS)} pairs: max |vLLM - legacy| logit {worst:.2e}")


def test_vllm_default_is_the_sigmoid(
    vllm_reranker: Stack, legacy_tei_rerank: Stack, legacy_cohere_rerank: Stack
) -> None:
    query = QUERIES[2]
    rerank = vllm_rerank(vllm_reranker, query, DOCUMENTS)
    assert_best_first(rerank["results"], "relevance_score", len(DOCUMENTS))
    scores = by_index(rerank["results"], "relevance_score")
    tei = by_index(
        ok(post(legacy_tei_rerank, "/rerank", {"query": query, "texts": DOCUMENTS})), "score"
    )
    cohere = ok(post(legacy_cohere_rerank, "/v1/rerank", {"query": query, "documents": DOCUMENTS}))
    assert_close(scores, tei)
    assert_close(scores, by_index(cohere["results"], "relevance_score"))


def test_vllm_truncation_is_the_legacy_right_cut(
    vllm_reranker: Stack, legacy_tei_rerank: Stack
) -> None:
    query, texts = QUERIES[0], [LONG_TEXT, DOCUMENTS[0]]
    refused = post(
        vllm_reranker,
        "/rerank",
        {"model": RERANKER_MODEL, "query": query, "documents": texts},
    )
    assert refused.status == 400
    error = refused.json()["error"]
    assert error["code"] == 400 and "maximum context length is 256" in error["message"]

    cut = vllm_rerank(vllm_reranker, query, texts, use_activation=False, truncate_prompt_tokens=256)
    legacy = tei_raw(legacy_tei_rerank, query, texts, truncate=True)
    assert_close(by_index(cut["results"], "relevance_score"), legacy)  # the short pair uncut
    alone = vllm_rerank(vllm_reranker, query, [LONG_TEXT], truncate_prompt_tokens=256)
    assert alone["usage"]["prompt_tokens"] == 256  # the pair is cut, not the document


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_vllm_rerank_shape(vllm_reranker: Stack, path: str) -> None:
    query, documents = QUERIES[3], DOCUMENTS[:6]
    full = vllm_rerank(vllm_reranker, query, documents, zzz_unknown=1, return_documents=False)
    assert set(full) == {"id", "model", "usage", "results"}
    assert full["model"] == RERANKER_MODEL
    assert_best_first(full["results"], "relevance_score", len(documents))
    assert all(r["document"]["text"] == documents[r["index"]] for r in full["results"])

    alias = ok(
        post(
            vllm_reranker,
            path,
            {"model": RERANKER_MODEL, "query": query, "documents": documents, "top_n": 2},
        )
    )
    assert [r["index"] for r in alias["results"]] == [r["index"] for r in full["results"][:2]]
    assert_close(
        by_index(alias["results"], "relevance_score"),
        {r["index"]: r["relevance_score"] for r in full["results"][:2]},
    )

    for body, status in (
        ({"model": "nope", "query": query, "documents": documents}, 404),
        ({"model": RERANKER_MODEL, "query": query, "documents": []}, 400),
        ({"model": RERANKER_MODEL, "query": query, "documents": [{"text": "a"}]}, 400),
    ):
        reply = post(vllm_reranker, path, body)
        assert reply.status == status, (body, reply.body[:300])
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
