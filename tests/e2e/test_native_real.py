"""Native Matryoshka on a real vLLM and a real Dynamo 1.6.1 whose workers were started
with `--hf-overrides '{"is_matryoshka": true}'`.

A native policy (`upstream.native.dimensions`: all-minilm-l6-v2-native.yaml, and for
Dynamo the same with `kind: dynamo`) forwards `dimensions` to the upstream, which cuts
and re-normalises; the emulating policy (all-minilm-l6-v2-matryoshka.yaml) asks for
the whole vectors and cuts them in the gateway. Both gateways stand in front of the
same upstream: the answers must agree, a bad size must never reach it, and the native
request must ride one ext_proc message.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from testing_support.gateway import Gateway, GatewaySpec
from testing_support.http import Reply, http, metric_value
from testing_support.real_upstream import SERVED_MODEL, RealEnv, Stack
from tests.e2e.conftest import MATRYOSHKA_POLICY, minilm
from tests.harness import Gateways

REPO = Path(__file__).resolve().parents[2]
NATIVE_POLICY = REPO / "extproc" / "policies" / "all-minilm-l6-v2-native.yaml"
ADMIN = re.compile(r"admin 127\.0\.0\.1:(\d+)")


@pytest.fixture(scope="module")
def native_and_emulated(
    vllm_matryoshka: Stack, env: RealEnv, gateways: Gateways
) -> tuple[Gateway, Gateway]:
    """Started once, stopped with the session's other gateways."""
    return (
        gateways.shared(minilm(vllm_matryoshka, NATIVE_POLICY, env)),
        gateways.shared(minilm(vllm_matryoshka, MATRYOSHKA_POLICY, env)),
    )


def msgs_sent(gw: Gateway) -> int:
    match = ADMIN.search(gw.ready_line)
    assert match, gw.ready_line
    url = f"http://127.0.0.1:{match.group(1)}/stats?format=json&filter=ext_proc.stream_msgs_sent"
    return sum(int(s.get("value", 0)) for s in http("GET", url, timeout=5).json()["stats"])


def vectors(doc: Any) -> np.ndarray[Any, Any]:
    rows = sorted(doc["data"], key=lambda d: d["index"])
    return np.asarray([r["embedding"] for r in rows], dtype=np.float64)


def corpus_texts(count: int) -> list[str]:
    lines = (REPO / "extproc" / "data" / "corpus.jsonl").read_text().splitlines()
    return [json.loads(line)["text"] for line in lines[:count]]


@pytest.mark.parametrize("dimensions", [128, 256])
def test_native_dimensions_equal_emulated(
    native_and_emulated: tuple[Gateway, Gateway], dimensions: int
) -> None:
    native_gw, emulated_gw = native_and_emulated
    body = {"model": SERVED_MODEL, "input": corpus_texts(8), "dimensions": dimensions}

    before = msgs_sent(native_gw)
    native = native_gw.embeddings(body)
    assert native.status == 200, native.body[:500]
    assert msgs_sent(native_gw) - before == 1  # no response phase
    emulated = emulated_gw.embeddings(body)
    assert emulated.status == 200, emulated.body[:500]

    a, b = vectors(native.json()), vectors(emulated.json())
    assert a.shape == b.shape == (8, dimensions)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    cosines = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert np.all(cosines >= 0.99999), cosines
    assert native.json()["usage"] == emulated.json()["usage"]


def test_native_refuses_like_emulated(native_and_emulated: tuple[Gateway, Gateway]) -> None:
    """Out of range: the gateway's own 400, never vLLM's, on both policies."""
    native_gw, emulated_gw = native_and_emulated
    body = {"model": SERVED_MODEL, "input": "hello", "dimensions": 385}
    native, emulated = native_gw.embeddings(body), emulated_gw.embeddings(body)
    assert native.status == emulated.status == 400
    assert native.json() == emulated.json()
    assert native.json()["error"]["param"] == "dimensions"


# -- Dynamo 1.6.1, its worker started Matryoshka ---------------------------------------

# An entry for the same upstream model that accepts only a declared set of sizes, which
# the worker itself would not enforce (it takes 1..384).
SIZES_MODEL = "all-MiniLM-L6-v2-sizes"
DECLARED_SIZES = [64, 128, 256]
TOKENIZER_ID = "sentence-transformers/all-MiniLM-L6-v2"
ENVELOPE_KEYS = {"message", "type", "param", "code"}
# Dynamo's generic 500 (docs/upstreams.md), for a size over the native one.
DYNAMO_500 = {"message": "Internal server error", "type": "Internal Server Error", "code": 500}
BAD_SIZES = [
    ("zero", SERVED_MODEL, 0),
    ("negative", SERVED_MODEL, -1),
    ("over-native", SERVED_MODEL, 385),
    ("fraction", SERVED_MODEL, 256.5),
    ("string", SERVED_MODEL, "x"),
    ("not-declared", SIZES_MODEL, 100),
]


