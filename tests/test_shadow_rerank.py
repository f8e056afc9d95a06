"""Shadow mode on rerank traffic: `extproc shadow --rerank-candidate URL` (one command:
the gateway's ext_proc server, a comparator and Envoy with the shipped shadow configs)
shadows the policy's rerank paths as it shadows embeddings, and the comparator
compares each rerank pair whole, as a client sees it.

The set-up, all on loopback: the legacy server is a TEI-dialect stand-in
(tests/fake_rerank.py) answering `/rerank` (it is the baseline, or the legacy side of
`--legacy`); the candidate's reranker is a vLLM-shaped stand-in sharing its scorer;
the embeddings candidate is the fake Dynamo. Every process is started and stopped
here by its own PID; every wait is bounded.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testing_support.fake_upstream import FakeUpstream
from testing_support.http import http
from testing_support.processes import Process, free_port, wait_until
from testing_support.qwen import QWEN_MODEL, SHIPPED_QWEN_POLICY
from tests.fake_rerank import FakeLegacyRerank, FakeRerankUpstream, write_word_tokenizer
from tests.harness import Comparator

READY_TIMEOUT_S = 60.0
PAIRS_TIMEOUT_S = 30.0
REQUESTS: list[dict[str, Any] | bytes] = [
    {"query": "river boat morning", "texts": ["the river runs", "a boat", "market road child"]},
    {"query": "stone bridge", "texts": ["garden bridge", "stone house", "water"]},
    {"query": "child market", "texts": ["market road child", "light"], "raw_scores": True},
    {"query": "light", "texts": ["morning light", "stone"], "return_text": True},
    {"query": "river", "texts": []},  # a client mistake: both answer it 422
]


def tei_reranker(scores: str) -> str:
    return f"""
rerankers:
  - name: reranker
    dialect: TEI
    scores: {scores}
    max_tokens: 64
    tokenizer: {{path: unused}}
    upstream: {{kind: vllm}}
    errors: {{shape: TEI, status: {{malformed: 422, invalid: 422}}}}
