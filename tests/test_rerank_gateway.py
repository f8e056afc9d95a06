"""Reranking through the real gateway (`extproc run`: Envoy + ext_proc) with
`--legacy`: a TEI-dialect client and a Cohere-dialect client get from the gateway, in
front of a vLLM-shaped rerank upstream, the answers their legacy server gave (the
stand-ins of tests/fake_rerank.py share one scorer), and none of that traffic reaches
the legacy server; every other path still does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import Gateway, GatewaySpec
from testing_support.http import http
from testing_support.qwen import QWEN_MODEL, SHIPPED_QWEN_POLICY
from tests.fake_rerank import FakeLegacyRerank, FakeRerankUpstream, write_word_tokenizer
from tests.harness import Gateways
from tests.learning import assert_same_rerank_answer

MAX_TOKENS = 64


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_word_tokenizer(tmp_path_factory.mktemp("rerank-tokenizer"))


TEI_POLICY = """
rerankers:
  - name: reranker
    dialect: TEI
    max_tokens: 64
    truncation: {refuse: true}
    tokenizer: {path: unused}
    upstream: {kind: vllm}
    errors: {shape: TEI, status: {malformed: 422, invalid: 422}}
"""
COHERE_POLICY = """
rerankers:
  - name: reranker
    dialect: COHERE_V1
    max_tokens: 64
    tokenizer: {path: unused}
    upstream: {kind: vllm}
    errors: {shape: FASTAPI, status: {malformed: 422, invalid: 422}}
