"""`extproc learn` against stand-in legacy servers (tests/fake_legacy.py, parametrised)
and the fake Dynamo and vLLM (testing_support/fake_upstream.py): the policy each run writes,
the exit code, the report, and - through the verify step, which starts the real
gateway (ext_proc + Envoy) with the learned policy in front of the fake upstream and
compares it with the stand-in by the probe's checks - that the gateway then answers
like its stand-in. Plus the pure parts: the cut-point search, the prompt candidates,
the policy writer.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from extproc.commands import learn as learn_command
from extproc.commands.cli import _parser
from extproc.core.api_errors import ErrorClass
from extproc.core.policy import load_policy_text
from extproc.core.policy.model import EncodingProfile, Matryoshka, TokenizerSource
from extproc.service.policy_file import load_policy_file
from extproc.tools.learn.basics_learner import learn_basics
from extproc.tools.learn.local import LocalModel, Template, templates
from extproc.tools.learn.profile_learner import LearnedEncoding
from extproc.tools.learn.session import Session
from extproc.tools.learn.truncation_learner import _cut_point
from extproc.tools.learn.upstream_learner import learn_max_tokens
from testing_support.fake_upstream import FakeUpstream
from testing_support.processes import free_port
from testing_support.qwen import QWEN_EOS, QWEN_MODEL, SHIPPED_QWEN_POLICY, qwen_tokenizer_dir
from tests.fake_legacy import FakeLegacy
from tests.learning import assert_gateway_like_baseline, findings, learn

QWEN3_QUERY = "Instruct: {instruction}\nQuery:{text}"
QWEN3_TASK = "Given a web search query, retrieve relevant passages that answer the query"


@pytest.fixture(scope="module")
def dynamo(qwen_dir: Path) -> Iterator[FakeUpstream]:
    with FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir) as fake:
        yield fake


# --------------------------------------------------------------------- end to end


def test_learns_the_seed_server_as_the_shipped_policy(
    qwen_dir: Path, dynamo: FakeUpstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The seed's legacy server in front of Dynamo: the policy a person wrote by hand
    (extproc/policies/qwen3-embedding-0.6b.yaml), learned and verified."""
    with FakeLegacy(tokenizer_dir=qwen_dir, lax=True) as legacy:
        code, policy, report, md = learn(legacy, dynamo, tmp_path)
    assert code == 0, report["problems"]
    shipped = load_policy_file(SHIPPED_QWEN_POLICY, tokenizer_overrides={QWEN_MODEL: qwen_dir})
    expected = shipped.models[QWEN_MODEL]
    assert policy is not None
    for field in ("max_tokens", "native_dimensions", "matryoshka", "encoding_profile"):
        assert getattr(policy, field) == getattr(expected, field), field
    # the prompts, and the input_type values the seed's server took (its Literal)
    assert replace(policy.prompts, input_types=frozenset()) == expected.prompts
    assert policy.prompts.input_types == {"query", "document", "passage"}
    assert policy.upstream.kind == "dynamo" and not policy.upstream.native.dimensions
    assert policy.special_tokens.append_ids == (QWEN_EOS,) == expected.special_tokens.append_ids
    assert policy.upstream.native.truncate_prompt_tokens
    assert_gateway_like_baseline(report)
    found = findings(report)
    assert found["prompts.query"]["confidence"] == "verified"
    assert found["max_tokens"]["confidence"] == "verified"
    assert report["requests"]["baseline"] <= 400 and report["requests"]["candidate"] <= 400
    printed = capsys.readouterr()
    assert printed.out == md and "learn: prompts" in printed.err
    assert "**Result: READY** (exit code 0)" in md and "## Verification" in md
    # the error table, side by side: FastAPI's lists against Dynamo's flat bodies
    assert "| malformed JSON | 422, " in md and "(detail-list) | 400, " in md and "(flat) |" in md
    # and the dialect learned from it: what the shipped policy (written by hand) lacks
    errors = load_policy_file(tmp_path / "policy.yaml").errors
    # FastAPI's bodies, as templates: a list detail for what its request model
    # validates, a text one for what its handler raises
    invalid = errors.template(ErrorClass.INVALID)
    assert list(invalid) == ["detail"] and list(invalid["detail"][0]) == [
        "type",
        "loc",
        "msg",
        "input",
    ]
    assert errors.template(ErrorClass.UNKNOWN_MODEL) == {"detail": "{message}"}
    assert errors.template(ErrorClass.INSTRUCTION) == invalid  # a document + instruction
    assert {k.value: v for k, v in errors.statuses.items()} == {
        "malformed": 422,
        "invalid": 422,
        "dimensions": 422,
        "unknown_model": 404,
        "instruction": 422,
    }


