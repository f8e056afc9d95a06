"""`extproc learn`: write the policy from a live legacy server and the raw new upstream.

Asks both servers a bounded number of questions (--budget each, at most 4 in
flight), writes DIR/policy.yaml and the report (report.md, report.json), then,
unless --no-verify, starts the gateway with that policy in front of the candidate
and compares it with the baseline: for embeddings by the probe's parity and
contract checks; for reranking (--task rerank) every path the baseline serves, each
by its dialect's requests, every answer compared whole.
Exit 0: every field learned and the gateway at parity; 1: a field not learned or the
verification failed (the report names it); 2: bad arguments, or a baseline or
candidate that does not embed a plain text.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from extproc.commands.options import (
    add_budget_option,
    add_dialect_option,
    add_header_option,
    add_servers_options,
    add_timeout_option,
    add_tool_parser,
    check_budget,
    embeddings_dialect_from,
    headers_from,
)
from extproc.core.contract import Contract
from extproc.core.dialects import EMBEDDINGS_DIALECTS
from extproc.core.policy import PolicyError
from extproc.core.policy.model import TokenizerSource
from extproc.core.policy.presets import presets
from extproc.core.tokens import TokenizerLoadError
from extproc.runtime.envoy_process import envoy_binary
from extproc.runtime.server_options import add_tokenizer_option
from extproc.service.contract_loading import load_contract
from extproc.service.policy_file import load_policy_file
from extproc.service.tokenizer_overrides import tokenizer_overrides
from extproc.tools.learn.findings import Finding, unknown
from extproc.tools.learn.learn_report import NO_VERIFY, LearnReport, to_json, to_markdown
from extproc.tools.learn.local import LocalModel
from extproc.tools.learn.policy_file import policy_text, rerankers_text
from extproc.tools.learn.probing_plan import learn
from extproc.tools.learn.rerank_plan import learn_rerank
from extproc.tools.learn.session import Session
from extproc.tools.learn.verify import Verification, upstream_root, verify, verify_rerank
from extproc.tools.toolkit.budgeted_client import BudgetSpentError
from extproc.tools.toolkit.embeddings_client import dialect_url, endpoint_url
from extproc.tools.toolkit.progress import to_stderr
from extproc.tools.toolkit.report_files import write_report

SUMMARY = "write the policy from a live legacy server and the raw new upstream, verified"
DEFAULT_BUDGET = 400
MAX_BUDGET = 100_000
DEFAULT_OUT = Path("learn-report")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_tool_parser(subparsers, "learn", SUMMARY, __doc__)
    add_servers_options(p, "the legacy server", "the new upstream, alone")
    p.add_argument("--model", required=True, help="the model name clients send")
    add_tokenizer_option(p)
    p.add_argument("--preset", default=None, help="the model family to try first (extproc presets)")
    p.add_argument(
        "--task",
        choices=("embeddings", "rerank"),
        default="embeddings",
        help="the legacy contract to learn: the embeddings endpoint (default) or reranking "
        "(the candidate then is the rerank upstream, vLLM's /rerank)",
    )
    add_dialect_option(
        p,
        EMBEDDINGS_DIALECTS,
        "the API the legacy server's clients speak, learned in it (its other dialects are "
        "found): openai (default), tei, cohere-v1, cohere-v2, ollama, ollama-embeddings, jina",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"where policy.yaml and the report go (default {DEFAULT_OUT})",
    )
    add_budget_option(p, DEFAULT_BUDGET)
    p.add_argument(
        "--no-verify", action="store_true", help="do not start the gateway to check the policy"
    )
    add_timeout_option(p)
    add_header_option(p)


def run(args: argparse.Namespace) -> int:
    started, wall = time.monotonic(), datetime.now(UTC).isoformat(timespec="seconds")
    rerank = args.task == "rerank"
    try:
        dialect = embeddings_dialect_from(args)
        if rerank and dialect is not None:
            raise ValueError("--dialect is an embeddings dialect: rerank paths are found")
        baseline = dialect_url(args.baseline, dialect)
        urls = {"baseline": baseline, "candidate": endpoint_url(args.candidate)}
        headers = headers_from(args.header)
        upstream_root(args.candidate)
        check_budget(args.budget, MAX_BUDGET)
        if args.preset is not None and args.preset not in presets():
            raise ValueError(f"--preset: unknown {args.preset!r} (extproc presets lists them)")
        local = None if rerank else LocalModel(_tokenizer_source(args))
        if not args.no_verify:
            envoy_binary()  # before any request: the verification needs it
        args.out.mkdir(parents=True, exist_ok=True)
    except (ValueError, PolicyError, TokenizerLoadError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    session = Session(
        urls, args.budget, to_stderr, timeout_s=args.timeout, headers=headers, dialect=dialect
    )
    header = [
        f"Written by `extproc learn` on {wall} from the baseline {urls['baseline']}",
        f"and the candidate {urls['candidate']}; report.md shows how each field was learned.",
    ]
    try:
        if rerank:
            learned_rerank, findings = learn_rerank(session, _rerank_tokenizer(args), args.model)
            text = rerankers_text(learned_rerank, findings, header) if learned_rerank else ""
        else:
            assert local is not None
            learned, findings = learn(session, local, args.model, args.preset)
            basics = learned.basics
            text = policy_text(learned, basics, findings, header) if basics else ""
        verification, note = None, "nothing to verify without a policy"
        if text:
            (args.out / "policy.yaml").write_text(text, encoding="utf-8")

            def check(contract: Contract) -> Verification:
                if rerank:
                    return verify_rerank(session, contract, learned_rerank)
                return verify(session, contract, urls, learned)

            verification, note = _verify(args, check, findings)
    finally:
        session.close()
    learned_all = bool(text) and not any(f.problem for f in findings)
    verified = args.no_verify or (verification is not None and verification.verdict.ready)
    code = 0 if learned_all and verified else (1 if text else 2)
    spent = {str(side): n for side, n in session.spent.items()}
    report = LearnReport(
        urls, args.model, wall, time.monotonic() - started, args.budget, spent, findings,
        session.exchanges, text, verification, note, code,
    )  # fmt: skip
    markdown = to_markdown(report)
    write_report(args.out, {"report.md": markdown, "report.json": to_json(report)})
    print(markdown, end="")
    to_stderr(f"learn: {report.label}; {args.out / 'policy.yaml'}, {args.out / 'report.md'}")
    return code


def _verify(
    args: argparse.Namespace,
    check: Callable[[Contract], Verification],
    findings: list[Finding],
) -> tuple[Verification | None, str]:
    if args.no_verify:
        return None, NO_VERIFY
    try:
        contract = load_contract(load_policy_file(args.out / "policy.yaml"))
    except (PolicyError, TokenizerLoadError, OSError) as exc:
        findings.append(unknown("policy", f"the written policy does not load: {exc}"))
        return None, "the policy does not load"
    try:
        return check(contract), ""
    except BudgetSpentError as exc:
        return None, str(exc)
    except (OSError, RuntimeError) as exc:
        return None, f"the gateway could not be run: {exc}"


def _tokenizer_source(args: argparse.Namespace) -> TokenizerSource:
    # $EXTPROC_TOKENIZER_OVERRIDES first: the flags win, as for the policy loader
    overrides = tokenizer_overrides(args.tokenizer)
    if args.model in overrides:
        return TokenizerSource(path=overrides[args.model])
    hf_id = presets()[args.preset].tokenizer.hf_id if args.preset else args.model
    if hf_id in overrides:
        return TokenizerSource(path=overrides[hf_id])
    return TokenizerSource(hf_id=hf_id)


def _rerank_tokenizer(args: argparse.Namespace) -> TokenizerSource | None:
    """The reranker's tokenizer, where one loads: without it pairs are not counted and
    long pairs are left to the upstream's limit."""
    try:
        return LocalModel(_tokenizer_source(args)).source
    except (TokenizerLoadError, OSError, ValueError, PolicyError):
        return None


__all__ = ["add_parser", "run"]
