"""The report: what was learned, from which requests, and the verification, as
Markdown (report.md, also printed) and JSON (report.json).

For each field: the value chosen, how sure, the notes (counts, cosines) and a table
of the requests that show it, with each server's answer. Bad requests are shown side
by side. The verification reuses the probe's parity and contract sections.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from extproc.tools.learn.findings import Finding
from extproc.tools.learn.profile_learner import BAD_REQUESTS
from extproc.tools.learn.session import Exchange
from extproc.tools.learn.verify import Verification
from extproc.tools.probe.probe_report import cell, contract_lines, parity_lines, verdict_lines

NO_VERIFY = "--no-verify was given"


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
        {k: v for k, v in dataclasses.asdict(e).items() if k != "vectors"} for e in report.exchanges
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
            "parity": dataclasses.asdict(v.parity),
            "contract": [dataclasses.asdict(row) for row in v.rows],
        }
    elif report.verify_note:
        doc["verification"] = {"skipped": report.verify_note}
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)


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
    lines += [
        "## What was learned",
        "",
        "| field | value | how sure | found |",
        "|---|---|---|---|",
    ]
    for f in report.findings:
        value = "-" if f.value is None else f"`{orjson.dumps(f.value).decode()}`"
        mark = "✗ " if f.problem else ("⚠ " if f.warning else "")
        lines.append(f"| {f.field} | {cell(value)} | {f.confidence} | {mark}{cell(f.summary)} |")
    lines.append("")
    for f in report.findings:
        lines += _finding_lines(f, [by_id[i] for i in f.exchanges if i in by_id])
    if report.verification is not None:
        v = report.verification
        lines += ["## Verification: the gateway with this policy vs the baseline", ""]
        lines += verdict_lines(v.verdict)
        lines += parity_lines(v.parity)
        lines += contract_lines(v.rows)
    elif report.verify_note:
        lines += ["## Verification", "", f"Not run: {report.verify_note}.", ""]
    return "\n".join(lines).rstrip() + "\n"


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
        lines += ["| # | server | request | body | answer |", "|---|---|---|---|---|"]
        lines += [
            f"| {e.id} | {e.server} | {cell(e.label)} | {_code(e.request)} | {cell(e.brief())} |"
            for e in shown
        ]
        lines.append("")
    return lines


def _code(text: str) -> str:
    return f"`{cell(text)}`" if text else "-"


def _side_by_side(shown: Sequence[Exchange]) -> list[str]:
    rows: dict[str, dict[str, Exchange]] = {}
    for e in shown:
        rows.setdefault(e.label, {})[e.server] = e
    lines = ["| request | baseline | candidate |", "|---|---|---|"]
    for label, sides in rows.items():
        cells = [
            cell(sides[s].brief() + (f" ({sides[s].envelope})" if sides[s].envelope else ""))
            if s in sides
            else "-"
            for s in ("baseline", "candidate")
        ]
        lines.append(f"| {cell(label)} | {' | '.join(cells)} |")
    return [*lines, ""]
