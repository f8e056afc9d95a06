"""Native Matryoshka on a real vLLM started with `--hf-overrides '{"is_matryoshka": true}'`.

The shipped native policy (all-minilm-l6-v2-native.yaml) forwards `dimensions` to the
upstream, which cuts and re-normalises; the emulating policy
(all-minilm-l6-v2-matryoshka.yaml) asks for the whole vectors and cuts them in the
gateway. Both gateways stand in front of the same vLLM: the answers must agree.
Dynamo 1.6.1 keeps the emulated path (it answers a forwarded `dimensions` with a 500),
so it has no case here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.conftest import MATRYOSHKA_POLICY
from tests.harness import Gateway, http, start_gateway
from tests.real_upstream import SERVED_MODEL, RealEnv, Stack

REPO = Path(__file__).resolve().parents[2]
NATIVE_POLICY = REPO / "extproc" / "policies" / "all-minilm-l6-v2-native.yaml"
ADMIN = re.compile(r"admin 127\.0\.0\.1:(\d+)")


def _gateway(stack: Stack, policy: Path, env: RealEnv, folder: Path) -> Gateway:
    return start_gateway(
        stack.url, folder, config=policy, tokenizer_overrides=f"{SERVED_MODEL}={env.model_dir}"
    )


@pytest.fixture(scope="module")
def native_and_emulated(
    vllm_matryoshka: Stack,
    env: RealEnv,
    e2e_dir: Path,
    gateways: dict[tuple[str, str], Gateway],
) -> tuple[Gateway, Gateway]:
    """Started once, stopped with the session's other gateways."""
    for name, policy in (("native", NATIVE_POLICY), ("matryoshka", MATRYOSHKA_POLICY)):
        key = ("vllm-mrl", name)
        if key not in gateways:
            gateways[key] = _gateway(vllm_matryoshka, policy, env, e2e_dir)
    return gateways[("vllm-mrl", "native")], gateways[("vllm-mrl", "matryoshka")]


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