def test_qwen3_served_with_e5_prompts_a_set_and_base64_against_vllm(
    qwen_dir: Path, tmp_path: Path
) -> None:
    """Another family's prompts on a Qwen3 model, a shorter limit, Matryoshka sizes as a
    set, base64 honoured (the openai profile), and plain vLLM as the candidate."""
    legacy = FakeLegacy(
        served_model="qwen3-e5",
        tokenizer_dir=qwen_dir,
        query_template="query: {text}",
        document_template="passage: {text}",
        max_tokens=512,
        min_dimensions=None,
        allowed_dimensions=(128, 256, 512),
        honour_encoding=True,
    )
    vllm = FakeUpstream(flavour="vllm", served_model="qwen3-e5", tokenizer_dir=qwen_dir)
    with legacy, vllm:
        code, policy, report, _ = learn(legacy, vllm, tmp_path)
    assert code == 0, report["problems"]
    assert policy is not None
    assert (policy.prompts.query, policy.prompts.document) == ("query: {text}", "passage: {text}")
    assert policy.prompts.default_instruction == ""
    assert policy.max_tokens == 512
    assert policy.matryoshka == Matryoshka(min_dimensions=128, allowed=(128, 256, 512))
    assert policy.encoding_profile is EncodingProfile.OPENAI
    assert policy.upstream.kind == "vllm"
    assert_gateway_like_baseline(report)
    assert "preset e5" in findings(report)["prompts.query"]["summary"]


def test_lenient_server_and_a_candidate_that_cuts_dimensions_itself(
    qwen_dir: Path, tmp_path: Path
) -> None:
    """pydantic's lax integers (the legacy profile, no warning) and a Dynamo worker
    started Matryoshka: `upstream.native.dimensions: true`, checked against the cut."""
    legacy = FakeLegacy(tokenizer_dir=qwen_dir, lax=True, max_tokens=300)
    mrl = FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir, is_matryoshka=True)
    with legacy, mrl:
        code, policy, report, _ = learn(legacy, mrl, tmp_path)
    assert code == 0, report["problems"]
    assert policy is not None and policy.upstream.native.dimensions
    assert policy.max_tokens == 300 and policy.encoding_profile is EncodingProfile.LEGACY
    assert findings(report)["leniency.integers"]["value"] is True
    assert findings(report)["leniency.bom"]["value"] is True
    assert_gateway_like_baseline(report)
    # the gateway forwarded `dimensions` to the upstream instead of cutting the answer
    assert any(r.json and r.json.get("dimensions") == 32 for r in mrl.received)


def test_a_server_that_knows_only_nomic_input_types(
    qwen_dir: Path, dynamo: FakeUpstream, tmp_path: Path
) -> None:
    """`search_query` and `search_document` only: the prompts are learned from those,
    and the policy takes only those two values."""
    legacy = FakeLegacy(
        tokenizer_dir=qwen_dir,
        query_template="search_query: {text}",
        document_template="search_document: {text}",
        query_types=frozenset({"search_query"}),
        document_types=frozenset({"search_document"}),
        min_dimensions=64,
    )
    with legacy:
        code, policy, report, _ = learn(legacy, dynamo, tmp_path)
    assert code == 0, report["problems"]
    assert policy is not None and policy.prompts.query == "search_query: {text}"
    assert policy.prompts.document == "search_document: {text}"
    assert policy.matryoshka == Matryoshka(min_dimensions=64)
    assert_gateway_like_baseline(report)
    assert findings(report)["input_type"]["value"] == ["search_query", "search_document"]
    # the gateway refuses the other aliases as the baseline does: no warning left
    assert policy.prompts.input_types == {"search_query", "search_document"}
    assert not report["verification"]["verdict"]["warnings"]


def test_an_unknown_query_prefix_is_named_and_marked(
    qwen_dir: Path, dynamo: FakeUpstream, tmp_path: Path
) -> None:
    legacy = FakeLegacy(
        tokenizer_dir=qwen_dir, query_template="Represent the question for retrieval: {text}"
    )
    with legacy:
        code, policy, report, md = learn(legacy, dynamo, tmp_path, "--no-verify")
    assert code == 1
    problem = findings(report)["prompts.query"]["problem"]
    assert "prepends 6 tokens to query inputs" in problem and "no known prompt" in problem
    assert "prepends 6 tokens to query inputs" in md
    text = (tmp_path / "policy.yaml").read_text(encoding="utf-8")
    assert "# NOT LEARNED: prompts.query: the baseline prepends 6 tokens" in text
    assert policy is not None and policy.prompts.query == "{text}"  # loads, marked


