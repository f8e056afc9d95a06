"""`extproc index-check` end to end: the real legacy MiniLM server (FastAPI +
transformers, E5 prompts, a cut at 128 tokens: tests/e2e/legacy_minilm_app.py) built
the index; the gateway with the policy that says its contract, in front of the real
vLLM and the real Dynamo 1.6.1, keeps it (KEEP INDEX); the raw upstream, which drops
the prompts, does not (RE-INDEX)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from extproc.commands import index_check as index_check_command
from extproc.commands.cli import _parser
from testing_support.beir_sample import write_sample
from testing_support.gateway import Gateway
from testing_support.real_upstream import SERVED_MODEL, RealEnv, Stack
from tests.e2e.conftest import minilm
from tests.harness import Gateways

E5_POLICY = """
models:
  - name: all-MiniLM-L6-v2
    max_tokens: 128
    native_dimensions: 384
    matryoshka: {min_dimensions: 32}
    encoding_profile: LEGACY
    upstream: {kind: KIND}
    tokenizer: {special_tokens: {from_tokenizer: true}}
    prompts: {query: "query: {text}", document: "passage: {text}"}
"""


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_sample(tmp_path_factory.mktemp("index-sample"), documents=160, queries=40)


def index_check(
    baseline: str, candidate: str, files: dict[str, Path], out: Path
) -> tuple[int, Any]:
    argv = [
        "index-check",
        "--baseline",
        baseline,
        "--candidate",
        candidate,
        "--model",
        SERVED_MODEL,
    ]
    argv += ["--corpus", str(files["corpus"]), "--queries", str(files["queries"])]
    argv += ["--qrels", str(files["qrels"]), "--out", str(out)]
    code = index_check_command.run(_parser().parse_args(argv))
    return code, json.loads((out / "report.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def e5_gateway(upstream: Stack, env: RealEnv, gateways: Gateways) -> Gateway:
    """The policy that says the legacy app's contract, in front of ``upstream``."""
    return gateways.shared(minilm(upstream, E5_POLICY.replace("KIND", upstream.kind), env))


def test_the_gateway_keeps_the_index(
    legacy: Stack, e5_gateway: Gateway, sample: dict[str, Path], tmp_path: Path
) -> None:
    code, report = index_check(legacy.url, e5_gateway.url, sample, tmp_path)
    assert code == 0, report["result"]
    assert report["cosines"]["documents"]["min"] >= 0.9995
    assert report["cosines"]["queries"]["min"] >= 0.9995
    assert report["retrievals"]["new/old"]["overlap"] >= 0.99
    assert report["retrievals"]["old/old"]["ndcg"] > 0.8


def test_the_raw_upstream_does_not(
    legacy: Stack, upstream: Stack, sample: dict[str, Path], tmp_path: Path
) -> None:
    short = write_sample(tmp_path / "short", documents=160, queries=40, lengths=(20, 40, 60))
    code, report = index_check(legacy.url, upstream.url, short, tmp_path / "out")
    assert code == 1 and report["result"]["label"] == "RE-INDEX", report["result"]
    assert report["result"]["cause"]
