"""`extproc index-check` as a user runs it: a corpus made here (BEIR files, no
download), the seed's legacy stand-in (tests/fake_legacy.py) as the server that
built the index, and as the candidate the real gateway (Envoy + ext_proc) in front
of the fake Dynamo - with the right policy (KEEP INDEX), with faults injected (each
RE-INDEX, its cause named) - or the raw upstream. Plus bad input (exit 2).

The made-up model's vectors pool per-token vectors, so a query made of a
document's first words retrieves that document: the judgements are real ones for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from extproc.commands import index_check as index_check_command
from extproc.commands.cli import _parser
from testing_support.beir_sample import write_sample
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import Gateway, GatewaySpec
from testing_support.processes import free_port
from testing_support.qwen import QWEN_MODEL, SHIPPED_QWEN_POLICY
from tests.fake_legacy import FakeLegacy
from tests.harness import Gateways


def index_check(
    baseline: str, candidate: str, files: dict[str, Path], out: Path, *extra: str
) -> tuple[int, dict[str, Any]]:
    argv = ["index-check", "--baseline", baseline, "--candidate", candidate]
    argv += ["--corpus", str(files["corpus"]), "--queries", str(files["queries"])]
    if "qrels" in files:
        argv += ["--qrels", str(files["qrels"])]
    argv += ["--model", QWEN_MODEL, "--out", str(out), *extra]
    code = index_check_command.run(_parser().parse_args(argv))
    written = out / "report.json"
    report = json.loads(written.read_text(encoding="utf-8")) if written.exists() else {}
    return code, report


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_sample(tmp_path_factory.mktemp("sample"))


@pytest.fixture(scope="module")
def dynamo(qwen_dir: Path) -> Iterator[FakeUpstream]:
    with FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir) as fake:
        yield fake


@pytest.fixture(scope="module")
def legacy(qwen_dir: Path) -> Iterator[FakeLegacy]:
    """The seed's legacy server: the Qwen3 query prompt, a cut at 1,024 tokens."""
    with FakeLegacy(tokenizer_dir=qwen_dir, lax=True) as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(dynamo: FakeUpstream, gateways: Gateways) -> Gateway:
    """The shipped policy for the seed's server, in front of the fake Dynamo."""
    return gateways.shared(GatewaySpec(dynamo.url, policy=SHIPPED_QWEN_POLICY))


@dataclass(frozen=True)
class World:
    legacy: FakeLegacy
    dynamo: FakeUpstream
    gateways: Gateways
    sample: dict[str, Path]


@pytest.fixture(scope="module")
def world(
    legacy: FakeLegacy, dynamo: FakeUpstream, gateways: Gateways, sample: dict[str, Path]
) -> World:
    return World(legacy, dynamo, gateways, sample)


def test_the_gateway_with_the_right_policy_keeps_the_index(
    legacy: FakeLegacy, gateway: Gateway, sample: dict[str, Path], tmp_path: Path
) -> None:
    code, report = index_check(legacy.url, gateway.url, sample, tmp_path)
    assert code == 0, report["result"]
    assert report["result"]["label"] == "KEEP INDEX"
    retrievals = report["retrievals"]
    assert retrievals["new/old"]["overlap"] == 1.0 and retrievals["new/old"]["top1_changed"] == 0
    assert retrievals["old/old"]["ndcg"] > 0.9  # the judgements mean something here
    assert report["cosines"]["documents"]["min"] >= 0.9995
    assert report["reindex"]["estimate_s"] > 0
    assert report["requests"]["baseline"] == 4 + 2  # 120 documents and 40 queries, 32 a batch
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "**Result: KEEP INDEX** (exit code 0)" in md and "Backward compatibility" in md
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert html.count("<svg") == 2


def test_the_raw_upstream_drops_the_query_prompt(
    legacy: FakeLegacy, dynamo: FakeUpstream, tmp_path: Path
) -> None:
    """Without the gateway: the query instruction is dropped (and long documents would
    be a 500, so the sample has none)."""
    files = write_sample(tmp_path / "short", lengths=(60, 150, 400))
    code, report = index_check(legacy.url, dynamo.url, files, tmp_path / "out")
    assert code == 1 and report["result"]["label"] == "RE-INDEX"
    assert "query prompt" in report["result"]["cause"]


