"""envoy/standalone.yaml's stream budget, counted by Envoy itself: a request whose
vectors must change gets ONE ext_proc stream of two messages when the `precheck`
Lua filter spots it before the stream opens; a request it misses (a key spelled
with JSON escapes) still gets the right answer on the second-stream path; a
false positive and a plain request cost one message. Real Envoy, the real server
(`extproc run`), the Dynamo-like fake upstream and the shipped Qwen3 policy."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import QWEN_MODEL
from tests.fake_upstream import FakeUpstream
from tests.harness import Gateway, Reply, start_shipped_gateway

TEXTS = ["Seoul is the capital of South Korea.", "Paris is the capital of France."]
MARKER_IN_TEXT = "The dimensions of the box are 2 by 3."


@dataclass(frozen=True)
class Streams:
    started: int
    messages: int


@pytest.fixture(scope="module")
def gateway(
    upstream: FakeUpstream, qwen_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    gw = start_shipped_gateway(
        upstream.url, tmp_path_factory.mktemp("one-stream"), qwen_dir, "standalone"
    )
    yield gw
    assert gw.stop() == 0, gw.log()


def ext_proc_counters(gateway: Gateway) -> Streams:
    match = re.search(r"admin 127\.0\.0\.1:(\d+)", gateway.ready_line)
    assert match, gateway.ready_line
    url = f"http://127.0.0.1:{match.group(1)}/stats?filter=ext_proc"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    values = dict(re.findall(r"^http\.embeddings\.ext_proc\.(\w+): (\d+)$", text, re.M))
    return Streams(int(values.get("streams_started", 0)), int(values.get("stream_msgs_sent", 0)))


def send_counted(gateway: Gateway, body: bytes | dict[str, Any]) -> tuple[Reply, Streams]:
    before = ext_proc_counters(gateway)
    reply = gateway.embeddings(body)
    after = ext_proc_counters(gateway)
    return reply, Streams(after.started - before.started, after.messages - before.messages)


def assert_cut_to_256(reply: Reply, upstream: FakeUpstream) -> None:
    assert reply.status == 200, reply.body
    for item, text in zip(reply.json()["data"], TEXTS, strict=True):
        got = np.asarray(item["embedding"], dtype=np.float64)
        assert got.shape == (256,)
        native = upstream.embed_ids(upstream.tokenize(text)).astype(np.float64)[:256]
        np.testing.assert_allclose(got, native / np.linalg.norm(native), atol=1e-6)


def test_a_spotted_rewrite_costs_one_stream_of_two_messages(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    reply, cost = send_counted(gateway, {"model": QWEN_MODEL, "input": TEXTS, "dimensions": 256})
    assert_cut_to_256(reply, upstream)
    assert cost == Streams(started=1, messages=2)


def test_an_escaped_key_is_missed_by_the_precheck_and_still_rewritten(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    body = b'{"model": "%s", "input": ["%s", "%s"], "\\u0064imensions": 256}' % (
        QWEN_MODEL.encode(),
        TEXTS[0].encode(),
        TEXTS[1].encode(),
    )
    reply, cost = send_counted(gateway, body)
    assert_cut_to_256(reply, upstream)
    assert cost == Streams(started=2, messages=2)  # the second-stream fallback


def test_a_false_positive_and_a_plain_request_cost_one_message(gateway: Gateway) -> None:
    # "dimensions" in the text, not as a key: the precheck's route, but the server
    # ends the stream after the request reply, as the response needs no change.
    for text in (MARKER_IN_TEXT, "hi"):
        body = {"model": QWEN_MODEL, "input": [text]}
        reply, cost = send_counted(gateway, body)
        assert reply.status == 200, reply.body
        assert len(reply.json()["data"][0]["embedding"]) == 1024
        assert cost == Streams(started=1, messages=1)
