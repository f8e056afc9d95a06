"""`extproc probe --task rerank`: a candidate rerank server (usually the gateway in front
of the new engine) against the legacy one, as the legacy server's clients see them.

Both servers get the same requests in the legacy dialect, one at a time:

- per corpus query (the first :data:`MAX_QUERIES`), the query against a window of
  :data:`WINDOW` corpus documents, each query its own window;
- the dialect's contract requests (its options, the client mistakes, and a pair over
  ``--max-tokens`` when given), from the first query and documents.

Each pair of answers is compared by the toolkit (status, error body shape, results,
documents, order, every score within 1e-4). READY (exit 0) when a client sees the
same in every row, NOT READY (1) when any row differs, INCONCLUSIVE (2) when the
baseline gave no query a rerank answer (another dialect, path or server).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from typing import Any

import orjson

from extproc.core.tasks.rerank import RerankDialect
from extproc.runtime.blocking_http import HttpClient
from extproc.tools.parity import ExitCode
from extproc.tools.probe.html_report import STYLE
from extproc.tools.toolkit.corpus import Corpus
from extproc.tools.toolkit.report_files import report_json
from extproc.tools.toolkit.report_format import cell
from extproc.tools.toolkit.rerank_answers import (
    SCORE_TOLERANCE,
    AnswerRow,
    RerankReply,
    compare_replies,
    contract_requests,
    rerank_request,
    rows_table,
)

log = logging.getLogger("extproc.tools.probe")

MAX_QUERIES = 20
WINDOW = 8  # documents a query is reranked against
QUERY_LABEL = "query "
CONTRACT_LABEL = "contract: "
LABELS = {ExitCode.READY: "ready", ExitCode.NOT_READY: "not ready"}


@dataclass(frozen=True)
class RerankTarget:
    """A server's root and the path its clients post rerank requests to."""

    server: str
    path: str

    @property
    def url(self) -> str:
        return self.server + self.path


@dataclass(frozen=True)
class RerankProbeOptions:
    baseline: RerankTarget
    candidate: RerankTarget
    dialect: RerankDialect
    model: str  # sent by every dialect but TEI
    max_tokens: int | None
    timeout_s: float
    headers: dict[str, str]


@dataclass(frozen=True)
class RerankProbeReport:
    baseline: str
    candidate: str
    dialect: str
    model: str
    corpus: str
    started: str
    duration_s: float
    rows: tuple[AnswerRow, ...]
    exit_code: ExitCode
    reason: str  # why INCONCLUSIVE; "" otherwise

    @property
    def label(self) -> str:
        return LABELS.get(self.exit_code, "inconclusive")

    @property
    def query_rows(self) -> tuple[AnswerRow, ...]:
        return tuple(r for r in self.rows if r.label.startswith(QUERY_LABEL))


def plan_requests(
    dialect: RerankDialect, model: str, corpus: Corpus, max_tokens: int | None
) -> dict[str, dict[str, Any] | bytes]:
    """Every request the probe sends, by label (pure)."""
    documents = [d.text for d in corpus.documents]
    size = min(WINDOW, len(documents))
    bodies: dict[str, dict[str, Any] | bytes] = {}
    for i, query in enumerate(corpus.queries[:MAX_QUERIES]):
        window = [documents[(i * WINDOW + j) % len(documents)] for j in range(size)]
        bodies[f"{QUERY_LABEL}{query.id}"] = rerank_request(dialect, model, query.text, window)
    contract = contract_requests(dialect, model, corpus.queries[0].text, documents[:4], max_tokens)
    for label, body in contract.items():
        bodies[f"{CONTRACT_LABEL}{label}"] = body
    return bodies


def decide(rows: Sequence[AnswerRow]) -> tuple[ExitCode, str]:
    """The exit code, and why when it is INCONCLUSIVE (pure)."""
    queries = [r for r in rows if r.label.startswith(QUERY_LABEL)]
    if not any(r.baseline_answered for r in queries):
        return ExitCode.INCONCLUSIVE, (
            "the baseline gave no query a rerank answer: check --dialect, the path and the URL"
        )
    if any(r.problem for r in rows):
        return ExitCode.NOT_READY, ""
    return ExitCode.READY, ""


