"""`extproc learn`: write the policy from a live legacy server and the raw new upstream.

Asks both servers a bounded number of questions (--budget each, at most 4 in
flight), writes DIR/policy.yaml and the report (report.md, report.json), then,
unless --no-verify, starts the gateway with that policy in front of the candidate
and compares it with the baseline (the probe's parity and contract checks).
Exit 0: every field learned and the gateway at parity; 1: a field not learned or the
verification failed (the report names it); 2: bad arguments, or a baseline or
candidate that does not embed a plain text.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from extproc.commands.options import (
    add_budget_option,
    add_header_option,
    add_servers_options,
    add_timeout_option,
    add_tool_parser,
    check_budget,
    headers_from,
)
from extproc.core.policy import GatewayPolicy, PolicyError
from extproc.core.policy.model import TokenizerSource
from extproc.core.policy.presets import presets
from extproc.core.tokens import TokenizerLoadError
from extproc.runtime.envoy_process import envoy_binary
from extproc.runtime.server_options import add_tokenizer_option
from extproc.service.contract_loading import load_contract
from extproc.service.policy_file import load_policy_file
from extproc.service.tokenizer_overrides import (
    TOKENIZER_OVERRIDES_ENV,
    parse_tokenizer_overrides,
    tokenizer_overrides,
)
from extproc.tools.learn.findings import Finding, unknown
from extproc.tools.learn.learn_report import NO_VERIFY, LearnReport, to_json, to_markdown
from extproc.tools.learn.local import LocalModel
from extproc.tools.learn.policy_file import policy_text
from extproc.tools.learn.probing_plan import Learned, learn
from extproc.tools.learn.rerank_check import to_json as rerank_json
from extproc.tools.learn.rerank_check import to_markdown as rerank_markdown
from extproc.tools.learn.rerank_check import verify_rerank
from extproc.tools.learn.rerank_learner import RerankSession, learn_rerank
from extproc.tools.learn.session import Session
from extproc.tools.learn.verify import Verification, upstream_root, verify
from extproc.tools.toolkit.budgeted_client import BudgetSpentError
from extproc.tools.toolkit.embeddings_client import endpoint_url
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
    if args.task == "rerank":
        return run_rerank(args)
    started, wall = time.monotonic(), datetime.now(UTC).isoformat(timespec="seconds")
    try:
        urls = {"baseline": endpoint_url(args.baseline), "candidate": endpoint_url(args.candidate)}
        headers = headers_from(args.header)
        upstream_root(args.candidate)
        check_budget(args.budget, MAX_BUDGET)
        if args.preset is not None and args.preset not in presets():
            raise ValueError(f"--preset: unknown {args.preset!r} (extproc presets lists them)")
        local = LocalModel(_tokenizer_source(args))
        if not args.no_verify:
            envoy_binary()  # before any request: the verification needs it
        args.out.mkdir(parents=True, exist_ok=True)
    except (ValueError, TokenizerLoadError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    session = Session(urls, args.budget, to_stderr, timeout_s=args.timeout, headers=headers)
    try:
        learned, findings = learn(session, local, args.model, args.preset)
    finally:
        session.close()
    header = [
        f"Written by `extproc learn` on {wall} from the baseline {urls['baseline']}",
        f"and the candidate {urls['candidate']}; report.md shows how each field was learned.",
    ]
    basics = learned.basics
    text = policy_text(learned, basics, findings, header) if basics else ""
    verification, note = None, "nothing to verify without a policy"
    if text:
        (args.out / "policy.yaml").write_text(text, encoding="utf-8")
        verification, note = _verify(session, args, urls, learned, findings)
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
    session: Session,
    args: argparse.Namespace,
    urls: dict[str, str],
    learned: Learned,
    findings: list[Finding],
) -> tuple[Verification | None, str]:
    if args.no_verify:
        return None, NO_VERIFY
    try:
        contract = load_contract(_written_policy(args.out / "policy.yaml"))
    except (PolicyError, TokenizerLoadError, OSError) as exc:
        findings.append(unknown("policy", f"the written policy does not load: {exc}"))
        return None, "the policy does not load"
    try:
        return verify(session, contract, urls, learned), ""
    except BudgetSpentError as exc:
        return None, str(exc)
    except (OSError, RuntimeError) as exc:
        return None, f"the gateway could not be run: {exc}"


def _written_policy(path: Path) -> GatewayPolicy:
    """The policy learn wrote, loaded with $EXTPROC_TOKENIZER_OVERRIDES (the tokenizer
    the flags name is the file's own tokenizer source already)."""
    return load_policy_file(path, tokenizer_overrides=tokenizer_overrides())


def _tokenizer_source(args: argparse.Namespace) -> TokenizerSource:
    # $EXTPROC_TOKENIZER_OVERRIDES first: the flags win, as for the policy loader
    env = os.environ.get(TOKENIZER_OVERRIDES_ENV, "")
    overrides = parse_tokenizer_overrides(",".join([env, *args.tokenizer]))
    if args.model in overrides:
        return TokenizerSource(path=overrides[args.model])
    hf_id = presets()[args.preset].tokenizer.hf_id if args.preset else args.model
    if hf_id in overrides:
        return TokenizerSource(path=overrides[hf_id])
    return TokenizerSource(hf_id=hf_id)


__all__ = ["add_parser", "run"]


def run_rerank(args: argparse.Namespace) -> int:
    """`learn --task rerank`: the rerankers entry, learned and verified."""
    try:
        urls = {"baseline": server_root(args.baseline), "candidate": server_root(args.candidate)}
        headers = headers_from(args.header)
        check_budget(args.budget, MAX_BUDGET)
        if not args.no_verify:
            envoy_binary()
        args.out.mkdir(parents=True, exist_ok=True)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        local: LocalModel | None = LocalModel(_tokenizer_source(args))
    except (TokenizerLoadError, OSError):
        local = None  # no pair counts: long pairs are left to the upstream's limit
    session = RerankSession(urls, args.budget, to_stderr, args.timeout, headers)
    try:
        learned, findings = learn_rerank(session, local, args.model)
        text = ""
        rows = None
        if learned.dialect is not None:
            header = f"# Written by `extproc learn --task rerank` from {urls['baseline']}"
            text = (
                header
                + "\nrerankers:\n  - "
                + "\n    ".join(
                    f"{key}: {json.dumps(value, ensure_ascii=False)}"
                    for key, value in learned.entry().items()
                )
                + "\n"
            )
            (args.out / "policy.yaml").write_text(text, encoding="utf-8")
            if not args.no_verify:
                contract = load_contract(_written_policy(args.out / "policy.yaml"))
                rows = verify_rerank(session, contract, learned)
    except BudgetSpentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        session.close()
    problems = any(f.problem for f in findings) or any(r.problem for r in rows or ())
    code = 2 if not text else (1 if problems else 0)
    markdown = rerank_markdown(learned, findings, text, rows, code)
    write_report(
        args.out,
        {"report.md": markdown, "report.json": rerank_json(learned, findings, text, rows, code)},
    )
    print(markdown, end="")
    return code


def server_root(url: str) -> str:
    """A server's root from its URL (any path is dropped: a rerank server has several)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    return f"{parts.scheme}://{parts.netloc}"