"""


@dataclass(frozen=True)
class ShadowRun:
    process: Process
    listen: int
    comparator: Comparator  # the one `extproc shadow` runs: its HTTP port


@pytest.fixture(scope="module")
def servers(qwen_dir: Path) -> Iterator[tuple[FakeUpstream, FakeLegacyRerank, FakeRerankUpstream]]:
    with (
        FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir) as embeddings,
        FakeLegacyRerank(dialect="tei", max_tokens=64) as legacy,
        FakeRerankUpstream(max_tokens=64) as reranker,
    ):
        yield embeddings, legacy, reranker


def start_shadow(
    tmp_path: Path, servers: Any, qwen_dir: Path, *, scores: str, extra: tuple[str, ...] = ()
) -> ShadowRun:
    embeddings, legacy, reranker = servers
    policy = tmp_path / "policy.yaml"
    policy.write_text(SHIPPED_QWEN_POLICY.read_text(encoding="utf-8") + tei_reranker(scores))
    words = write_word_tokenizer(tmp_path / "words")
    listen, http_port = free_port(), free_port()
    argv = [sys.executable, "-m", "extproc", "shadow", "--config", str(policy)]
    argv += ["--baseline", legacy.url, "--candidate", embeddings.url]
    argv += ["--rerank-candidate", reranker.url, "--listen", f"127.0.0.1:{listen}"]
    argv += ["--http", f"127.0.0.1:{http_port}", "--grace", "1", "--workers", "1"]
    argv += ["--tokenizer", f"{QWEN_MODEL}={qwen_dir},reranker={words}", *extra]
    process = Process.start(argv, tmp_path / "shadow.log", name="extproc shadow")
    try:
        line = process.wait_line("extproc shadow ready:", READY_TIMEOUT_S)
        assert f"rerank paths too (candidate reranker {reranker.url})" in line, line
    except BaseException:
        process.stop()
        raise
    return ShadowRun(process, listen, Comparator(process, 0, http_port))


def send_and_settle(run: ShadowRun) -> tuple[list[tuple[int, bytes]], dict[str, Any]]:
    """Each request to the clients' listener; what the clients got, and the summary
    once every pair is compared."""
    got = []
    for body in REQUESTS:
        reply = http("POST", f"http://127.0.0.1:{run.listen}/rerank", body)
        got.append((reply.status, reply.body))
    wait_until(
        lambda: run.comparator.summary()["rerank"]["pairs"] >= len(REQUESTS),
        PAIRS_TIMEOUT_S,
        "rerank pairs",
    )
    return got, run.comparator.summary()


def shadow_report(url: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "extproc", "shadow-report", "--url", url]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_rerank_pairs_through_the_gateway_are_the_same(
    reverse: bool, servers: Any, qwen_dir: Path, tmp_path: Path
) -> None:
    """Forward: clients get the legacy server's answers, the gateway's are compared.
    Reverse: clients get the gateway's (in front of the reranker), the legacy server
    is the shadow. Either way every pair is the same: READY, exit 0."""
    _, legacy, reranker = servers
    extra = ("--reverse",) if reverse else ()
    run = start_shadow(tmp_path, servers, qwen_dir, scores="SIGMOID", extra=extra)
    try:
        before = len(reranker.received), len(legacy.received)
        got, summary = send_and_settle(run)
        rerank = summary["rerank"]
        assert (rerank["pairs"], rerank["same"], rerank["differences"]) == (5, 5, {}), summary
        assert rerank["max_score_difference"] < 1e-4
        assert summary["verdict"]["ready"], summary["verdict"]
        # every request reached both sides once: the legacy server and, through the
        # gateway, the reranker (the client mistake never leaves the gateway)
        assert len(legacy.received) - before[1] == len(REQUESTS)
        assert len(reranker.received) - before[0] == len(REQUESTS) - 1
        assert [status for status, _ in got] == [200, 200, 200, 200, 422]
        result = shadow_report(run.comparator.url)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "## Reranking (each pair compared whole)" in result.stdout
        assert "[ok] rerank answers: 0 of 5 rerank pairs" in result.stdout
        assert 'extproc_shadow_rerank_pairs_total{result="same"} 5.0' in run.comparator.metrics()
    finally:
        assert run.process.stop() == 0, run.process.log()


def test_a_wrong_score_scale_is_caught(servers: Any, qwen_dir: Path, tmp_path: Path) -> None:
    """The policy says RAW where the legacy server answers the sigmoid: the clients
    (forward mode) see nothing, the comparator sees every scored pair differ; NOT
    READY, exit 1, naming the difference."""
    run = start_shadow(tmp_path, servers, qwen_dir, scores="RAW")
    try:
        _, summary = send_and_settle(run)
        rerank = summary["rerank"]
        # the pair asking raw_scores and the client mistake are the same either way
        assert (rerank["pairs"], rerank["same"]) == (5, 2), summary
        assert rerank["differences"] == {"scores differ": 3}, summary
        assert not summary["verdict"]["ready"]
        result = shadow_report(run.comparator.url)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "[FAIL] rerank answers: 3 of 5 rerank pairs" in result.stdout
        assert "scores differ x3" in result.stdout
    finally:
        assert run.process.stop() == 0, run.process.log()


def test_a_rerank_candidate_needs_rerankers_in_the_policy(servers: Any, qwen_dir: Path) -> None:
    embeddings, legacy, reranker = servers
    argv = [sys.executable, "-m", "extproc", "shadow", "--baseline", legacy.url]
    argv += ["--candidate", embeddings.url, "--rerank-candidate", reranker.url]
    argv += ["--config", str(SHIPPED_QWEN_POLICY), "--workers", "1"]
    argv += ["--tokenizer", f"{QWEN_MODEL}={qwen_dir}"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().endswith("has no rerankers"), result.stderr
