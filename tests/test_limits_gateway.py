"""Request caps and the tokenization budget through a real Envoy and the real ext_proc
server (`extproc run`, the shipped Qwen3 policy with its default limits), in front of
the fake Dynamo upstream.

The issue's worst case - 2,048 inputs each under 1,024 tokens but over 1,023 bytes,
~8 MB - took ~75 s of wall time here (~11 s of CPU, on a loaded 2-core machine) before
the budget, past Envoy's 15 s message timeout; now it is a 413 before any of it is
tokenized.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import QWEN_MODEL, REPO, SHIPPED_QWEN_POLICY
from tests.fake_upstream import FakeUpstream
from tests.harness import Gateway, Reply, start_gateway

ENGLISH = "The quick brown fox jumps over the lazy dog while the cat sleeps. "


@pytest.fixture(scope="module")
def upstream(qwen_dir: Path) -> Iterator[FakeUpstream]:
    with FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir) as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(
    upstream: FakeUpstream, qwen_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    gw = start_gateway(
        upstream.url,
        tmp_path_factory.mktemp("limits"),
        config=SHIPPED_QWEN_POLICY,
        tokenizer_overrides=f"{QWEN_MODEL}={qwen_dir}",
    )
    yield gw
    assert gw.stop() == 0, gw.log()


@pytest.fixture(autouse=True)
def clean_upstream(upstream: FakeUpstream) -> None:
    upstream.reset()


def error_of(reply: Reply, status: int) -> dict[str, str]:
    assert reply.status == status, reply.body[:300]
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return dict(error)


def english(nbytes: int, salt: int) -> str:
    return (f"{salt} " + ENGLISH * (nbytes // len(ENGLISH) + 1))[:nbytes]


def test_worst_case_batch_is_a_quick_413(gateway: Gateway, upstream: FakeUpstream) -> None:
    body = json.dumps({"model": QWEN_MODEL, "input": [english(3900, i) for i in range(2048)]})
    assert 7_900_000 < len(body) < 8 * 1024 * 1024
    started = time.monotonic()
    reply = gateway.embeddings(body.encode(), timeout=60)
    elapsed = time.monotonic() - started
    error = error_of(reply, 413)
    assert (error["param"], error["code"]) == ("input", "request_too_large")
    assert "1048576" in error["message"]
    # Refused before tokenizing: the time is moving and parsing 8 MB (~0.3 s here
    # unloaded), far from the 15 s after which Envoy gives up (504).
    assert elapsed < 10, elapsed
    assert upstream.received == []


def test_input_without_a_place_to_cut_is_a_413(gateway: Gateway, upstream: FakeUpstream) -> None:
    body = {"model": QWEN_MODEL, "input": ["x" * (6 * 1024 * 1024)]}
    error = error_of(gateway.embeddings(body, timeout=60), 413)
    assert error["message"].startswith("input[0] cannot be cut to 1024 tokens")
    assert upstream.received == []


def test_instruction_times_inputs_is_a_413(gateway: Gateway, upstream: FakeUpstream) -> None:
    body = {"model": QWEN_MODEL, "input": ["a"] * 2048, "instruction": "i" * (4 * 1024 * 1024)}
    error = error_of(gateway.embeddings(body, timeout=60), 413)
    assert "2048 x " in error["message"] and str(8 * 1024 * 1024) in error["message"]
    assert upstream.received == []


def test_full_batch_of_documents_still_passes(gateway: Gateway, upstream: FakeUpstream) -> None:
    """2,048 documents of the seed's size (~90 tokens): never tokenized, forwarded."""
    lines = (REPO / "extproc" / "data" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    docs = [json.loads(line)["text"] for line in lines if line.strip()]
    inputs = [docs[i % len(docs)] for i in range(2048)]
    reply = gateway.embeddings({"model": QWEN_MODEL, "input": inputs}, timeout=120)
    assert reply.status == 200, reply.body[:300]
    assert len(reply.json()["data"]) == 2048
    assert len(upstream.received) == 1
