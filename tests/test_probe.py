"""`extproc probe`: the pure computations, the fake legacy server, and two end-to-end
runs (quick mode) with the fake legacy server as the baseline:

(a) candidate = the fake Dynamo 1.6.1 alone: not ready (exit 1); the contract table
    shows `dimensions` -> 500, and the dropped query instruction is caught by comparing
    the query vectors (cosine far below the threshold) although both answer 200;
(b) candidate = our gateway (real Envoy + ext_proc, shipped policy) in front of the
    fake Dynamo: ready (exit 0), cosine 1.0 everywhere, every contract row the same.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from extproc.commands import probe as probe_command
from extproc.core.status import status_class
from extproc.tools.parity import Answer, ExitCode, Thresholds, cosine
from extproc.tools.probe.html_report import to_html
from extproc.tools.probe.latency import (
    QUICK_PLAN,
    Figures,
    LatencyPlan,
    LatencyResult,
    RunSample,
    SideLatency,
    Timing,
    combine,
    figures,
    ratios,
)
from extproc.tools.probe.probe_report import EmbeddingsSections, Meta, ProbeReport, to_markdown
from extproc.tools.probe.probe_verdict import decide
from extproc.tools.toolkit.contract_table import Cell, Probe, compare_row, error_text, observe
from extproc.tools.toolkit.corpus import CorpusError, Item, batches, load_corpus, parse_corpus
from extproc.tools.toolkit.embeddings_client import EmbeddingsClient, endpoint_url
from extproc.tools.toolkit.long_text import long_text
from extproc.tools.toolkit.readiness_checks import PROBE_THRESHOLDS
from extproc.tools.toolkit.report_format import cell
from extproc.tools.toolkit.stats import histogram, percentile, ratio, spread
from extproc.tools.toolkit.svg_charts import cosine_histogram, grouped_bars
from extproc.tools.toolkit.vector_parity import (
    CosineSet,
    ParityResult,
    SideSummary,
    compare_vectors,
)
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import Gateway, GatewaySpec
from testing_support.http import http
from testing_support.processes import free_port
from testing_support.qwen import QWEN_EOS, QWEN_MODEL
from tests.fake_legacy import DEFAULT_TASK, FakeLegacy, qwen3_query
from tests.harness import Gateways

EXTERNAL_REF = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)


def vec(*xs: float) -> np.ndarray[Any, np.dtype[np.float64]]:
    return np.array(xs, dtype=np.float64)


# --------------------------------------------------------------------- stats


def test_percentile_matches_numpy_linear() -> None:
    rng = np.random.default_rng(7)
    for n in (1, 2, 7, 30, 40):
        values = [float(x) for x in rng.uniform(1, 300, n)]
        for q in (0, 1, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_cosine_spread_histogram_ratio() -> None:
    assert cosine(vec(1, 0), vec(2, 0)) == pytest.approx(1.0)
    assert cosine(vec(1, 0), vec(0, 3)) == pytest.approx(0.0)
    assert cosine(vec(1, 1), vec(-1, -1)) == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        cosine(vec(1, 0), vec(1, 0, 0))
    with pytest.raises(ValueError):
        cosine(vec(0, 0), vec(1, 0))
    s = spread([0.9996, 0.9999, 0.9998])
    assert (s.n, s.min, s.median, s.max) == (3, 0.9996, 0.9998, 0.9999)
    assert histogram([0.0, 0.5, 1.0, 2.0, -1.0], 0.0, 1.0, 2) == [2, 3]
    assert ratio(2.0, 4.0) == 0.5
    assert ratio(None, 1.0) is None and ratio(1.0, 0.0) is None


# --------------------------------------------------------------------- answers, client


def test_answers_are_read_float_base64_and_in_index_order() -> None:
    v0, v1 = [0.6, 0.8], [1.0, 0.0]
    packed = base64.b64encode(np.array(v1, dtype="<f4").tobytes()).decode()
    body = orjson.dumps(
        {
            "data": [{"index": 1, "embedding": v1}, {"index": 0, "embedding": v0}],
            "usage": {"prompt_tokens": 7},
        }
    )
    answer = Answer.read(200, body)
    assert answer.encoding == "float" and answer.prompt_tokens == 7 and answer.dims == 2
    assert answer.vectors is not None and answer.vectors[0].tolist() == pytest.approx(v0)
    b64 = Answer.read(200, orjson.dumps({"data": [{"index": 0, "embedding": packed}]}))
    assert b64.encoding == "base64" and b64.prompt_tokens is None
    assert b64.vectors is not None and b64.vectors[0].tolist() == v1
    mixed = orjson.dumps(
        {"data": [{"index": 0, "embedding": v1}, {"index": 1, "embedding": packed}]}
    )
    assert Answer.read(200, mixed).encoding == "mixed"
    for bad in (
        b"nope",
        b"{}",
        b'{"data":[{"index":3,"embedding":[1]}]}',
        b'{"data":[{"embedding":"@@"}]}',
    ):
        unusable = Answer.read(200, bad)
        assert unusable.vectors is None and unusable.problem, bad
    assert Answer.read(503, body).vectors is None  # only a 2xx body is read


def test_error_text_reads_every_envelope() -> None:
    assert error_text(b'{"error":{"message":"bad dims","type":"x"}}') == "bad dims"
    assert error_text(b'{"message":"Internal server error","code":500}') == "Internal server error"
    assert error_text(b'{"detail":"Model \'x\' not found"}') == "Model 'x' not found"
    detail = b'{"detail":[{"loc":["body","input"],"msg":"Field required"}]}'
    assert error_text(detail) == "body.input: Field required"
    assert error_text(b"") == "(empty body)"
    assert error_text(b"plain " * 40).endswith("…")
    assert status_class(503) == "5xx" and status_class(0) == "no answer"


def test_endpoint_url() -> None:
    assert endpoint_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1/embeddings"
    assert endpoint_url("http://h:1/v1/") == "http://h:1/v1/embeddings"
    assert endpoint_url("https://h/api/v1/embeddings") == "https://h/api/v1/embeddings"
    assert endpoint_url("http://h/prefix") == "http://h/prefix/v1/embeddings"
    for bad in ("127.0.0.1:8000", "ftp://h", "http://", "http://h/?x=1"):
        with pytest.raises(ValueError):
            endpoint_url(bad)


def test_client_reports_no_answer_quickly() -> None:
    client = EmbeddingsClient(f"http://127.0.0.1:{free_port()}", timeout_s=2.0)
    try:
        result = client.post(b"{}")
    finally:
        client.close()
    assert result.status == 0 and result.error == "connection refused"


# --------------------------------------------------------------------- corpus


def test_default_corpus() -> None:
    corpus = load_corpus(None)
    assert len(corpus.documents) == 40 and len(corpus.queries) == 8
    assert sum(d.lang == "ko" for d in corpus.documents) == 20
    assert [len(b) for b in batches(corpus.documents, 8)] == [8] * 5


def test_corpus_errors_name_the_line(tmp_path: Path) -> None:
    good = '{"id":"d1","kind":"document","text":"a"}\n{"id":"q1","kind":"query","text":"b"}\n'
    assert len(parse_corpus(good.splitlines(), "x").documents) == 1
    cases = {
        '{"id":"d1","kind":"document","text":"a"}\n{"id":"d1","kind":"query","text":"b"}': ":2: duplicate",
        '{"id":"d1","kind":"doc","text":"a"}': ":1: 'kind'",
        "[1]": ":1: expected an object",
        '{"id":"d1","kind":"document","text":"a"}': "no queries",
        "not json": ":1: not JSON",
    }
    for text, expected in cases.items():
        with pytest.raises(CorpusError, match=re.escape(expected)):
            parse_corpus(text.splitlines(), "x")
    with pytest.raises(CorpusError):
        load_corpus(tmp_path / "missing.jsonl")


def test_long_text_size() -> None:
    docs = [Item(f"d{i}", "document", "word " * 10) for i in range(4)]
    text, estimate = long_text(docs, target_tokens=3000, documents_tokens=4 * 12)
    rounds = text.count("word") // 40
    assert estimate == rounds * 44 and estimate >= 3000 and rounds == 69


# --------------------------------------------------------------------- contract rows


def _cell(status: int, *, kind: str = "array", dims: int = 4, tokens: int = 9) -> Cell:
    if status != 200:
        return Cell(status=status, result="error")
    return Cell(status, "ok", kind=kind, count=1, dimensions=(dims,), prompt_tokens=tokens)


def _answer(values: list[float], kind: str = "array") -> Any:
    v = np.array(values, dtype="<f4")
    emb: Any = base64.b64encode(v.tobytes()).decode() if kind == "base64" else v.tolist()
    return Answer.read(
        200, orjson.dumps({"data": [{"index": 0, "embedding": emb}], "usage": {"prompt_tokens": 9}})
    )


VALID = Probe("p", "`p`", b"{}", valid=True, hint="the instruction is dropped")
INVALID = Probe("q", "`q`", b"{}", valid=False)


def test_compare_row_rules() -> None:
    a = _answer([1, 0, 0, 0])
    row = compare_row(
        VALID, base=_cell(200), base_answer=a, cand=_cell(500), cand_answer=None, min_cosine=0.9995
    )
    assert row.severity == "fail" and row.notes == ("status class 2xx vs 5xx",)

    far = _answer([0.4, 0.9, 0, 0])
    row = compare_row(
        VALID,
        base=_cell(200, tokens=28),
        base_answer=a,
        cand=_cell(200, tokens=9),
        cand_answer=far,
        min_cosine=0.9995,
    )
    assert row.severity == "fail" and row.cosine_min is not None and row.cosine_min < 0.5
    assert "the instruction is dropped" in row.notes[0] and "prompt tokens 28 vs 9" in row.notes

    b64 = _answer([1, 0, 0, 0], "base64")
    row = compare_row(
        VALID,
        base=_cell(200),
        base_answer=a,
        cand=_cell(200, kind="base64 string"),
        cand_answer=b64,
        min_cosine=0.9995,
    )
    assert row.severity == "fail" and row.notes == ("encoding array vs base64 string",)
    assert row.cosine_min == pytest.approx(1.0)

    row = compare_row(
        VALID,
        base=_cell(200),
        base_answer=a,
        cand=_cell(200, tokens=10),
        cand_answer=a,
        min_cosine=0.9995,
    )
    assert row.severity == "warn" and row.notes == ("prompt tokens 9 vs 10",)

    short = _answer([1, 0])
    row = compare_row(
        VALID,
        base=_cell(200),
        base_answer=a,
        cand=_cell(200, dims=2),
        cand_answer=short,
        min_cosine=0.9995,
    )
    assert row.severity == "fail" and row.notes[0] == "dimensions 4 vs 2"

    row = compare_row(
        INVALID,
        base=_cell(422),
        base_answer=None,
        cand=_cell(400),
        cand_answer=None,
        min_cosine=0.9995,
    )
    assert row.severity == "ok" and row.notes == ("status 422 vs 400",)
    row = compare_row(
        INVALID,
        base=_cell(422),
        base_answer=None,
        cand=_cell(500),
        cand_answer=None,
        min_cosine=0.9995,
    )
    assert row.severity == "warn" and "clients may retry" in row.notes[0]


def test_observe_summarises_cells() -> None:
    from extproc.runtime.blocking_http import HttpResult

    cell_ok, answer = observe(
        HttpResult(
            200,
            orjson.dumps(
                {
                    "data": [{"index": i, "embedding": [1.0, 0.0]} for i in range(2)],
                    "usage": {"prompt_tokens": 1234},
                }
            ),
            0.01,
        )
    )
    assert cell_ok.text == "200, 2×2 array, 1,234 tokens" and answer is not None
    cell_err, none = observe(HttpResult(500, b'{"message":"Internal server error"}', 0.01))
    assert cell_err.text == "500, Internal server error" and none is None
    cell_gone, _ = observe(HttpResult(0, b"", 0.01, "timed out"))
    assert cell_gone.text == "no answer (timed out)" and cell_gone.status_class == "no answer"


# --------------------------------------------------------------------- latency, verdict


def _sample(seq: list[float], conc: list[float], wall: float, failed: int = 0) -> RunSample:
    outcomes = [Timing(True, ms) for ms in conc] + [Timing(False, 1.0, "HTTP 500")] * failed
    return RunSample(tuple(Timing(True, ms) for ms in seq), tuple(outcomes), wall, 8 * len(conc))


def test_latency_figures_and_median_of_repetitions() -> None:
    one = figures(_sample([10, 20, 30], [40, 50], 0.5))
    assert one.sequential_p50_ms == 20 and one.concurrent_docs_per_s == 32.0 and one.errors == 0
    side = combine(
        [_sample([10], [40], 1.0), _sample([30], [60], 0.5, failed=2), _sample([20], [50], 0.25)]
    )
    assert side.median.sequential_p50_ms == 20 and side.median.concurrent_p50_ms == 50
    assert side.median.concurrent_docs_per_s == 16.0  # 8, 16, 32 docs/s
    assert side.median.errors == 2 and side.error_examples == ("HTTP 500", "HTTP 500")
    assert [r.concurrent_docs_per_s for r in side.repetitions] == [8.0, 16.0, 32.0]
    r = ratios(side.median, Figures(10.0, None, 100.0, 1.0, 32.0, 0))
    assert r["sequential_p50_ms"] == 0.5 and r["sequential_p99_ms"] is None
    assert r["concurrent_docs_per_s"] == 2.0
    assert (QUICK_PLAN.sequential, QUICK_PLAN.concurrent, QUICK_PLAN.repetitions) == (10, 8, 1)
    assert (LatencyPlan().sequential, LatencyPlan().concurrent, LatencyPlan().repetitions) == (
        30,
        40,
        3,
    )


def _parity(
    doc_cosines: list[float],
    *,
    dims: tuple[int, int] = (1024, 1024),
    base_errors: tuple[str, ...] = (),
) -> ParityResult:
    ids = [f"d{i}" for i in range(len(doc_cosines))]
    docs = CosineSet(tuple(ids), tuple(doc_cosines), spread(doc_cosines))
    embedded = 0 if base_errors else len(ids)
    return ParityResult(
        documents_total=len(ids),
        baseline=SideSummary(dims[0], 1.0, 100, embedded, base_errors),
        candidate=SideSummary(dims[1], 1.0, 100, len(ids), ()),
        documents=docs,
        queries=CosineSet((), (), None),
    )


def _latency(errors: int = 0) -> LatencyResult:
    f = Figures(1.0, 2.0, 3.0, 4.0, 5.0, 0)
    bad = Figures(1.0, 2.0, 3.0, 4.0, 5.0, errors)
    return LatencyResult(
        LatencyPlan(),
        SideLatency((f,), f, ()),
        SideLatency((bad,), bad, ("HTTP 503",) if errors else ()),
        {},
    )


def test_verdict() -> None:
    t = Thresholds(0.9995)
    assert decide(_parity([0.9999, 0.9997]), [], _latency(), t).exit_code == ExitCode.READY
    low = decide(_parity([0.9999, 0.9990]), [], _latency(), t)
    assert low.exit_code == ExitCode.NOT_READY and "d1" in low.failures[0]
    dims = decide(_parity([1.0], dims=(1024, 768)), [], _latency(), t)
    assert dims.exit_code == ExitCode.NOT_READY and "dimension 1024 vs 768" in dims.failures[0]
    errs = decide(_parity([1.0]), [], _latency(errors=3), t)
    assert errs.failures == ("latency: 3 errors on the candidate (e.g. HTTP 503)",)
    base_down = decide(_parity([1.0], base_errors=("batch: connection refused",)), [], None, t)
    assert base_down.exit_code == ExitCode.INCONCLUSIVE and base_down.label == "inconclusive"
    warn_row = compare_row(
        INVALID,
        base=_cell(422),
        base_answer=None,
        cand=_cell(500),
        cand_answer=None,
        min_cosine=0.9995,
    )
    warned = decide(_parity([1.0]), [warn_row], _latency(), t)
    assert warned.ready and len(warned.warnings) == 1


# --------------------------------------------------------------------- rendering


def _report(verdict_rows: list[Any]) -> ProbeReport:
    parity = _parity([1.0, 0.99999])
    latency = _latency()
    meta = Meta(
        baseline="http://b/v1/embeddings",
        candidate="http://c/v1/embeddings",
        model="m",
        started="t",
        duration_s=1.0,
        task="embeddings",
        corpus="corpus",
        documents=2,
        queries=0,
    )
    t = PROBE_THRESHOLDS
    sections = EmbeddingsSections(t, parity, verdict_rows, latency)
    return ProbeReport(meta, decide(parity, verdict_rows, latency, t), sections)


def test_markdown_and_html_rendering() -> None:
    assert cell("a|b\nc") == "a\\|b c"
    row = compare_row(
        Probe("x", "`pipe|probe`", b"{}", valid=False),
        base=Cell(422, "a | b"),
        base_answer=None,
        cand=Cell(400, "<script>"),
        cand_answer=None,
        min_cosine=0.9995,
    )
    report = _report([row])
    md = to_markdown(report)
    assert "**Verdict: READY** (exit code 0)" in md
    assert (
        "| `pipe\\|probe` | no | 422, a \\| b | 400, <script> | - | ✓ same (status 422 vs 400) |"
        in md
    )
    html = to_html(report)
    assert "&lt;script&gt;" in html and "<script" not in html
    assert not EXTERNAL_REF.search(html) and "<link" not in html and "url(" not in html
    svg = cosine_histogram([0.5, 0.99, 1.0], 0.9995, "t")
    assert svg.count("<rect") == 2 and "threshold 0.9995" in svg  # 0.99 and 1.0 share a bin
    assert "no values" in cosine_histogram([], 0.9995, "t")
    bars = grouped_bars(["a", "b"], [("x", [1.0, None]), ("y", [2.0, 3.0])], "t", "ms")
    assert bars.count("<rect") == 2 + 3  # legend + bars


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="extproc")
    probe_command.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def test_options() -> None:
    p = _parser()
    quick = probe_command.options_from(
        p.parse_args(["probe", "--baseline", "http://a", "--candidate", "http://b", "--quick"])
    )
    assert quick.plan == QUICK_PLAN and quick.thresholds.min_cosine == 0.9995
    full = probe_command.options_from(
        p.parse_args(
            [
                "probe",
                "--baseline",
                "http://a",
                "--candidate",
                "http://b",
                "--repetitions",
                "5",
                "--header",
                "X-Key: v",
            ]
        )
    )
    assert (
        full.plan.repetitions == 5
        and full.plan.sequential == 30
        and full.servers.headers == {"X-Key": "v"}
    )
    assert p.parse_args(["probe", "--baseline", "a", "--candidate", "b"]).out == Path(
        "probe-report"
    )
    for bad in (
        ["--repetitions", "0"],
        ["--min-cosine", "2"],
        ["--timeout", "0"],
        ["--header", "novalue"],
    ):
        with pytest.raises(ValueError):
            probe_command.options_from(
                p.parse_args(["probe", "--baseline", "http://a", "--candidate", "http://b", *bad])
            )
    args = p.parse_args(["probe", "--baseline", "a:1", "--candidate", "http://b"])
    assert probe_command.run(args) == 2


# --------------------------------------------------------------------- the fake legacy server


@pytest.fixture(scope="module")
def dynamo(upstream: FakeUpstream) -> FakeUpstream:
    return upstream


@pytest.fixture(scope="module")
def legacy(qwen_dir: Path) -> Iterator[FakeLegacy]:
    with FakeLegacy(tokenizer_dir=qwen_dir) as fake:
        yield fake


def _vectors(reply: Any) -> list[np.ndarray[Any, Any]]:
    return [np.array(d["embedding"], dtype=np.float32) for d in reply.json()["data"]]


def test_fake_legacy_contract(legacy: FakeLegacy, dynamo: FakeUpstream) -> None:
    url = f"{legacy.url}/v1/embeddings"
    query = "What is the capital city of France?"
    plain = http("POST", url, {"model": QWEN_MODEL, "input": [query], "encoding_format": "base64"})
    assert plain.status == 200 and plain.json()["usage"]["prompt_tokens"] == 9
    assert isinstance(plain.json()["data"][0]["embedding"], list)  # encoding_format ignored
    (v,) = _vectors(plain)
    assert np.array_equal(v, dynamo.embed_ids(dynamo.tokenize(query)))

    instructed = http("POST", url, {"model": QWEN_MODEL, "input": query, "input_type": "query"})
    assert instructed.json()["usage"]["prompt_tokens"] == 28
    (vq,) = _vectors(instructed)
    assert np.array_equal(vq, dynamo.embed_ids(dynamo.tokenize(qwen3_query(query, DEFAULT_TASK))))
    custom = http("POST", url, {"model": QWEN_MODEL, "input": query, "instruction": "Find it"})
    (vc,) = _vectors(custom)
    assert np.array_equal(
        vc, dynamo.embed_ids(dynamo.tokenize(f"Instruct: Find it\nQuery:{query}"))
    )

    long_text_ = "서울은 대한민국의 수도이다. " * 400
    cut = http("POST", url, {"model": QWEN_MODEL, "input": long_text_, "dimensions": 256})
    assert cut.status == 200 and cut.json()["usage"]["prompt_tokens"] == 1024
    (vl,) = _vectors(cut)
    ids = dynamo.tokenize(long_text_)
    assert len(ids) > 1024
    expected = dynamo.embed_ids(ids[:1023] + [QWEN_EOS], 256)
    assert vl.shape == (256,) and np.allclose(vl, expected, atol=1e-7)

    for body, status in (
        (b'{"model": "x", "input": ', 422),
        ({"model": QWEN_MODEL, "input": []}, 422),
        ({"model": QWEN_MODEL, "input": "a", "dimensions": 31}, 422),
        ({"model": QWEN_MODEL, "input": "a", "dimensions": 1025}, 422),
        ({"model": QWEN_MODEL, "input": [[1, 2]]}, 422),
        ({"model": QWEN_MODEL, "input": "a", "input_type": "document", "instruction": "x"}, 422),
        ({"model": "other", "input": "a"}, 404),
    ):
        reply = http("POST", url, body)
        assert reply.status == status, (body, reply.body)
        assert "detail" in reply.json()
    assert http("POST", url, {"input": "a"}).status == 200  # model defaults to the served one


# --------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def gateway(dynamo: FakeUpstream, gateways: Gateways) -> Gateway:
    return gateways.shared(GatewaySpec(dynamo.url))


def _probe(
    baseline: str, candidate: str, out: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, Any], str]:
    args = _parser().parse_args(
        ["probe", "--baseline", baseline, "--candidate", candidate, "--quick", "--out", str(out)]
    )
    code = probe_command.run(args)
    printed = capsys.readouterr().out
    md = (out / "report.md").read_text(encoding="utf-8")
    assert printed == md
    html = (out / "report.html").read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and html.count("<svg") >= 4
    assert not EXTERNAL_REF.search(html), "report.html must not load anything"
    assert (
        "<script" not in html and "<link" not in html and "<img" not in html and "url(" not in html
    )
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["verdict"]["exit_code"] == code
    return code, report, md


def _rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["key"]: row for row in report["contract"]}


def test_probe_catches_raw_dynamo(
    legacy: FakeLegacy, dynamo: FakeUpstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report, md = _probe(legacy.url, dynamo.url, tmp_path / "raw", capsys)
    assert code == 1 and report["verdict"]["label"] == "NOT READY"
    # the documents themselves are at parity: the breakage is all in the contract
    assert report["parity"]["documents"]["spread"]["min"] == pytest.approx(1.0, abs=1e-6)
    assert (
        report["parity"]["baseline"]["prompt_tokens"]
        == report["parity"]["candidate"]["prompt_tokens"]
    )
    rows = _rows(report)
    assert rows["dimensions_256"]["candidate"]["status"] == 500
    assert rows["dimensions_256"]["baseline"]["dimensions"] == [256]
    assert rows["dimensions_256"]["severity"] == "fail"
    query = rows["input_type_query"]
    assert query["baseline"]["status"] == query["candidate"]["status"] == 200
    assert query["severity"] == "fail" and query["cosine_min"] < 0.9
    assert query["baseline"]["prompt_tokens"] > query["candidate"]["prompt_tokens"]
    assert rows["instruction"]["severity"] == "fail"
    assert (
        rows["long_input"]["candidate"]["status"] == 500
        and rows["long_input"]["baseline"]["prompt_tokens"] == 1024
    )
    assert (
        rows["base64"]["candidate"]["kind"] == "base64 string"
        and rows["base64"]["baseline"]["kind"] == "array"
    )
    assert rows["dimensions_0"]["severity"] == "warn"  # 422 vs 500: reported, not gating
    assert rows["unknown_model"]["severity"] == "ok"
    failures = "\n".join(report["verdict"]["failures"])
    assert "query instruction is dropped" in failures
    assert "**Verdict: NOT READY** (exit code 1)" in md
    assert re.search(
        r"\| `input_type: \"query\"` \(8 queries\) \| yes \| 200, 8×1024 array, \d+ tokens \| 200, 8×1024 array, \d+ tokens \| 0\.\d+ \| ✗ differs",
        md,
    )
    assert (
        "| `dimensions: 256` | yes | 200, 2×256 array" in md
        and "| 500, Internal server error |" in md
    )


def test_probe_finds_gateway_ready(
    legacy: FakeLegacy, gateway: Gateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report, md = _probe(legacy.url, gateway.url, tmp_path / "gateway", capsys)
    assert code == 0, md
    assert report["verdict"]["ready"] and report["verdict"]["failures"] == []
    assert report["verdict"]["warnings"] == []
    parity = report["parity"]
    assert parity["baseline"]["dimension"] == parity["candidate"]["dimension"] == 1024
    assert parity["baseline"]["prompt_tokens"] == parity["candidate"]["prompt_tokens"]
    assert parity["documents"]["spread"]["n"] == 40
    assert parity["documents"]["spread"]["min"] == pytest.approx(1.0, abs=1e-6)
    assert parity["queries"]["spread"]["min"] == pytest.approx(1.0, abs=1e-6)
    rows = _rows(report)
    assert all(row["severity"] == "ok" for row in rows.values()), rows
    for key in ("dimensions_256", "input_type_query", "instruction", "long_input", "base64"):
        assert rows[key]["cosine_min"] == pytest.approx(1.0, abs=1e-6), key
        assert rows[key]["baseline"]["prompt_tokens"] == rows[key]["candidate"]["prompt_tokens"], (
            key
        )
    assert rows["dimensions_256"]["candidate"]["dimensions"] == [256]
    assert rows["long_input"]["candidate"]["prompt_tokens"] == 1024
    assert rows["base64"]["candidate"]["kind"] == "array"
    for key in ("malformed_json", "empty_input", "dimensions_0"):
        assert rows[key]["candidate"]["status"] == 400 and rows[key]["baseline"]["status"] == 422
    latency = report["latency"]
    assert latency["plan"]["repetitions"] == 1 and latency["plan"]["sequential"] == 10
    assert latency["baseline"]["median"]["errors"] == latency["candidate"]["median"]["errors"] == 0
    assert latency["ratios"]["concurrent_docs_per_s"] > 0
    assert "**Verdict: READY** (exit code 0)" in md and "✗" not in md


def test_probe_without_baseline_is_inconclusive(
    dynamo: FakeUpstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _parser().parse_args(
        [
            "probe",
            "--baseline",
            f"http://127.0.0.1:{free_port()}",
            "--candidate",
            dynamo.url,
            "--quick",
            "--out",
            str(tmp_path),
        ]
    )
    assert probe_command.run(args) == 2
    md = capsys.readouterr().out
    assert "**Verdict: INCONCLUSIVE**" in md and "connection refused" in md
    assert "Not measured" in md


def test_compare_vectors_counts_missing_and_other_lengths() -> None:
    base = {"a": vec(1, 0), "b": vec(0, 1), "c": vec(1, 1)}
    cand = {"a": vec(1, 0), "c": vec(1, 1, 0)}
    result = compare_vectors(["a", "b", "c"], base, cand)
    assert result.ids == ("a",) and result.cosines[0] == pytest.approx(1.0)
    assert result.missing == ("b",) and result.incomparable == ("c",)
    assert compare_vectors(["b"], base, cand).spread is None


def test_probe_with_candidate_down_is_not_ready(
    legacy: FakeLegacy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _parser().parse_args(
        [
            "probe",
            "--baseline",
            legacy.url,
            "--candidate",
            f"http://127.0.0.1:{free_port()}",
            "--quick",
            "--out",
            str(tmp_path),
        ]
    )
    assert probe_command.run(args) == 1
    md = capsys.readouterr().out
    assert "**Verdict: NOT READY**" in md
    assert "parity: the candidate embedded 0/40 documents" in md
    assert "| 200, 2×256 array, 167 tokens | no answer (connection refused) |" in md
    assert "Not measured: the candidate answered no parity request." in md
