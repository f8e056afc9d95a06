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
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from extproc.core.contract import load_contract
from extproc.core.policy import PolicyError, load_policy_file
from extproc.core.policy.loader import parse_tokenizer_overrides
from extproc.core.policy.model import TokenizerSource
from extproc.core.policy.presets import presets
from extproc.core.tokens import TokenizerLoadError
from extproc.tools.learn.basics import Basics, learn_basics
from extproc.tools.learn.dimensions import Dimensions, learn_dimensions
from extproc.tools.learn.findings import Finding, unknown
from extproc.tools.learn.local import LocalModel
from extproc.tools.learn.policy_file import Learned, policy_text
from extproc.tools.learn.profile import learn_profile
from extproc.tools.learn.prompts import (
    DOCUMENT_ALIASES,
    QUERY_ALIASES,
    UNKNOWN_TYPE,
    Prompts,
    learn_prompts,
)
from extproc.tools.learn.report import LearnReport, to_json, to_markdown
from extproc.tools.learn.session import BudgetSpentError, Session
from extproc.tools.learn.truncation import learn_truncation
from extproc.tools.learn.upstream import learn_kind, learn_max_tokens, survey
from extproc.tools.learn.verify import Verification, learned_probes, upstream_root, verify
from extproc.tools.probe.client import endpoint_url

DEFAULT_BUDGET = 400
DEFAULT_OUT = Path("learn-report")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "learn",
        help="write the policy from a live legacy server and the raw new upstream, verified",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--baseline", required=True, metavar="URL", help="the legacy server")
    p.add_argument("--candidate", required=True, metavar="URL", help="the new upstream, alone")
    p.add_argument("--model", required=True, help="the model name clients send")
    p.add_argument(
        "--tokenizer",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="the tokenizer.json (and model files) in DIR for model NAME",
    )
    p.add_argument("--preset", default=None, help="the model family to try first (extproc presets)")
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"where policy.yaml and the report go (default {DEFAULT_OUT})",
    )
    p.add_argument(
        "--budget",
        type=int,
        default=DEFAULT_BUDGET,
        metavar="N",
        help=f"most requests to each server (default {DEFAULT_BUDGET})",
    )
    p.add_argument(
        "--no-verify", action="store_true", help="do not start the gateway to check the policy"
    )
    p.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS", help="per socket operation"
    )


@dataclass
class Draft:
    """What is learned so far; the defaults stand for what is not (marked so)."""

    upstream_model: str
    candidate_max: int | None = None
    owner: str = ""
    max_tokens: int | None = None
    dimensions: Dimensions = field(default_factory=Dimensions)
    prompts: Prompts = field(default_factory=Prompts)
    profile: str = "OPENAI"
    kind: str = "dynamo"
    truncate_prompt_tokens: bool = True
    accepted: dict[str, bool] = field(default_factory=dict)  # for the verification probes