def test_a_limit_over_the_candidates_is_named(
    qwen_dir: Path, dynamo: FakeUpstream, tmp_path: Path
) -> None:
    with FakeLegacy(tokenizer_dir=qwen_dir, max_tokens=2048) as legacy:
        code, _, report, _ = learn(legacy, dynamo, tmp_path, "--no-verify")
    assert code == 1
    assert any(
        "keeps 2048 tokens; the candidate takes at most 1024" in p for p in report["problems"]
    )


def test_a_baseline_that_refuses_long_inputs(
    qwen_dir: Path, dynamo: FakeUpstream, tmp_path: Path
) -> None:
    """The longest input it accepts, by bisection on status, within a bounded number
    of requests (tests/test_learn_contracts.py checks the gateway then answers alike)."""
    with FakeLegacy(tokenizer_dir=qwen_dir, max_tokens=700, refuse_long=True) as legacy:
        code, policy, report, _ = learn(legacy, dynamo, tmp_path, "--no-verify")
    assert code == 0 and policy is not None and policy.max_tokens == 700
    assert policy.truncation.refuse
    found = findings(report)["max_tokens"]
    assert found["summary"] == "700 tokens, longer inputs refused (422)"
    assert len(found["exchanges"]) <= 1 + 13  # the long input, then a bisection over 4,104


def test_the_candidates_limit_by_bisection_when_not_listed(
    qwen_dir: Path, dynamo: FakeUpstream
) -> None:
    local = LocalModel(TokenizerSource(path=qwen_dir))
    session = Session({"baseline": dynamo.url, "candidate": dynamo.url}, 100, lambda _: None)
    try:
        basics, _ = learn_basics(session, local, QWEN_MODEL, QWEN_MODEL)
        assert basics is not None
        limit, found = learn_max_tokens(session, local, basics, None)
    finally:
        session.close()
    assert limit == found.value == dynamo.max_model_len
    assert len(found.exchanges) <= 18 and session.spent["candidate"] <= 3 + 18


def test_a_spent_budget_marks_what_is_left(
    qwen_dir: Path, dynamo: FakeUpstream, tmp_path: Path
) -> None:
    with FakeLegacy(tokenizer_dir=qwen_dir) as legacy:
        code, policy, report, _ = learn(legacy, dynamo, tmp_path, "--budget", "25", "--no-verify")
    assert code == 1 and policy is not None
    assert report["requests"]["baseline"] <= 25 and report["requests"]["candidate"] <= 25
    not_learned = [f["field"] for f in report["findings"] if "budget of 25" in f["problem"]]
    assert "max_tokens" in not_learned or "matryoshka" in not_learned
    assert "# NOT LEARNED" in (tmp_path / "policy.yaml").read_text(encoding="utf-8")


def test_no_baseline_is_inconclusive(dynamo: FakeUpstream, qwen_dir: Path, tmp_path: Path) -> None:
    args = _parser().parse_args(
        ["learn", "--baseline", f"http://127.0.0.1:{free_port()}", "--candidate", dynamo.url,
         "--model", QWEN_MODEL, "--tokenizer", f"{QWEN_MODEL}={qwen_dir}", "--out", str(tmp_path)]
    )  # fmt: skip
    assert learn_command.run(args) == 2
    assert not (tmp_path / "policy.yaml").exists()
    assert "connection refused" in (tmp_path / "report.md").read_text(encoding="utf-8")


def test_bad_arguments_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["learn", "--baseline", "http://127.0.0.1:1", "--model", "m", "--out", str(tmp_path)]
    for extra in (
        ["--candidate", "http://h:1/api"],
        ["--candidate", "http://h:1", "--budget", "0"],
        ["--candidate", "http://h:1", "--preset", "nope"],
    ):
        assert learn_command.run(_parser().parse_args(base + extra)) == 2
    monkeypatch.setenv("ENVOY_BIN", "no-such-envoy-binary")
    qwen = ["--candidate", "http://h:1", "--preset", "qwen3-embedding-0.6b"]
    override = ["--tokenizer", f"Qwen/Qwen3-Embedding-0.6B={qwen_tokenizer_dir()}"]
    # no Envoy to verify
    assert learn_command.run(_parser().parse_args(base + qwen + override)) == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 4 and "ENVOY_BIN=no-such-envoy-binary" in err
    assert not (tmp_path / "report.md").exists()  # nothing was asked