def run_rerank_probe(options: RerankProbeOptions, corpus: Corpus) -> RerankProbeReport:
    """Send the plan to both servers and compare (network I/O; every request bounded
    by the timeout, one at a time)."""
    started_wall = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.monotonic()
    plan = plan_requests(options.dialect, options.model, corpus, options.max_tokens)
    log.info("probe: rerank, %d requests to each server", len(plan))
    baseline = HttpClient(
        options.baseline.server, timeout_s=options.timeout_s, headers=options.headers
    )
    candidate = HttpClient(
        options.candidate.server, timeout_s=options.timeout_s, headers=options.headers
    )
    rows = []
    try:
        for label, body in plan.items():
            raw = body if isinstance(body, bytes) else orjson.dumps(body)
            old = baseline.post(options.baseline.path, raw)
            new = candidate.post(options.candidate.path, raw)
            rows.append(
                compare_replies(
                    label,
                    RerankReply.read(old.status, old.body),
                    RerankReply.read(new.status, new.body),
                )
            )
    finally:
        baseline.close()
        candidate.close()
    code, reason = decide(rows)
    return RerankProbeReport(
        baseline=options.baseline.url,
        candidate=options.candidate.url,
        dialect=options.dialect.name.upper(),
        model=options.model,
        corpus=corpus.source,
        started=started_wall,
        duration_s=time.monotonic() - started,
        rows=tuple(rows),
        exit_code=code,
        reason=reason,
    )


def _meta(report: RerankProbeReport) -> list[str]:
    return [
        f"baseline: `{report.baseline}`",
        f"candidate: `{report.candidate}`",
        f"dialect: {report.dialect}, model `{report.model}`",
        f"corpus: `{report.corpus}`, {len(report.rows)} requests to each server",
        f"started {report.started}, took {report.duration_s:.1f} s",
    ]


def _queries_line(report: RerankProbeReport) -> str:
    rows = report.query_rows
    worst = [r.worst_score_difference for r in rows if r.worst_score_difference is not None]
    biggest = f"{max(worst):.2e}" if worst else "-"
    return (
        f"{len(rows)} queries: {sum(1 for r in rows if not r.problem)} answered the same; "
        f"largest score difference {biggest} (tolerance {SCORE_TOLERANCE:g})"
    )


def _problems(report: RerankProbeReport) -> list[str]:
    return [f"{r.label}: {r.problem}" for r in report.rows if r.problem]


def to_markdown(report: RerankProbeReport) -> str:
    lines = ["# Rerank parity probe", "", *(f"- {m}" for m in _meta(report)), ""]
    lines += [f"**Verdict: {report.label.upper()}** (exit code {int(report.exit_code)})", ""]
    if report.reason:
        lines += [report.reason, ""]
    if problems := _problems(report):
        lines += ["Not the same:", *(f"- {cell(p)}" for p in problems), ""]
    lines += [_queries_line(report), "", "## Every request", ""]
    lines += rows_table(report.rows, "candidate")
    return "\n".join(lines) + "\n"


def to_json(report: RerankProbeReport) -> bytes:
    doc = dataclasses.asdict(report)
    doc["task"] = "rerank"
    doc["exit_code"] = int(report.exit_code)
    doc["verdict"] = report.label
    return report_json(doc)


def to_html(report: RerankProbeReport) -> str:
    klass = "ready" if report.exit_code is ExitCode.READY else "not"
    body = [
        "<h1>Rerank parity probe</h1>",
        "<ul>",
        *(f"<li>{escape(m)}</li>" for m in _meta(report)),
        "</ul>",
        f'<p class="verdict {klass}">Verdict: <strong>{escape(report.label.upper())}</strong> '
        f"(exit code {int(report.exit_code)})</p>",
    ]
    if report.reason:
        body.append(f"<p>{escape(report.reason)}</p>")
    if problems := _problems(report):
        body += ["<ul>", *(f'<li class="fail">{escape(p)}</li>' for p in problems), "</ul>"]
    body += [f"<p>{escape(_queries_line(report))}</p>", "<h2>Every request</h2>", "<table>"]
    body.append("<tr><th>request</th><th>baseline</th><th>candidate</th><th></th></tr>")
    for r in report.rows:
        klass, said = ("fail", r.problem) if r.problem else ("ok", "same")
        mark = f'<td class="{klass}">{escape(said)}</td>'
        body.append(
            f"<tr><td>{escape(r.label)}</td><td>{escape(r.baseline)}</td>"
            f"<td>{escape(r.candidate)}</td>{mark}</tr>"
        )
    body.append("</table>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>Rerank parity probe: {escape(report.label.upper())}</title>"
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
