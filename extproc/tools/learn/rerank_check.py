"""The learned rerank contract checked end to end, and reported: the gateway (a real
Envoy and the ext_proc server, the written policy) in front of the candidate, and
the legacy server, each sent the same requests in the learned dialect; a row per
request compares what a client sees: the status, an error body's shape, and for an
answer the order, every score, the number of results and whether the documents come
back (extproc/tools/parity/rerank_comparison.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
from typing import Any

import orjson

from extproc.core.contract import Contract
from extproc.runtime.blocking_http import HttpClient
from extproc.tools.learn.findings import Finding
from extproc.tools.learn.rerank_learner import DOCUMENTS, QUERY, LearnedRerank, RerankSession
from extproc.tools.learn.verify import upstream_root, with_gateway
from extproc.tools.parity.rerank_comparison import RerankReply, RerankRow, compare_replies
from extproc.tools.toolkit.comparison_markdown import rerank_table
from extproc.tools.toolkit.report_format import cell, table
from extproc.tools.toolkit.rerank_requests import rerank_requests


def battery(learned: LearnedRerank) -> dict[str, dict[str, Any] | bytes]:
    assert learned.dialect is not None
    return rerank_requests(learned.dialect, learned.model, QUERY, DOCUMENTS, learned.max_tokens)


def verify_rerank(
    session: RerankSession, contract: Contract, learned: LearnedRerank
) -> list[RerankRow]:
    """Start the gateway with the written policy in front of the candidate, send the
    battery to both, stop it."""
    bodies = battery(learned)
    path = learned.path

    def work(gateway_url: str) -> list[RerankRow]:
        session.progress(f"verify: the gateway on {gateway_url} against the baseline")
        gateway = HttpClient(gateway_url, timeout_s=60.0, headers=session.headers)
        rows = []
        try:
            for label, body in bodies.items():
                raw = body if isinstance(body, bytes) else orjson.dumps(body)
                old = session.post("baseline", path, f"verify: {label}", body)
                session.budgets["candidate"].take()
                new = gateway.post(path, raw)
                theirs = RerankReply.read(new.status, new.body)
                rows.append(compare_replies(label, session.replies[old.id], theirs))
        finally:
            gateway.close()
        return rows

    upstream = upstream_root(session.urls["candidate"])
    with contextlib.redirect_stdout(sys.stderr):
        return asyncio.run(with_gateway(contract, upstream, work))


def to_markdown(
    learned: LearnedRerank,
    findings: list[Finding],
    policy: str,
    rows: list[RerankRow] | None,
    code: int,
) -> str:
    label = {0: "READY", 1: "NOT READY"}.get(code, "INCONCLUSIVE")
    if code == 0 and rows is None:
        label = "LEARNED, NOT VERIFIED"
    lines = [
        f"# extproc learn --task rerank: `{learned.model}`",
        "",
        f"**Result: {label}** (exit code {code})",
        "",
    ]
    problems = [f"{f.field}: {f.problem}" for f in findings if f.problem]
    problems += [f"verify: {r.label}: {r.problem}" for r in rows or () if r.problem]
    if problems:
        lines += ["Not learned or not matching:", *(f"- {cell(p)}" for p in problems), ""]
    if policy:
        lines += ["## The policy written (policy.yaml)", "", "```yaml", policy.rstrip(), "```", ""]
    lines += ["## What was learned", ""]
    lines += table(
        ["field", "value", "how sure", "found"],
        [
            [
                f.field,
                "-" if f.value is None else cell(orjson.dumps(f.value).decode()),
                f.confidence,
                cell(f.summary),
            ]
            for f in findings
        ],
    )
    if rows is not None:
        lines += ["", "## Verification: the gateway with this policy vs the baseline", ""]
        lines += rerank_table(rows, "gateway")
    return "\n".join(lines) + "\n"


def to_json(
    learned: LearnedRerank,
    findings: list[Finding],
    policy: str,
    rows: list[RerankRow] | None,
    code: int,
) -> bytes:
    doc = {
        "task": "rerank",
        "model": learned.model,
        "result": {"exit_code": code},
        "policy": policy,
        "findings": [dataclasses.asdict(f) for f in findings],
        "verification": None if rows is None else [dataclasses.asdict(r) for r in rows],
    }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2)