def run(args: argparse.Namespace) -> int:
    started, wall = time.monotonic(), datetime.now(UTC).isoformat(timespec="seconds")
    try:
        urls = {"baseline": endpoint_url(args.baseline), "candidate": endpoint_url(args.candidate)}
        upstream_root(args.candidate)
        if not 1 <= args.budget <= 100_000:
            raise ValueError("--budget must be within 1..100000")
        if args.preset is not None and args.preset not in presets():
            raise ValueError(f"--preset: unknown {args.preset!r} (extproc presets lists them)")
        local = LocalModel(_tokenizer_source(args))
    except (ValueError, TokenizerLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    session = Session(urls, args.budget, _progress, timeout_s=args.timeout)  # type: ignore[arg-type]
    try:
        basics, findings, draft = learn(session, local, args.model, args.preset)
    finally:
        session.close()
    learned = _learned(args.model, local, basics, draft) if basics else None
    header = [
        f"Written by `extproc learn` on {wall} from the baseline {urls['baseline']}",
        f"and the candidate {urls['candidate']}; report.md shows how each field was learned.",
    ]
    text = policy_text(learned, findings, header) if learned else ""
    args.out.mkdir(parents=True, exist_ok=True)
    verification, note = None, "" if learned else "nothing to verify without a policy"
    if text:
        (args.out / "policy.yaml").write_text(text, encoding="utf-8")
        verification, note = _verify(session, args, urls, draft, findings)
    learned_all = bool(learned) and not any(f.problem for f in findings)
    verified = args.no_verify or (verification is not None and verification.verdict.ready)
    code = 0 if learned_all and verified else (1 if learned else 2)
    report = LearnReport(
        urls["baseline"],
        urls["candidate"],
        args.model,
        wall,
        time.monotonic() - started,
        args.budget,
        dict(session.spent),
        findings,
        session.exchanges,
        text,
        verification,
        note,
        code,
    )
    markdown = to_markdown(report)
    (args.out / "report.md").write_text(markdown, encoding="utf-8")
    (args.out / "report.json").write_bytes(to_json(report))
    print(markdown, end="")
    print(
        f"learn: {report.label}; {args.out / 'policy.yaml'}, {args.out / 'report.md'}",
        file=sys.stderr,
    )
    return code


def learn(
    session: Session, local: LocalModel, model: str, hint: str | None
) -> tuple[Basics | None, list[Finding], Draft]:
    """Every learner in turn; once the budget is spent the rest are marked not learned."""
    draft = Draft(upstream_model=model)
    found: list[Finding] = []
    try:
        draft.upstream_model, draft.candidate_max, draft.owner, first = survey(session, model)
        found += first
        basics, more = learn_basics(session, local, model, draft.upstream_model)
    except BudgetSpentError as exc:
        return None, [*found, unknown("budget", str(exc))], draft
    found += more
    if basics is None:
        return None, found, draft

    def prompts() -> list[Finding]:
        draft.prompts, items = learn_prompts(session, local, basics, hint)
        types = next(f.value for f in items if f.field == "input_type")
        kinds = (*QUERY_ALIASES, *DOCUMENT_ALIASES, UNKNOWN_TYPE)
        draft.accepted |= {t: t in types for t in kinds} | {t: True for t in types}
        return items

    def truncation() -> list[Finding]:
        draft.candidate_max, limit = learn_max_tokens(session, local, basics, draft.candidate_max)
        draft.max_tokens, items = learn_truncation(session, local, basics, draft.candidate_max)
        return [limit, *items]

    def dimensions() -> list[Finding]:
        draft.dimensions, items = learn_dimensions(session, basics)
        return items

    def profile() -> list[Finding]:
        d = draft.dimensions
        size = d.min_dimensions or next((a for a in d.allowed if a != basics.native), basics.native)
        draft.profile, items, base, cand = learn_profile(session, basics, size)
        draft.accepted |= {e.label: e.ok for e in base}
        kind, draft.truncate_prompt_tokens, more = learn_kind(session, basics, draft.owner, cand)
        draft.kind = kind or draft.kind
        return items + more

    steps: list[tuple[str, Callable[[], list[Finding]]]] = [
        ("prompts", prompts),
        ("max_tokens", truncation),
        ("matryoshka", dimensions),
        ("encoding_profile", profile),
    ]
    spent = ""
    for name, step in steps:
        try:
            found += step() if not spent else [unknown(name, f"not learned: {spent}")]
        except BudgetSpentError as exc:
            spent = str(exc)
            found.append(unknown(name, f"not learned: {spent}"))
    return basics, found, draft


def _learned(model: str, local: LocalModel, basics: Basics, draft: Draft) -> Learned:
    return Learned(
        model=model,
        upstream_model=draft.upstream_model,
        tokenizer=local.source,
        layout=basics.layout,
        max_tokens=draft.max_tokens or draft.candidate_max or 512,
        native=basics.native,
        dimensions=draft.dimensions,
        prompts=draft.prompts,
        profile=draft.profile,
        kind=draft.kind,
        truncate_prompt_tokens=draft.truncate_prompt_tokens,
    )


def _verify(
    session: Session,
    args: argparse.Namespace,
    urls: dict[str, str],
    draft: Draft,
    findings: list[Finding],
) -> tuple[Verification | None, str]:
    if args.no_verify:
        return None, "--no-verify"
    try:
        contract = load_contract(load_policy_file(args.out / "policy.yaml"))
    except (PolicyError, TokenizerLoadError, OSError) as exc:
        findings.append(unknown("policy", f"the written policy does not load: {exc}"))
        return None, "the policy does not load"
    d, native = draft.dimensions, contract.policy.models[args.model].native_dimensions
    sizes: list[tuple[int, bool]] = []
    if d.min_dimensions is not None:
        sizes = [(d.min_dimensions, True), (d.min_dimensions - 1, False), (native + 1, False)]
    elif d.matryoshka:
        sizes = [*((a, True) for a in d.allowed), (d.allowed[0] + 1, False)]
    size = d.min_dimensions or next((a for a in d.allowed if a != native), native)
    probes = learned_probes(args.model, draft.accepted, [s for s in sizes if s[0] > 0], size)
    try:
        return verify(
            session, contract, urls["baseline"], urls["candidate"], args.model, probes
        ), ""
    except BudgetSpentError as exc:
        return None, str(exc)
    except (OSError, RuntimeError, FileNotFoundError) as exc:
        return None, f"the gateway could not be run: {exc}"


def _tokenizer_source(args: argparse.Namespace) -> TokenizerSource:
    overrides = parse_tokenizer_overrides(",".join(args.tokenizer))
    if args.model in overrides:
        return TokenizerSource(path=overrides[args.model])
    hf_id = presets()[args.preset].tokenizer.hf_id if args.preset else args.model
    if hf_id in overrides:
        return TokenizerSource(path=overrides[hf_id])
    return TokenizerSource(hf_id=hf_id)


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


__all__ = ["add_parser", "run"]
