"""The seed's section-4 table, flipped, against a real vLLM and a real Dynamo 1.6.1
serving all-MiniLM-L6-v2 on this CPU, through the real gateway. Each check runs
against both upstreams (the `upstream` fixture is parametrised)."""

from __future__ import annotations

import base64
import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transformers import AutoTokenizer

from testing_support.gateway import Gateway
from testing_support.http import Reply, http
from testing_support.real_upstream import MAX_MODEL_LEN, SERVED_MODEL, RealEnv, Stack

REPO = Path(__file__).resolve().parents[2]
ENVELOPE_KEYS = {"message", "type", "param", "code"}
LONG_TEXT = " ".join(
    f"Paragraph {i}: the harbour lights flickered as the ferry crossed the bay at dusk."
    for i in range(60)
)  # ~1,100 tokens: over the 256-token limit


def direct(stack: Stack, body: dict[str, Any]) -> Reply:
    return http("POST", f"{stack.url}/v1/embeddings", body)


def vectors(reply: Reply) -> np.ndarray[Any, Any]:
    assert reply.status == 200, reply.body[:500]
    rows = []
    for item in sorted(reply.json()["data"], key=lambda d: d["index"]):
        emb = item["embedding"]
        if isinstance(emb, str):
            rows.append(np.frombuffer(base64.b64decode(emb), dtype="<f4").astype(np.float64))
        else:
            rows.append(np.asarray(emb, dtype=np.float64))
    return np.vstack(rows)


