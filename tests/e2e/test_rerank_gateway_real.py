"""Reranking retired from a real legacy server: `extproc learn --task rerank` learns
each legacy dialect (tests/e2e/legacy_rerank_app.py, TEI's `/rerank` and Cohere v1's
`/v1/rerank`, transformers on the MiniLM cross-encoder) against real vLLM serving the
same weights, writes a `rerankers` entry READY; and the real gateway with that entry,
in front of vLLM, answers a client as the legacy server did (status, error shape,
order, scores within 1e-4, fields, documents), with none of it reaching the legacy
server; `extproc probe --task rerank` on the shipped corpus finds it READY too, and
`extproc shadow --rerank-candidate` on live traffic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from extproc.commands import learn as learn_command
from extproc.commands import probe as probe_command
from extproc.commands.cli import _parser
from extproc.service.policy_file import load_policy_file
from testing_support.gateway import GatewaySpec
from testing_support.http import http
from testing_support.processes import Process, free_port, wait_until
from testing_support.real_upstream import RERANKER_MODEL, RealEnv, Stack
from tests.harness import Comparator, Gateways
from tests.learning import assert_same_rerank_answer

REPO = Path(__file__).resolve().parents[2]
LONG_TEXT = " ".join(["the harbour lights flickered as the ferry crossed the bay"] * 60)


def corpus(kind: str) -> list[str]:
    lines = (REPO / "extproc" / "data" / "corpus.jsonl").read_text().splitlines()
    return [row["text"] for row in map(json.loads, lines) if row["kind"] == kind]


QUERIES = corpus("query")[:1] + corpus("query")[4:5]  # one English, one Korean
DOCUMENTS = corpus("document")[:6] + corpus("document")[-6:]

TEI_BODIES: dict[str, Any] = {
    **{f"query {i}": {"query": q, "texts": DOCUMENTS} for i, q in enumerate(QUERIES)},
    "raw scores": {"query": QUERIES[0], "texts": DOCUMENTS, "raw_scores": True},
    "with text": {"query": QUERIES[1], "texts": DOCUMENTS[:4], "return_text": True},
    "long, truncated": {
        "query": QUERIES[0],
        "texts": [*DOCUMENTS[:3], LONG_TEXT],
        "truncate": True,
    },
    "long, raw, truncated": {
        "query": QUERIES[0],
        "texts": [LONG_TEXT, DOCUMENTS[0]],
        "truncate": True,
        "raw_scores": True,
    },
    "long, refused": {"query": QUERIES[0], "texts": [DOCUMENTS[0], LONG_TEXT]},
    "malformed": b'{"query": ',
    "no texts": {"query": QUERIES[0], "texts": []},
    "texts not strings": {"query": QUERIES[0], "texts": [1, 2]},
    "left, nothing to cut": {
        "query": QUERIES[0],
        "texts": DOCUMENTS[:3],
        "truncate": True,
        "truncation_direction": "Left",
    },
}
COHERE_BODIES: dict[str, Any] = {
    **{f"query {i}": {"query": q, "documents": DOCUMENTS} for i, q in enumerate(QUERIES)},
    "model named": {"model": RERANKER_MODEL, "query": QUERIES[0], "documents": DOCUMENTS},
    "top_n": {"query": QUERIES[1], "documents": DOCUMENTS, "top_n": 3},
    "documents back": {
        "query": QUERIES[0],
        "documents": DOCUMENTS[:5],
        "top_n": 2,
        "return_documents": True,
    },
    "objects": {"query": QUERIES[0], "documents": [{"text": d} for d in DOCUMENTS[:4]]},
    "long, cut": {"query": QUERIES[0], "documents": [LONG_TEXT, *DOCUMENTS[:3]]},
    "malformed": b'{"query": ',
    "no documents": {"query": QUERIES[0], "documents": []},
    "top_n zero": {"query": QUERIES[0], "documents": DOCUMENTS[:2], "top_n": 0},
    "unknown model": {"model": "nope", "query": QUERIES[0], "documents": DOCUMENTS[:2]},
}
CASES = {"tei": ("/rerank", TEI_BODIES), "cohere": ("/v1/rerank", COHERE_BODIES)}


def learn_rerank(legacy: Stack, reranker: Stack, env: RealEnv, out: Path) -> tuple[int, str]:
    argv = ["learn", "--task", "rerank", "--baseline", legacy.url, "--candidate", reranker.url]
    argv += ["--model", RERANKER_MODEL, "--tokenizer", f"{RERANKER_MODEL}={env.reranker_dir}"]
    argv += ["--out", str(out)]
    code = learn_command.run(_parser().parse_args(argv))
    return code, (out / "report.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("dialect", ["tei", "cohere"])
def test_learned_rerank_policy_is_ready_and_imitates_the_legacy_server(
    dialect: str,
    *,
    request: pytest.FixtureRequest,
    vllm_reranker: Stack,
    env: RealEnv,
    gateways: Gateways,
    tmp_path: Path,
) -> None:
    legacy: Stack = request.getfixturevalue(f"legacy_{dialect}_rerank")
    code, report = learn_rerank(legacy, vllm_reranker, env, tmp_path)
    assert code == 0, report
    assert "**Result: READY** (exit code 0)" in report
    (entry,) = load_policy_file(tmp_path / "policy.yaml").rerankers
    path, bodies = CASES[dialect]
    expected = {
        "tei": ("tei", "/rerank", True, None),
        "cohere": ("cohere_v1", "/v1/rerank", False, None),
    }[dialect]
    got = (entry.dialect, entry.path, entry.truncation.refuse, entry.top_n)
    assert got == expected, report
    assert entry.scores.name == "SIGMOID" and entry.max_tokens == 256, report

    # The gateway with the learned entry, in front of vLLM: what a client sees.
    spec = GatewaySpec(
        vllm_reranker.url,
        policy=tmp_path / "policy.yaml",
        tokenizers=f"{RERANKER_MODEL}={env.reranker_dir}",
        args=("--rerank-upstream", vllm_reranker.url),
    )
    with gateways.own(spec) as gateway:
        for label, body in bodies.items():
            old = http("POST", legacy.url + path, body, timeout=120)
            new = http("POST", gateway.url + path, body, timeout=120)
            assert_same_rerank_answer(old, new, f"{dialect}: {label}")
        # The probe's rerank run on the shipped corpus finds the same.
        probe_dialect = {"tei": "tei", "cohere": "cohere-v1"}[dialect]
        argv = ["probe", "--task", "rerank", "--dialect", probe_dialect]
        argv += ["--model", RERANKER_MODEL, "--max-tokens", "256", "--timeout", "120"]
        argv += ["--baseline", legacy.url, "--candidate", gateway.url]
        argv += ["--out", str(tmp_path / "probe")]
        probed = probe_command.run(_parser().parse_args(argv))
        probe_report = (tmp_path / "probe" / "report.md").read_text(encoding="utf-8")
        assert probed == 0, probe_report
        assert "**Verdict: READY** (exit code 0)" in probe_report
        assert "8 queries: 8 answered the same;" in probe_report  # the shipped corpus's 8
        if dialect == "tei":
            # A cut from the left, which vLLM cannot make as the tokenizer does: the
            # legacy server cut it, the gateway says it will not (as TEI refuses a
            # request: 422, its shape).
            body = {"query": QUERIES[0], "texts": [LONG_TEXT], "truncate": True}
            left = {**body, "truncation_direction": "Left"}
            assert http("POST", legacy.url + path, left, timeout=120).status == 200
            refused = http("POST", gateway.url + path, left, timeout=120)
            assert refused.status == 422, refused.body
            error = refused.json()
            assert error["error_type"] == "Validation" and "right" in error["error"], error


@pytest.mark.parametrize("dialect", ["tei", "cohere"])
def test_shadow_compares_live_rerank_traffic_on_the_real_reranker(
    dialect: str,
    *,
    request: pytest.FixtureRequest,
    vllm_reranker: Stack,
    env: RealEnv,
    tmp_path: Path,
) -> None:
    """`extproc shadow --rerank-candidate` with the learned entry: clients of the legacy
    server get its answers, each request mirrored through the gateway to the real vLLM
    reranker, and the comparator finds every pair the same: READY."""
    legacy: Stack = request.getfixturevalue(f"legacy_{dialect}_rerank")
    code, report = learn_rerank(legacy, vllm_reranker, env, tmp_path)
    assert code == 0, report
    path, bodies = CASES[dialect]
    listen, http_port = free_port(), free_port()
    argv = [sys.executable, "-m", "extproc", "shadow", "--config", str(tmp_path / "policy.yaml")]
    argv += ["--baseline", legacy.url, "--candidate", vllm_reranker.url]
    argv += ["--rerank-candidate", vllm_reranker.url, "--workers", "1", "--grace", "1"]
    argv += ["--listen", f"127.0.0.1:{listen}", "--http", f"127.0.0.1:{http_port}"]
    argv += ["--tokenizer", f"{RERANKER_MODEL}={env.reranker_dir}"]
    process = Process.start(argv, tmp_path / "shadow.log", name="extproc shadow")
    try:
        process.wait_line("extproc shadow ready:", 120)
        for label, body in bodies.items():
            got = http("POST", f"http://127.0.0.1:{listen}{path}", body, timeout=120)
            want = http("POST", legacy.url + path, body, timeout=120)
            assert got.status == want.status, (label, got.body)
        comparator = Comparator(process, 0, http_port)
        wait_until(
            lambda: comparator.summary()["rerank"]["pairs"] >= len(bodies), 120, "rerank pairs"
        )
        rerank = comparator.summary()["rerank"]
        assert (rerank["pairs"], rerank["same"]) == (len(bodies), len(bodies)), rerank
        assert rerank["max_score_difference"] < 1e-4, rerank
        shown = subprocess.run(
            [sys.executable, "-m", "extproc", "shadow-report", "--url", comparator.url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert shown.returncode == 0, shown.stdout + shown.stderr
    finally:
        assert process.stop() == 0, process.log()
