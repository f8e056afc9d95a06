"""Request caps and the tokenization budget through a real Envoy and the real ext_proc
server (`extproc run`, the shipped Qwen3 policy with its default limits), in front of
the fake Dynamo upstream.

Bulk batches the legacy server took are answered: 512 documents of 4,000 characters
(2 MB, each counted because each is over 1,023 bytes) were a 413 from the former 1 MiB
default tokenization budget. What bounds the tokenizer is the deadline: 2,048 inputs
of costly text (~8 MB of digits: 2-28 s of CPU here, by how busy the machine is) is a
413 shortly after the deadline, well before Envoy's 15 s message timeout. That test
runs its own gateway with a 500 ms deadline, a tenth of the default, so that the
work outlasts it on a quiet machine too (the default 5 s was met on one).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator

import pytest

from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import Gateway, GatewaySpec
from testing_support.http import Reply
from testing_support.qwen import QWEN_MODEL, REPO, SHIPPED_QWEN_POLICY
from tests.harness import Gateways

SHORT_DEADLINE_MS = 500
ENGLISH = "The quick brown fox jumps over the lazy dog while the cat sleeps. "


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, gateways: Gateways) -> Gateway:
    return gateways.shared(GatewaySpec(upstream.url))


@pytest.fixture(scope="module")
def short_deadline_gateway(upstream: FakeUpstream, gateways: Gateways) -> Iterator[Gateway]:
    """The shipped policy with a 500 ms tokenizing deadline (the default is 5,000 ms)."""
    policy = (
        SHIPPED_QWEN_POLICY.read_text(encoding="utf-8")
        + f"limits: {{max_tokenize_ms: {SHORT_DEADLINE_MS}}}\n"
    )
    with gateways.own(GatewaySpec(upstream.url, policy=policy)) as gw:
        yield gw


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


def test_bulk_batch_of_long_documents_is_answered(gateway: Gateway, upstream: FakeUpstream) -> None:
    inputs = [english(4000, i) for i in range(512)]
    body = json.dumps({"model": QWEN_MODEL, "input": inputs}).encode()
    assert len(body) > 2_000_000
    reply = gateway.embeddings(body, timeout=120)
    assert reply.status == 200, reply.body[:300]
    data = reply.json()["data"]
    assert [item["index"] for item in data] == list(range(512))
    assert all(len(item["embedding"]) == 1024 for item in data)
    (received,) = upstream.received
    assert received.body == body  # none over max_tokens: forwarded as sent


def test_costly_worst_case_ends_at_the_deadline(
    short_deadline_gateway: Gateway, upstream: FakeUpstream
) -> None:
    rnd = random.Random(6)
    inputs = ["".join(rnd.choices("0123456789", k=3900)) for _ in range(2048)]
    body = json.dumps({"model": QWEN_MODEL, "input": inputs})
    assert 7_900_000 < len(body) < 8 * 1024 * 1024
    started = time.monotonic()
    reply = short_deadline_gateway.embeddings(body.encode(), timeout=60)
    elapsed = time.monotonic() - started
    error = error_of(reply, 413)
    assert (error["param"], error["code"]) == ("input", "request_too_large")
    assert f"longer than {SHORT_DEADLINE_MS} ms" in error["message"]
    # The deadline, plus at most one ~64 KiB tokenizer call past it (up to ~1 s of
    # the costliest text) and moving and parsing 8 MB: well under the 15 s after
    # which Envoy gives up (504).
    assert SHORT_DEADLINE_MS / 1000 <= elapsed < 10, elapsed
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