def cosines(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.sum(a * b, axis=1)


def envelope(reply: Reply, status: int) -> dict[str, Any]:
    assert reply.status == status, reply.body[:500]
    doc = reply.json()
    assert set(doc) == {"error"} and set(doc["error"]) == ENVELOPE_KEYS, doc
    return dict(doc["error"])


@cache
def legacy_tokenizer(model_dir: str) -> Any:
    # The independent oracle: transformers' own truncation, as a legacy server did it.
    return AutoTokenizer.from_pretrained(model_dir)


def legacy_truncated_ids(env: RealEnv, text: str) -> list[int]:
    tok = legacy_tokenizer(str(env.model_dir))
    return list(tok(text, truncation=True, max_length=MAX_MODEL_LEN)["input_ids"])


# -- the flipped table ---------------------------------------------------------------


def test_dimensions_native_is_200(upstream: Stack, gateway: Gateway) -> None:
    body = {"model": SERVED_MODEL, "input": ["hello", "world"], "dimensions": 384}
    raw = direct(upstream, body)
    # What clients got before: 400 from this vLLM (not started Matryoshka). The tier's
    # Dynamo worker is started Matryoshka (as compose starts it) and accepts it; one
    # that is not answers 500 (docs/upstreams.md).
    assert raw.status == (400 if upstream.kind == "vllm" else 200)
    via = gateway.embeddings(body)
    plain = vectors(direct(upstream, {"model": SERVED_MODEL, "input": ["hello", "world"]}))
    assert np.all(cosines(vectors(via), plain) >= 0.99999)


def test_dimensions_below_native_are_renormalised(upstream: Stack, mrl_gateway: Gateway) -> None:
    texts = ["the cat sat on the mat", "embeddings in the mesh"]
    native = vectors(direct(upstream, {"model": SERVED_MODEL, "input": texts}))
    reply = mrl_gateway.embeddings({"model": SERVED_MODEL, "input": texts, "dimensions": 128})
    got = vectors(reply)
    assert got.shape == (2, 128)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    expected = native[:, :128] / np.linalg.norm(native[:, :128], axis=1, keepdims=True)
    assert np.all(cosines(got, expected) >= 0.99999)


def test_query_prompt_reaches_the_model(upstream: Stack, mrl_gateway: Gateway) -> None:
    query = "how do I reset my password"
    via = vectors(
        mrl_gateway.embeddings({"model": SERVED_MODEL, "input": [query], "input_type": "query"})
    )
    prefixed = vectors(direct(upstream, {"model": SERVED_MODEL, "input": [f"query: {query}"]}))
    bare = vectors(direct(upstream, {"model": SERVED_MODEL, "input": [query]}))
    assert cosines(via, prefixed)[0] >= 0.99999
    assert cosines(via, bare)[0] < 0.999  # the prompt really changed what was embedded


def test_over_limit_input_is_truncated_not_rejected(
    upstream: Stack, gateway: Gateway, env: RealEnv
) -> None:
    raw = direct(upstream, {"model": SERVED_MODEL, "input": [LONG_TEXT]})
    assert raw.status == (400 if upstream.kind == "vllm" else 500)
    via = gateway.embeddings({"model": SERVED_MODEL, "input": [LONG_TEXT, "short"]})
    ids = legacy_truncated_ids(env, LONG_TEXT)
    assert len(ids) == MAX_MODEL_LEN
    expected = vectors(direct(upstream, {"model": SERVED_MODEL, "input": [ids]}))
    got = vectors(via)
    assert cosines(got[:1], expected)[0] >= 0.99999
    assert via.json()["usage"]["prompt_tokens"] == MAX_MODEL_LEN + len(
        legacy_truncated_ids(env, "short")
    )


def test_base64_is_little_endian_float32(upstream: Stack, gateway: Gateway) -> None:
    body = {"model": SERVED_MODEL, "input": ["bit exact"]}
    floats = vectors(direct(upstream, body)).astype(np.float32)
    via = gateway.embeddings({**body, "encoding_format": "base64"})
    assert isinstance(via.json()["data"][0]["embedding"], str)
    np.testing.assert_allclose(vectors(via).astype(np.float32), floats, rtol=0, atol=1e-6)


# -- emulated Matryoshka equals vLLM's own ---------------------------------------------


@pytest.mark.parametrize("dimensions", [128, 256])
def test_emulated_matryoshka_equals_native(
    vllm_matryoshka: Stack, mrl_gateway: Gateway, dimensions: int
) -> None:
    texts = [
        json.loads(line)["text"]
        for line in (REPO / "extproc" / "data" / "corpus.jsonl").read_text().splitlines()[:8]
    ]
    native = vectors(
        direct(vllm_matryoshka, {"model": SERVED_MODEL, "input": texts, "dimensions": dimensions})
    )
    emulated = vectors(
        mrl_gateway.embeddings({"model": SERVED_MODEL, "input": texts, "dimensions": dimensions})
    )
    assert emulated.shape == native.shape == (8, dimensions)
    assert np.all(cosines(emulated, native) >= 0.9999)


# -- parity with no rewrite ---------------------------------------------------------------


def test_parity_without_rewrite(upstream: Stack, gateway: Gateway) -> None:
    docs = [
        json.loads(line)
        for line in (REPO / "extproc" / "data" / "corpus.jsonl").read_text().splitlines()
    ]
    texts = [d["text"] for d in docs if d["kind"] == "document"]
    assert len(texts) == 40
    tokens_direct = tokens_via = 0
    for i in range(0, 40, 8):
        body = {"model": SERVED_MODEL, "input": texts[i : i + 8]}
        a, b = direct(upstream, body), gateway.embeddings(body)
        assert np.all(cosines(vectors(a), vectors(b)) >= 0.99999)
        tokens_direct += a.json()["usage"]["prompt_tokens"]
        tokens_via += b.json()["usage"]["prompt_tokens"]
    assert tokens_direct == tokens_via


# -- errors ---------------------------------------------------------------------------------

CLIENT_MISTAKES = [
    (
        "dimensions-not-matryoshka",
        {"model": SERVED_MODEL, "input": "x", "dimensions": 256},
        400,
        "dimensions",
    ),
    (
        "dimensions-too-big",
        {"model": SERVED_MODEL, "input": "x", "dimensions": 512},
        400,
        "dimensions",
    ),
    (
        "truncate-too-big",
        {"model": SERVED_MODEL, "input": "x", "truncate_prompt_tokens": 300},
        400,
        "truncate_prompt_tokens",
    ),
    ("unknown-model", {"model": "wrong-name", "input": "x"}, 404, "model"),
    ("empty-input", {"model": SERVED_MODEL, "input": []}, 400, "input"),
    (
        "bad-encoding",
        {"model": SERVED_MODEL, "input": "x", "encoding_format": "bytes"},
        400,
        "encoding_format",
    ),
]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [c[1:] for c in CLIENT_MISTAKES],
    ids=[c[0] for c in CLIENT_MISTAKES],
)
def test_client_mistakes_get_a_4xx_envelope(
    upstream: Stack, gateway: Gateway, body: dict[str, Any], status: int, param: str
) -> None:
    error = envelope(gateway.embeddings(body), status)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


def test_malformed_json_names_the_reason(gateway: Gateway) -> None:
    error = envelope(gateway.embeddings(b'{"model": "all-MiniLM-L6-v2", "input": '), 400)
    assert "JSON" in error["message"]