"""


@pytest.fixture(scope="module")
def upstreams(qwen_dir: Path) -> Iterator[tuple[FakeUpstream, FakeRerankUpstream]]:
    with (
        FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir) as embeddings,
        FakeRerankUpstream(max_tokens=MAX_TOKENS) as rerank,
    ):
        yield embeddings, rerank


def gateway_for(
    dialect: str, policy: str, upstreams: Any, gateways: Gateways, tokenizers: str
) -> Iterator[tuple[Gateway, FakeLegacyRerank]]:
    embeddings, rerank = upstreams
    text = SHIPPED_QWEN_POLICY.read_text(encoding="utf-8") + policy
    with FakeLegacyRerank(dialect=dialect, max_tokens=MAX_TOKENS) as legacy:
        spec = GatewaySpec(
            embeddings.url,
            policy=text,
            tokenizers=tokenizers,
            legacy=legacy.url,
            args=("--rerank-upstream", rerank.url),
        )
        with gateways.own(spec) as gateway:
            yield gateway, legacy


@pytest.fixture(scope="module")
def tei(upstreams: Any, gateways: Gateways, word_tokenizer: Path, qwen_dir: Path) -> Iterator[Any]:
    names = f"{QWEN_MODEL}={qwen_dir},reranker={word_tokenizer}"
    yield from gateway_for("tei", TEI_POLICY, upstreams, gateways, names)


@pytest.fixture(scope="module")
def cohere(
    upstreams: Any, gateways: Gateways, word_tokenizer: Path, qwen_dir: Path
) -> Iterator[Any]:
    names = f"{QWEN_MODEL}={qwen_dir},reranker={word_tokenizer}"
    yield from gateway_for("cohere", COHERE_POLICY, upstreams, gateways, names)


QUERY = "river boat morning"
DOCS = [
    "the river runs past the stone house",
    "a boat on the water in the morning light",
    "market road child",
    "garden bridge",
    "river boat morning " + "water " * 70,  # a pair over 64 tokens
]


TEI_BODIES: dict[str, Any] = {
    "plain": {"query": QUERY, "texts": DOCS[:4]},
    "raw scores": {"query": QUERY, "texts": DOCS[:4], "raw_scores": True},
    "with text": {"query": QUERY, "texts": DOCS[:4], "return_text": True},
    "long, truncated": {"query": QUERY, "texts": DOCS, "truncate": True},
    "long, refused": {"query": QUERY, "texts": DOCS},
    "malformed": b'{"query": ',
    "no texts": {"query": QUERY, "texts": []},
    "no query": {"texts": DOCS[:2]},
    "texts not strings": {"query": QUERY, "texts": [1, 2]},
}
COHERE_BODIES: dict[str, Any] = {
    "plain": {"query": QUERY, "documents": DOCS[:4]},
    "model named": {"model": "reranker", "query": QUERY, "documents": DOCS[:4]},
    "top_n": {"query": QUERY, "documents": DOCS[:4], "top_n": 2},
    "documents back": {"query": QUERY, "documents": DOCS[:4], "return_documents": True},
    "objects": {"query": QUERY, "documents": [{"text": d} for d in DOCS[:3]]},
    "long, cut": {"query": QUERY, "documents": DOCS},
    "malformed": b'{"query": ',
    "no documents": {"query": QUERY, "documents": []},
    "unknown model": {"model": "nope", "query": QUERY, "documents": DOCS[:2]},
}


@pytest.mark.parametrize("label", list(TEI_BODIES))
def test_a_tei_client_gets_the_legacy_answers(label: str, tei: Any) -> None:
    gateway, legacy = tei
    body = TEI_BODIES[label]
    old = http("POST", f"{legacy.url}/rerank", body)
    before = len(legacy.received)
    new = http("POST", f"{gateway.url}/rerank", body)
    assert_same_rerank_answer(old, new, label)
    assert len(legacy.received) == before  # nothing of it reached the legacy server


@pytest.mark.parametrize("label", list(COHERE_BODIES))
def test_a_cohere_client_gets_the_legacy_answers(label: str, cohere: Any) -> None:
    gateway, legacy = cohere
    body = COHERE_BODIES[label]
    old = http("POST", f"{legacy.url}/v1/rerank", body)
    before = len(legacy.received)
    new = http("POST", f"{gateway.url}/v1/rerank", body)
    assert_same_rerank_answer(old, new, label)
    assert len(legacy.received) == before


def test_other_paths_still_reach_the_legacy_server(tei: Any, upstreams: Any) -> None:
    gateway, legacy = tei
    before = len(legacy.received)
    reply = http("POST", f"{gateway.url}/v1/rerank", {"query": "q", "documents": ["a"]})
    assert reply.status == 404  # the TEI legacy server has no /v1/rerank
    assert legacy.paths()[before:] == ["/v1/rerank"]
    # the rerank upstream got the gateway's requests, at its own path, only
    assert set(upstreams[1].paths()) == {"/rerank"}
    # and the embeddings contract is unchanged next to it
    answer = gateway.embeddings({"model": QWEN_MODEL, "input": "hello", "dimensions": 64})
    assert answer.status == 200 and len(answer.json()["data"][0]["embedding"]) == 64


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [("tei", {"dialect": "tei", "refuse": True}), ("cohere", {"dialect": "cohere_v1"})],
)
def test_learn_writes_the_rerank_policy_ready(
    dialect: str, expected: dict[str, Any], upstreams: Any, word_tokenizer: Path, tmp_path: Path
) -> None:
    """`extproc learn --task rerank` against each legacy dialect and the rerank upstream:
    the policy, verified through the real gateway (READY, exit 0)."""
    from extproc.commands import learn as learn_command
    from extproc.commands.cli import _parser
    from extproc.service.policy_file import load_policy_file

    _, rerank = upstreams
    with FakeLegacyRerank(dialect=dialect, max_tokens=MAX_TOKENS) as legacy:
        argv = ["learn", "--task", "rerank", "--baseline", legacy.url, "--candidate", rerank.url]
        argv += ["--model", "reranker", "--tokenizer", f"reranker={word_tokenizer}"]
        argv += ["--out", str(tmp_path)]
        code = learn_command.run(_parser().parse_args(argv))
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert code == 0, md
    assert "**Result: READY** (exit code 0)" in md
    (reranker,) = load_policy_file(tmp_path / "policy.yaml").rerankers
    entry = {"dialect": reranker.dialect, "refuse": reranker.truncation.refuse}
    for key, value in expected.items():
        assert entry[key] == value, (key, md)
    assert reranker.max_tokens == MAX_TOKENS and reranker.scores.name == "SIGMOID"


RERANK_CORPUS = [
    *({"id": f"d{i}", "kind": "document", "text": text} for i, text in enumerate(DOCS[:4])),
    {"id": "d4", "kind": "document", "text": "the child crossed the bridge to the market"},
    {"id": "d5", "kind": "document", "text": "light on the stone road"},
    {"id": "q0", "kind": "query", "text": QUERY},
    {"id": "q1", "kind": "query", "text": "stone bridge garden"},
    {"id": "q2", "kind": "query", "text": "child market"},
]


def probe_rerank(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """`extproc probe --task rerank` with the small word corpus; its exit code and its
    report.json (empty when none was written)."""
    from extproc.commands import probe as probe_command
    from extproc.commands.cli import _parser

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(b"\n".join(orjson.dumps(item) for item in RERANK_CORPUS))
    out = tmp_path / "report"
    argv = ["probe", "--task", "rerank", "--corpus", str(corpus), "--out", str(out), *args]
    code = probe_command.run(_parser().parse_args(argv))
    report = out / "report.json"
    return code, orjson.loads(report.read_bytes()) if report.exists() else {}


@pytest.mark.parametrize(
    ("fixture", "dialect"), [("tei", "tei"), ("cohere", "cohere-v1")], ids=["tei", "cohere"]
)
def test_probe_finds_the_gateway_answers_as_the_legacy_server(
    fixture: str, dialect: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    gateway, legacy = request.getfixturevalue(fixture)
    before = len(legacy.received)
    code, report = probe_rerank(
        tmp_path,
        *("--dialect", dialect, "--model", "reranker", "--max-tokens", str(MAX_TOKENS)),
        *("--baseline", legacy.url, "--candidate", gateway.url),
    )
    assert code == 0, report
    rows = report["rows"]
    assert [r["problem"] for r in rows] == [""] * len(rows)
    queries = [r for r in rows if r["label"].startswith("query ")]
    assert len(queries) == 3 and all(r["baseline_answered"] for r in queries)
    assert all(r["worst_score_difference"] <= 1e-4 for r in queries)
    assert any(r["label"] == "contract: a pair over the limit" for r in rows)
    # the probe's requests to the gateway reached the rerank upstream, not the legacy server
    assert len(legacy.received) == before + len(rows)


def test_probe_names_what_the_raw_upstream_answers_differently(
    cohere: Any, upstreams: Any, tmp_path: Path
) -> None:
    """The Cohere legacy server against vLLM's /rerank itself (the URL names the path):
    for every query an answer a Cohere client does not read (vLLM's has no ``meta``),
    exit 1, each difference named."""
    _, legacy = cohere
    code, report = probe_rerank(
        tmp_path,
        *("--dialect", "cohere-v1", "--model", "reranker"),
        *("--baseline", legacy.url, "--candidate", f"{upstreams[1].url}/rerank"),
    )
    assert code == 1, report
    assert report["meta"]["candidate"] == f"{upstreams[1].url}/rerank"
    queries = [r for r in report["rows"] if r["label"].startswith("query ")]
    assert len(queries) == 3
    for row in queries:
        count = row["baseline"].split()[1]
        assert row["problem"] == f"{count} cohere_v1 results vs no cohere_v1 answer", row
    assert (tmp_path / "report" / "report.html").read_text().count('class="fail"') >= 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "error: --task rerank needs --dialect"),
        (("--dialect", "cohere-v2"), "error: --dialect cohere-v2 sends a model: give --model"),
        (("--dialect", "tei", "--max-tokens", "0"), "error: --max-tokens must be within"),
    ],
)
def test_probe_rerank_arguments_are_one_line_and_exit_2(
    args: tuple[str, ...], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = probe_rerank(
        tmp_path, *args, "--baseline", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9"
    )
    assert (code, report) == (2, {})
    assert capsys.readouterr().err.startswith(message)


def test_probe_rerank_in_another_dialect_is_inconclusive(tei: Any, tmp_path: Path) -> None:
    """The TEI legacy server asked in Cohere's dialect answers no query (404): exit 2,
    saying what to check."""
    gateway, legacy = tei
    code, report = probe_rerank(
        tmp_path,
        *("--dialect", "cohere-v1", "--model", "reranker"),
        *("--baseline", legacy.url, "--candidate", gateway.url),
    )
    assert code == 2 and report["verdict"]["label"] == "INCONCLUSIVE"
    assert "check --dialect" in "\n".join(report["verdict"]["failures"])


def test_rerank_options_without_task_rerank_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from extproc.commands import probe as probe_command
    from extproc.commands.cli import _parser

    argv = ["probe", "--baseline", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9"]
    argv += ["--max-tokens", "64", "--out", str(tmp_path / "report")]
    assert probe_command.run(_parser().parse_args(argv)) == 2
    assert capsys.readouterr().err == "error: --max-tokens goes with --task rerank\n"
    assert not (tmp_path / "report").exists()


def test_learn_finds_every_path_and_run_legacy_sends_none_of_them(
    upstreams: Any, gateways: Gateways, word_tokenizer: Path, qwen_dir: Path, tmp_path: Path
) -> None:
    """A Cohere-style server serving v1 and v2 (and any model name): learn writes an
    entry for each path; the gateway with that policy and `--legacy` answers both
    paths as the legacy server did, and the legacy server receives none of them."""
    from extproc.commands import learn as learn_command
    from extproc.commands.cli import _parser
    from extproc.service.policy_file import load_policy_file

    embeddings, rerank = upstreams
    with FakeLegacyRerank(
        dialect="cohere", max_tokens=MAX_TOKENS, cohere_v2=True, any_model=True
    ) as legacy:
        argv = ["learn", "--task", "rerank", "--baseline", legacy.url, "--candidate", rerank.url]
        argv += ["--model", "reranker", "--tokenizer", f"reranker={word_tokenizer}"]
        argv += ["--out", str(tmp_path)]
        code = learn_command.run(_parser().parse_args(argv))
        md = (tmp_path / "report.md").read_text(encoding="utf-8")
        assert code == 0, md
        entries = load_policy_file(tmp_path / "policy.yaml").rerankers
        assert {(e.path, e.dialect, e.any_name) for e in entries} == {
            ("/v1/rerank", "cohere_v1", True),
            ("/v2/rerank", "cohere_v2", True),
        }
        policy = SHIPPED_QWEN_POLICY.read_text(encoding="utf-8")
        policy += (tmp_path / "policy.yaml").read_text(encoding="utf-8")
        spec = GatewaySpec(
            embeddings.url,
            policy=policy,
            tokenizers=f"{QWEN_MODEL}={qwen_dir},reranker={word_tokenizer}",
            legacy=legacy.url,
            args=("--rerank-upstream", rerank.url),
        )
        with gateways.own(spec) as gateway:
            for path, body in (
                ("/v1/rerank", {"model": "any", "query": QUERY, "documents": DOCS[:4]}),
                ("/v2/rerank", {"model": "reranker", "query": QUERY, "documents": DOCS[:4]}),
                ("/v2/rerank", {"query": QUERY, "documents": DOCS[:2]}),
            ):
                old = http("POST", f"{legacy.url}{path}", body)
                before = len(legacy.received)
                new = http("POST", f"{gateway.url}{path}", body)
                assert_same_rerank_answer(old, new, path)
                assert len(legacy.received) == before, path