def dynamo_native_policy() -> str:
    """all-minilm-l6-v2-native.yaml with `kind: dynamo`, plus ``SIZES_MODEL``."""
    doc = yaml.safe_load(NATIVE_POLICY.read_text())
    [model] = doc["models"]
    assert model["upstream"] == {"kind": "vllm", "native": {"dimensions": True}}
    model["upstream"] = {"kind": "dynamo", "native": {"dimensions": True}}
    doc["models"].append(
        {
            **model,
            "name": SIZES_MODEL,
            "upstream_model": SERVED_MODEL,
            "matryoshka": {"allowed": DECLARED_SIZES},
        }
    )
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture(scope="module")
def dynamo_native_and_emulated(
    dynamo: Stack, env: RealEnv, gateways: Gateways
) -> tuple[Gateway, Gateway]:
    """The native and the emulating gateway in front of the tier's one Dynamo (the
    emulating one is the contract tests' `mrl_gateway` when they started it)."""
    native = GatewaySpec(
        dynamo.url, policy=dynamo_native_policy(), tokenizers=f"{TOKENIZER_ID}={env.model_dir}"
    )
    return gateways.shared(native), gateways.shared(minilm(dynamo, MATRYOSHKA_POLICY, env))


def ext_proc_counts(gw: Gateway) -> tuple[int, int]:
    """Envoy's ext_proc streams started and messages sent, over all its ext_proc filters."""
    match = ADMIN.search(gw.ready_line)
    assert match, gw.ready_line
    url = f"http://127.0.0.1:{match.group(1)}/stats?format=json&filter=ext_proc"
    stats = {
        s["name"]: int(s["value"])
        for s in http("GET", url, timeout=5).json()["stats"]
        if "value" in s
    }
    return (
        sum(v for k, v in stats.items() if k.endswith(".ext_proc.streams_started")),
        sum(v for k, v in stats.items() if k.endswith(".ext_proc.stream_msgs_sent")),
    )


def dynamo_seen(stack: Stack) -> float:
    """Requests Dynamo's frontend counted: those it started, and its failures (a body
    it cannot deserialize fails without being started)."""
    text = http("GET", f"{stack.url}/metrics", timeout=5).body.decode()
    return metric_value(text, "dynamo_frontend_requests_started_total") + metric_value(
        text, "dynamo_frontend_failures_total"
    )


def seen_after(stack: Stack, before: float, timeout: float = 10.0) -> float:
    """The count once it has moved past ``before`` (bounded wait)."""
    deadline = time.monotonic() + timeout
    while (now := dynamo_seen(stack)) <= before and time.monotonic() < deadline:
        time.sleep(0.1)
    return now


def direct(stack: Stack, body: dict[str, Any]) -> Reply:
    return http("POST", f"{stack.url}/v1/embeddings", body)


