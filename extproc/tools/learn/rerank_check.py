"""The learned rerank contract checked end to end, and reported: the gateway (a real
Envoy and the ext_proc server, the written policy) in front of the candidate, and
the legacy server, each sent the same requests in the learned dialect; a row per
request compares what a client sees: the status, an error body's shape, and for an
answer the order, every score (within 1e-4), the number of results and whether the
documents come back."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
from dataclasses import dataclass
from typing import Any

import orjson

from extproc.core.contract import Contract
from extproc.core.rerank.dialects import Dialect
from extproc.core.upstream_errors import parse_upstream_error
from extproc.runtime.blocking_http import HttpClient
from extproc.tools.learn.findings import Finding
from extproc.tools.learn.rerank_learner import (
    DOCUMENTS,
    SCORE_TOLERANCE,
    UNKNOWN_MODEL,
    LearnedRerank,
    RerankSession,
    read_answer,
    request_for,
)
from extproc.tools.learn.verify import upstream_root, with_gateway
from extproc.tools.toolkit.long_text import plain_words
from extproc.tools.toolkit.report_format import cell, table


@dataclass(frozen=True)
class CheckRow:
    label: str
    baseline: str  # what each side answered, for people
    gateway: str
    problem: str  # "" when a client sees the same


def battery(learned: LearnedRerank) -> dict[str, dict[str, Any] | bytes]:
    assert learned.dialect is not None
    dialect, model = learned.dialect, learned.model
    bodies: dict[str, dict[str, Any] | bytes] = {
        "plain": request_for(dialect, model, DOCUMENTS),
        "malformed JSON": b'{"query": ',
        "no documents": request_for(dialect, model, ()),
    }
    if dialect is Dialect.TEI:
        bodies["raw scores"] = request_for(dialect, model, DOCUMENTS, raw_scores=True)
        bodies["with text"] = request_for(dialect, model, DOCUMENTS, return_text=True)
    else:
        bodies["top_n 2"] = request_for(dialect, model, DOCUMENTS, top_n=2)
        bodies["unknown model"] = request_for(dialect, UNKNOWN_MODEL, DOCUMENTS[:2])
        if dialect is not Dialect.COHERE_V2:
            bodies["documents back"] = request_for(dialect, model, DOCUMENTS, return_documents=True)
    if learned.max_tokens is not None:
        long = (DOCUMENTS[0], plain_words(learned.max_tokens + 64))
        bodies["a pair over the limit"] = request_for(dialect, model, long)
        if dialect is Dialect.TEI:
            bodies["a pair over the limit, truncate"] = request_for(
                dialect, model, long, truncate=True
            )
    return bodies


def compare(label: str, old: tuple[int, bytes], new: tuple[int, bytes]) -> CheckRow:
    (status_a, body_a), (status_b, body_b) = old, new
    a = read_answer(body_a) if status_a == 200 else None
    b = read_answer(body_b) if status_b == 200 else None
    said_a = _said(status_a, body_a, a)
    said_b = _said(status_b, body_b, b)
    problem = ""
    if status_a != status_b:
        problem = f"status {status_a} vs {status_b}"
    elif a is None or b is None:
        shapes = parse_upstream_error(body_a).shape, parse_upstream_error(body_b).shape
        if (a is None) != (b is None) or shapes[0] != shapes[1]:
            problem = f"error body {shapes[0]} vs {shapes[1]}"
    elif a.shape != b.shape or a.count != b.count or a.documents != b.documents:
        problem = f"{a.count} {a.shape} results vs {b.count} {b.shape}"
    elif list(_order(body_a)) != list(_order(body_b)):
        problem = "another order"
    else:
        worst = max(abs(a.scores[i] - b.scores.get(i, float("inf"))) for i in a.scores)
        if worst > SCORE_TOLERANCE:
            problem = f"scores differ by {worst:.2e}"
    return CheckRow(label, said_a, said_b, problem)


def _order(body: bytes) -> list[int]:
    doc = orjson.loads(body)
    items = doc if isinstance(doc, list) else doc["results"]
    return [int(item["index"]) for item in items]


def _said(status: int, body: bytes, answer: Any) -> str:
    if status == 0:
        return "no answer"
    if answer is None:
        error = parse_upstream_error(body)
        return f"{status}, {error.shape}: {(error.message or '')[:60]}"
    return f"{status}, {answer.count} results"


def verify_rerank(
    session: RerankSession, contract: Contract, learned: LearnedRerank
) -> list[CheckRow]:
    """Start the gateway with the written policy in front of the candidate, send the
    battery to both, stop it."""
    bodies = battery(learned)
    path = learned.path

    def work(gateway_url: str) -> list[CheckRow]:
        session.progress(f"verify: the gateway on {gateway_url} against the baseline")
        gateway = HttpClient(gateway_url, timeout_s=60.0, headers=session.headers)
        rows = []
        try:
            for label, body in bodies.items():
                raw = body if isinstance(body, bytes) else orjson.dumps(body)
                old = session.post("baseline", path, f"verify: {label}", body)
                session.budgets["candidate"].take()
                new = gateway.post(path, raw)
                mine = session.replies[old.id]
                rows.append(compare(label, mine, (new.status, new.body)))
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
    rows: list[CheckRow] | None,
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
        lines += table(
            ["request", "baseline", "gateway", ""],
            [[r.label, cell(r.baseline), cell(r.gateway), cell(r.problem) or "same"] for r in rows],
        )
    return "\n".join(lines) + "\n"


def to_json(
    learned: LearnedRerank,
    findings: list[Finding],
    policy: str,
    rows: list[CheckRow] | None,
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
