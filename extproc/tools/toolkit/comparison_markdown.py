"""A comparison of two servers in Markdown: the verdict lines, the vector parity
section, the contract table and the rerank rows, as the probe's report and learn's
verification show them (the probe's HTML page reuses the pieces that are not
Markdown). Pure."""

from __future__ import annotations

from collections.abc import Sequence

from extproc.tools.parity import Verdict
from extproc.tools.parity.rerank_comparison import RerankRow
from extproc.tools.toolkit.contract_table import ContractRow
from extproc.tools.toolkit.report_format import cell, fmt_cos, fmt_dim, fmt_num, table
from extproc.tools.toolkit.vector_parity import CosineSet, ParityResult

SEVERITY_MARK = {"ok": "✓ same", "warn": "⚠ differs", "fail": "✗ differs"}


def verdict_lists(verdict: Verdict) -> list[tuple[str, str, tuple[str, ...]]]:
    """(heading, kind, items) of the verdict's non-empty lists: failures, then warnings
    (which never change the exit code)."""
    lists = (("Failures", "fail", verdict.failures), ("Warnings", "warn", verdict.warnings))
    return [(heading, kind, items) for heading, kind, items in lists if items]


def verdict_lines(verdict: Verdict) -> list[str]:
    lines = [f"**Verdict: {verdict.label.upper()}** (exit code {int(verdict.exit_code)})", ""]
    for heading, kind, items in verdict_lists(verdict):
        note = " (do not change the exit code)" if kind == "warn" else ""
        lines += [f"{heading}{note}:", *(f"- {item}" for item in items), ""]
    return lines


def cosine_line(cosines: CosineSet) -> str:
    s = cosines.spread
    if s is None:
        return "not comparable"
    text = f"min {fmt_cos(s.min)} · median {fmt_cos(s.median)} · max {fmt_cos(s.max)} (n={s.n})"
    if cosines.missing:
        text += f"; {len(cosines.missing)} missing"
    if cosines.incomparable:
        text += f"; {len(cosines.incomparable)} of other length"
    return text


def parity_table(parity: ParityResult) -> list[tuple[str, str, str]]:
    """(metric, baseline, candidate): the rows of the parity section's table."""
    b, c = parity.baseline, parity.candidate
    n = parity.documents_total
    return [
        ("dimension", fmt_dim(b.dimension), fmt_dim(c.dimension)),
        ("L2 norm of the first vector", fmt_num(b.first_norm, 6), fmt_num(c.first_norm, 6)),
        (
            f"sum of usage.prompt_tokens ({n} documents)",
            fmt_num(b.prompt_tokens),
            fmt_num(c.prompt_tokens),
        ),
        ("documents embedded", f"{b.embedded}/{n}", f"{c.embedded}/{n}"),
    ]


def parity_lines(parity: ParityResult) -> list[str]:
    lines = [
        "## 1. Vector parity",
        "",
        f'{parity.documents_total} documents in batches of 8, `encoding_format: "float"`.',
        "",
        *table(("metric", "baseline", "candidate"), parity_table(parity)),
        "",
        f"- Cosine per document: {cosine_line(parity.documents)}",
        f"- Cosine per query, without instruction: {cosine_line(parity.queries)}",
    ]
    for name, side in (("baseline", parity.baseline), ("candidate", parity.candidate)):
        for error in side.errors:
            lines.append(f"- {name} error: {cell(error)}")
    lines.append("")
    return lines


def row_match(row: ContractRow) -> str:
    mark = SEVERITY_MARK[row.severity]
    if row.severity == "ok":
        return f"{mark} ({cell(row.notes[0])})" if row.notes else mark
    return f"{mark}: {cell('; '.join(row.notes))}"


def contract_lines(rows: Sequence[ContractRow]) -> list[str]:
    header = ("request", "valid", "baseline", "candidate", "cosine (min)", "match")
    cells = [
        (
            cell(row.title),
            "yes" if row.valid else "no",
            cell(row.baseline.text),
            cell(row.candidate.text),
            fmt_cos(row.cosine_min),
            row_match(row),
        )
        for row in rows
    ]
    return [
        "## 2. Contract",
        "",
        "Each request sent unchanged to both servers. Valid requests must keep the status",
        "class, the vectors' number, length and encoding, and the vectors themselves.",
        "",
        *table(header, cells),
        "",
    ]


def rerank_table(rows: Sequence[RerankRow], candidate: str) -> list[str]:
    """The rerank rows as a Markdown table, the candidate's column named ``candidate``."""
    return table(
        ["request", "baseline", candidate, ""],
        [[r.label, cell(r.baseline), cell(r.candidate), cell(r.problem) or "same"] for r in rows],
    )