def unit_and_equal(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> None:
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    cosines = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert np.all(cosines >= 0.99999), cosines


def test_dynamo_matryoshka_worker_answers(dynamo: Stack) -> None:
    """What Dynamo 1.6.1 answers for `dimensions` when its worker was started
    Matryoshka, as docs/upstreams.md records it."""
    texts = corpus_texts(4)
    plain = direct(dynamo, {"model": SERVED_MODEL, "input": texts})
    assert plain.status == 200, plain.body[:500]
    full = vectors(plain.json())
    for size in (1, 2, 128, 383, 384):
        reply = direct(dynamo, {"model": SERVED_MODEL, "input": texts, "dimensions": size})
        assert reply.status == 200, (size, reply.body[:500])
        cut = vectors(reply.json())
        assert cut.shape == (4, size)
        prefix = full[:, :size] / np.linalg.norm(full[:, :size], axis=1, keepdims=True)
        unit_and_equal(cut, prefix)  # cut and re-normalised
        assert reply.json()["usage"] == plain.json()["usage"]
    for size in (385, 1024):
        reply = direct(dynamo, {"model": SERVED_MODEL, "input": "hello", "dimensions": size})
        assert (reply.status, reply.json()) == (500, DYNAMO_500), size
    zero = direct(dynamo, {"model": SERVED_MODEL, "input": "hello", "dimensions": 0})
    assert (zero.status, zero.json()["message"]) == (400, "Invalid request")
    for not_u32 in (-1, 256.5, "x", True, 128.0, "128"):  # refused by the frontend's parser
        reply = direct(dynamo, {"model": SERVED_MODEL, "input": "hello", "dimensions": not_u32})
        assert reply.status == 400 and "expected u32" in reply.json()["message"], reply.body


@pytest.mark.parametrize("dimensions", [32, 128, 300, 384])
def test_dynamo_native_dimensions_equal_emulated(
    dynamo_native_and_emulated: tuple[Gateway, Gateway], dimensions: int
) -> None:
    native_gw, emulated_gw = dynamo_native_and_emulated
    body = {"model": SERVED_MODEL, "input": corpus_texts(8), "dimensions": dimensions}
    native, emulated = native_gw.embeddings(body), emulated_gw.embeddings(body)
    assert native.status == 200, native.body[:500]
    assert emulated.status == 200, emulated.body[:500]
    a, b = vectors(native.json()), vectors(emulated.json())
    assert a.shape == b.shape == (8, dimensions)
    unit_and_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    assert native.json()["usage"] == emulated.json()["usage"]


def test_dynamo_declared_size_equals_emulated(
    dynamo_native_and_emulated: tuple[Gateway, Gateway],
) -> None:
    native_gw, emulated_gw = dynamo_native_and_emulated
    texts = corpus_texts(4)
    native = native_gw.embeddings({"model": SIZES_MODEL, "input": texts, "dimensions": 128})
    emulated = emulated_gw.embeddings({"model": SERVED_MODEL, "input": texts, "dimensions": 128})
    assert native.status == emulated.status == 200, (native.body[:300], emulated.body[:300])
    unit_and_equal(vectors(native.json()), vectors(emulated.json()))


def envelope_400(reply: Reply) -> dict[str, Any]:
    assert reply.status == 400, reply.body[:500]
    doc = reply.json()
    assert set(doc) == {"error"} and set(doc["error"]) == ENVELOPE_KEYS, doc
    return dict(doc["error"])


def test_bad_sizes_get_the_gateways_400_and_never_reach_dynamo(
    dynamo: Stack, dynamo_native_and_emulated: tuple[Gateway, Gateway]
) -> None:
    native_gw, emulated_gw = dynamo_native_and_emulated
    before = dynamo_seen(dynamo)
    for label, model, size in BAD_SIZES:
        # The emulating policy has no SIZES_MODEL; the native one has both entries.
        for gw in (native_gw, emulated_gw) if model == SERVED_MODEL else (native_gw,):
            error = envelope_400(
                gw.embeddings({"model": model, "input": "hello", "dimensions": size})
            )
            assert (error["param"], error["type"]) == ("dimensions", "invalid_request_error"), label
    # One valid request after them: once Dynamo counts it, it has counted everything
    # sent before it, and it must be the only one.
    ok = native_gw.embeddings({"model": SIZES_MODEL, "input": "hello", "dimensions": 128})
    assert ok.status == 200, ok.body[:500]
    assert seen_after(dynamo, before) == before + 1
    # The counters do see each of these bodies when one reaches Dynamo.
    for label, _, size in BAD_SIZES:
        start = dynamo_seen(dynamo)
        direct(dynamo, {"model": SERVED_MODEL, "input": "hello", "dimensions": size})
        assert seen_after(dynamo, start) > start, label


def test_native_rides_one_ext_proc_message_emulated_two(
    dynamo_native_and_emulated: tuple[Gateway, Gateway],
) -> None:
    """Envoy's own counters, per request: the native path sends the request body and
    nothing else; the emulated path also sends the response body on the same stream."""
    native_gw, emulated_gw = dynamo_native_and_emulated
    body = {"model": SERVED_MODEL, "input": corpus_texts(8), "dimensions": 128}
    repeats = 5
    per_request = {}
    for name, gw in (("native", native_gw), ("emulated", emulated_gw)):
        streams, msgs = ext_proc_counts(gw)
        for _ in range(repeats):
            reply = gw.embeddings(body)
            assert reply.status == 200, reply.body[:500]
        streams_after, msgs_after = ext_proc_counts(gw)
        per_request[name] = ((streams_after - streams) / repeats, (msgs_after - msgs) / repeats)
    print(f"\n[e2e] ext_proc (streams, messages) per request on Dynamo: {per_request}")
    assert per_request == {"native": (1.0, 1.0), "emulated": (1.0, 2.0)}