def policy_with(entry: str) -> str:
    return SHIPPED_QWEN_POLICY.read_text(encoding="utf-8") + "".join(
        f"    {line}\n" for line in entry.strip().splitlines()
    )


@pytest.mark.parametrize(
    ("entry", "extra", "cause"),
    [
        pytest.param("prompts: {query: '{text}'}", (), "query prompt", id="no-query-prompt"),
        pytest.param(
            "matryoshka: {min_dimensions: 32, renormalise: false}",
            ("--dimensions", "256"),
            "not normalised",
            id="cut-not-renormalised",
        ),
        pytest.param("max_tokens: 100", (), "cut point", id="another-cut"),
    ],
)
def test_a_gateway_that_does_not_imitate_is_named(
    entry: str, extra: tuple[str, ...], cause: str, world: World, tmp_path: Path
) -> None:
    spec = GatewaySpec(world.dynamo.url, policy=policy_with(entry))
    with world.gateways.own(spec) as wrong:
        code, report = index_check(world.legacy.url, wrong.url, world.sample, tmp_path, *extra)
    assert code == 1 and report["result"]["label"] == "RE-INDEX", report["result"]
    assert cause in report["result"]["cause"]


def test_another_model_is_named(
    qwen_dir: Path, gateway: Gateway, sample: dict[str, Path], tmp_path: Path
) -> None:
    with FakeLegacy(tokenizer_dir=qwen_dir, lax=True, other_model=True) as other:
        code, report = index_check(other.url, gateway.url, sample, tmp_path)
    assert code == 1 and "another model" in report["result"]["cause"]
    assert report["retrievals"]["new/old"]["overlap"] < 0.5


def test_few_queries_are_inconclusive(legacy: FakeLegacy, gateway: Gateway, tmp_path: Path) -> None:
    files = write_sample(tmp_path / "small", documents=40, queries=10)
    code, report = index_check(legacy.url, gateway.url, files, tmp_path / "out")
    assert code == 2 and report["result"]["label"] == "INCONCLUSIVE"


def test_bad_input_exits_2(
    legacy: FakeLegacy, sample: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad_qrels = tmp_path / "qrels.tsv"
    bad_qrels.write_text("query-id\tcorpus-id\tscore\nq0\tnope\t1\n", encoding="utf-8")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    down = f"http://127.0.0.1:{free_port()}"
    cases = [
        ({**sample, "qrels": bad_qrels}, legacy.url, "document ids the corpus lacks"),
        ({**sample, "corpus": empty}, legacy.url, "no document"),
        ({**sample, "corpus": tmp_path / "missing.jsonl"}, legacy.url, "missing.jsonl"),
        (sample, down, "connection refused"),
    ]
    for files, candidate, says in cases:
        code, _ = index_check(legacy.url, candidate, files, tmp_path / "out")
        err = capsys.readouterr().err
        assert code == 2 and says in err, err
        assert err.count("error: ") == 1
    # a budget too small for the sample: stopped, never past it
    code, _ = index_check(legacy.url, legacy.url, sample, tmp_path / "out", "--budget", "3")
    assert code == 2 and "budget of 3 requests is spent" in capsys.readouterr().err


def test_a_tei_index_is_checked_in_teis_dialect(
    dynamo: FakeUpstream, gateways: Gateways, sample: dict[str, Path], qwen_dir: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    """`--dialect tei`: both servers asked as TEI's clients ask (/embed, `inputs`,
    `prompt_name`), both answers read as TEI's rows; the gateway serving TEI keeps the
    index a TEI legacy server built."""
    policy = yaml.safe_load(SHIPPED_QWEN_POLICY.read_text(encoding="utf-8"))
    policy["models"][0]["serves"] = [{"dialect": "TEI"}]
    gateway = gateways.shared(GatewaySpec(dynamo.url, policy=yaml.safe_dump(policy)))
    with FakeLegacy(tokenizer_dir=qwen_dir, lax=True, dialects=("tei",)) as tei:
        code, report = index_check(tei.url, gateway.url, sample, tmp_path, "--dialect", "tei")
        sent = [orjson.loads(body) for body in tei.received]
    assert code == 0, report["result"]
    assert report["result"]["label"] == "KEEP INDEX"
    assert report["cosines"]["documents"]["min"] >= 0.9995
    assert sent and all("inputs" in doc and "input" not in doc for doc in sent)
    assert {doc.get("prompt_name") for doc in sent} == {"document", "query"}
