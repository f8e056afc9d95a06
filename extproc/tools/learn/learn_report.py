"""Learn's report: what was learned, from which requests, and the verification, as
Markdown (report.md, also printed) and JSON (report.json).

For each field: the value chosen, how sure, the notes (counts, cosines) and a table
of the requests that show it, with each server's answer. Bad requests are shown side
by side. The verification is shown as the probe shows its comparison: the toolkit's
verdict, parity and contract sections.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from extproc.tools.learn.findings import Finding
from extproc.tools.learn.profile_learner import BAD_REQUESTS
from extproc.tools.learn.session import SERVERS, Exchange
from extproc.tools.learn.verify import Verification
from extproc.tools.toolkit.comparison_markdown import (
    contract_lines,
    parity_lines,
    rerank_table,
    verdict_lines,
)
from extproc.tools.toolkit.report_files import report_json
from extproc.tools.toolkit.report_format import cell, code_span, table

NO_VERIFY = "--no-verify was given"
# An exchange's answer as read (vectors, a ranking) and its raw body: the report shows
# what was read of them (`brief`, dims, norms, the error's message and shape).
_UNREPORTED = frozenset({"vectors", "ranking", "body", "sent"})


@dataclass(frozen=True)
class LearnReport:
    urls: dict[str, str]  # baseline, candidate
    model: str
    started: str
    duration_s: float
    budget: int
    spent: dict[str, int]
    findings: list[Finding]
    exchanges: list[Exchange]
    policy: str  # the policy file's text ("" when none was written)
    verification: Verification | None
    verify_note: str  # why there is no verification, or ""
    exit_code: int

    @property
    def problems(self) -> list[str]:
        found = [f"{f.field}: {f.problem}" for f in self.findings if f.problem]
        if self.verification is not None:
            found += [f"verify: {item}" for item in self.verification.verdict.failures]
        elif self.verify_note and self.verify_note != NO_VERIFY:
            found.append(f"verify: {self.verify_note}")
        return found

    @property
    def warnings(self) -> list[str]:
        return [f"{f.field}: {f.warning}" for f in self.findings if f.warning]

    @property
    def label(self) -> str:
        if self.exit_code == 0 and self.verification is None:
            return "LEARNED, NOT VERIFIED"
        return {0: "READY", 1: "NOT READY"}.get(self.exit_code, "INCONCLUSIVE")


def to_json(report: LearnReport) -> bytes:
    exchanges = [
        {k: v for k, v in dataclasses.asdict(e).items() if k not in _UNREPORTED}
        for e in report.exchanges
    ]
    doc: dict[str, Any] = {
        **report.urls,
        "model": report.model,
        "started": report.started,
        "duration_s": round(report.duration_s, 3),
        "requests": {"budget": report.budget, **report.spent},
        "result": {"label": report.label, "exit_code": report.exit_code},
        "problems": report.problems,
        "warnings": report.warnings,
        "findings": [dataclasses.asdict(f) for f in report.findings],
        "exchanges": exchanges,
        "policy": report.policy,
        "verification": None,
    }
    if report.verification is not None:
        v = report.verification
        doc["verification"] = {
            "verdict": v.verdict.to_json(),
            "parity": None if v.parity is None else dataclasses.asdict(v.parity),
            "contract": [dataclasses.asdict(row) for row in v.rows],
            "rerank": [dataclasses.asdict(row) for row in v.rerank_rows],
        }
    elif report.verify_note:
        doc["verification"] = {"skipped": report.verify_note}
    return report_json(doc)


def to_markdown(report: LearnReport) -> str:
    by_id = {e.id: e for e in report.exchanges}
    spent = ", ".join(f"{side} {n}" for side, n in report.spent.items())
    lines = [
        f"# extproc learn: `{report.model}`",
        "",
        f"- baseline (the legacy server): `{report.urls['baseline']}`",
        f"- candidate (the new upstream, alone): `{report.urls['candidate']}`",
        f"- started {report.started}, took {report.duration_s:.1f} s; "
        f"requests: {spent} (budget {report.budget} each)",
        "",
        f"**Result: {report.label}** (exit code {report.exit_code})",
        "",
    ]
    for heading, items in (
        ("Not learned or not matching", report.problems),
        ("Warnings", report.warnings),
    ):
        if items:
            lines += [f"{heading}:", *(f"- {cell(item)}" for item in items), ""]
    if report.policy:
        lines += [
            "## The policy written (policy.yaml)",
            "",
            "```yaml",
            report.policy.rstrip(),
            "```",
            "",
        ]
    findings = table(("field", "value", "how sure", "found"), map(_finding_row, report.findings))
    lines += ["## What was learned", "", *findings, ""]
    for f in report.findings:
        lines += _finding_lines(f, [by_id[i] for i in f.exchanges if i in by_id])
    if report.verification is not None:
        v = report.verification
        lines += ["## Verification: the gateway with this policy vs the baseline", ""]
        lines += verdict_lines(v.verdict)
        if v.parity is not None:
            lines += parity_lines(v.parity)
            lines += contract_lines(v.rows)
        if v.rerank_rows:
            lines += [*rerank_table(v.rerank_rows, "gateway"), ""]
    elif report.verify_note:
        lines += ["## Verification", "", f"Not run: {report.verify_note}.", ""]
    return "\n".join(lines).rstrip() + "\n"


def _finding_row(f: Finding) -> tuple[str, str, str, str]:
    value = "-" if f.value is None else f"`{orjson.dumps(f.value).decode()}`"
    mark = "✗ " if f.problem else ("⚠ " if f.warning else "")
    return (f.field, cell(value), f.confidence, mark + cell(f.summary))


def _finding_lines(f: Finding, shown: Sequence[Exchange]) -> list[str]:
    lines = [f"### {f.field}", "", f"{cell(f.summary)} ({f.confidence})", ""]
    for text, prefix in ((f.problem, "**Not learned:** "), (f.warning, "**Warning:** ")):
        if text and text != f.summary:
            lines += [f"{prefix}{cell(text)}", ""]
    lines += [f"- {' '.join(note.split())}" for note in f.notes]
    if f.notes:
        lines.append("")
    if f.field == BAD_REQUESTS:
        return lines + _side_by_side(shown)
    if shown:
        rows = [
            (str(e.id), e.server, cell(e.label), code_span(e.request), cell(e.brief()))
            for e in shown
        ]
        lines += [*table(("#", "server", "request", "body", "answer"), rows), ""]
    return lines


def _side_by_side(shown: Sequence[Exchange]) -> list[str]:
    rows: dict[str, dict[str, Exchange]] = {}
    for e in shown:
        rows.setdefault(e.label, {})[e.server] = e
    cells = [
        [cell(label), *(_answer(sides[s]) if s in sides else "-" for s in SERVERS)]
        for label, sides in rows.items()
    ]
    return [*table(("request", "baseline", "candidate"), cells), ""]


def _answer(e: Exchange) -> str:
    return cell(e.brief() + (f" ({e.envelope})" if e.envelope else ""))