# --------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(("cut", "guess"), [(300, 300), (300, 301), (300, None), (7, 900)])
def test_cut_point_is_found_around_the_guess_or_by_bisection(cut: int, guess: int | None) -> None:
    asked: list[int] = []

    def same(tokens: int) -> bool:
        asked.append(tokens)
        return tokens >= cut

    assert _cut_point(same, guess, 4096) == cut
    assert len(asked) <= (3 if guess in (cut, cut - 1) else 3 + 13)
    assert _cut_point(lambda tokens: False, None, 4096) is None  # a tail cut: no start matches


def test_prompt_candidates() -> None:
    """The hinted preset first; a model file's prompt as itself and read as a preset's
    {instruction} template with the task it names."""
    assert templates("query", "e5", {})[0].text == "query: {text}"
    assert templates("query", "qwen3-embedding-4b", {})[0] == Template(
        QWEN3_QUERY, QWEN3_TASK, "preset qwen3-embedding-4b"
    )
    files = {"query": "Instruct: Find the product\nQuery:", "document": ""}
    found = templates("query", None, files)
    assert found[0].text == "Instruct: Find the product\nQuery:{text}"
    derived = [t for t in found if t.text == QWEN3_QUERY and t.instruction == "Find the product"]
    assert derived and derived[0].prefix("X") == "Instruct: X\nQuery:"
    assert "{text}" in [t.text for t in found]
    assert templates("document", None, files)[0].text == "{text}"


@pytest.mark.parametrize(
    "settings", list(itertools.product(("HONOURED", "IGNORED"), *[(False, True)] * 3))
)
def test_the_written_encoding_is_said_one_way_and_loads_as_learned(
    settings: tuple[str, bool, bool, bool],
) -> None:
    """A bundle is written as its profile alone, anything else as its fields without a
    profile: never both, so the entry loads (over a preset's profile too) as learned."""
    written = LearnedEncoding(*settings).policy()
    assert ("encoding_profile" in written) != ("base64" in written or "leniency" in written)
    entry = {"name": "m", "preset": "e5", **written}
    model = load_policy_text(json.dumps({"models": [entry]})).models["m"]
    lax = model.leniency
    assert (model.honours_base64, lax.integers, lax.bom, lax.integral_floats) == (
        settings[0] == "HONOURED",
        *settings[1:],
    )


def test_cli_registers_learn() -> None:
    args = _parser().parse_args(
        ["learn", "--baseline", "http://a:1", "--candidate", "http://b:2", "--model", "m"]
    )
    assert isinstance(args, argparse.Namespace) and args.budget == 400 and not args.no_verify
    assert args.out == Path("learn-report")
    assert load_policy_text  # the writer's output is checked by load_policy_file above


def test_every_dialect_a_server_serves_is_found_and_verified(
    qwen_dir: Path, tmp_path: Path
) -> None:
    """A server that also answers TEI's /embed and / and Ollama's older /api/embeddings
    (vectors not normalised): learn finds both, writes them as the model's `serves`
    (the older route `normalized: false`), and the gateway answers each path as the
    baseline does; learned in TEI's dialect, its errors are that path's."""
    legacy = FakeLegacy(
        served_model="qwen3-dialects",
        tokenizer_dir=qwen_dir,
        max_tokens=512,
        dialects=("tei", "ollama_embeddings"),
    )
    vllm = FakeUpstream(flavour="vllm", served_model="qwen3-dialects", tokenizer_dir=qwen_dir)
    with legacy, vllm:
        code, policy, report, md = learn(legacy, vllm, tmp_path)
        assert code == 0, report["problems"]
        assert policy is not None
        served = {(s.dialect, s.path, s.normalized) for s in policy.serves}
        expected = {("tei", "/embed", True), ("tei", "/", True)}
        assert served == expected | {("ollama_embeddings", "/api/embeddings", False)}, md
        rows = [r for r in report["verification"]["contract"] if ":" in r["key"]]
        assert {r["key"].split(":")[0] for r in rows} == {"tei", "ollama_embeddings"}
        assert_gateway_like_baseline(report)

        tei, tei_dir = FakeLegacy(
            served_model="qwen3-dialects", tokenizer_dir=qwen_dir, max_tokens=512,
            dialects=("tei",),
        ), tmp_path / "tei"  # fmt: skip
        with tei:
            code, policy, report, md = learn(tei, vllm, tei_dir, "--dialect", "tei")
    assert code == 0, report["problems"]
    assert policy is not None
    assert {s.dialect for s in policy.serves} == {"tei"}, md
    assert all(s.errors is not None for s in policy.serves), md
    assert report["baseline"].endswith("/embed"), report["baseline"]
