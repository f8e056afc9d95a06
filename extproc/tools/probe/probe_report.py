"""The report: one ``ProbeReport`` value, rendered as Markdown (also printed) and JSON.

The HTML rendering lives in ``html_report.py``; both read the same value.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import orjson

from extproc.tools.parity import Thresholds, Verdict
from extproc.tools.probe.latency import FIGURES, Figures, LatencyResult
from extproc.tools.toolkit.contract_table import Cell, Row
from extproc.tools.toolkit.vector_parity import CosineSet, ParityResult

FIGURE_LABELS = {
    "sequential_p50_ms": "sequential p50",
    "sequential_p99_ms": "sequential p99",
    "concurrent_p50_ms": "concurrent p50",
    "concurrent_p99_ms": "concurrent p99",
    "concurrent_docs_per_s": "concurrent docs/s",
}
SEVERITY_MARK = {"ok": "✓ same", "warn": "⚠ differs", "fail": "✗ differs"}


@dataclass(frozen=True)
class Meta:
    baseline: str
    candidate: str
    model: str
    corpus: str
    documents: int
    queries: int
    started: str  # ISO 8601, UTC
    duration_s: float
    quick: bool


@dataclass(frozen=True)
class ProbeReport:
    meta: Meta
    thresholds: Thresholds
    parity: ParityResult
    contract: list[Row]
    latency: LatencyResult | None
    verdict: Verdict
    latency_skipped: str | None = None  # why latency is None


# ------------------------------------------------------------------------------ JSON


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def to_dict(report: ProbeReport) -> dict[str, Any]:
    doc = dataclasses.asdict(report)
    doc["verdict"] = {
        "ready": report.verdict.ready,
        "label": report.verdict.label.upper(),
        "exit_code": int(report.verdict.exit_code),
        "failures": list(report.verdict.failures),
        "warnings": list(report.verdict.warnings),
    }
    for row, row_doc in zip(report.contract, doc["contract"], strict=True):
        row_doc["baseline"]["text"] = row.baseline.text
        row_doc["candidate"]["text"] = row.candidate.text
    result: dict[str, Any] = _jsonable(doc)
    return result


def to_json(report: ProbeReport) -> bytes:
    return orjson.dumps(to_dict(report), option=orjson.OPT_INDENT_2)


# -------------------------------------------------------------------------- Markdown


def cell(text: str) -> str:
    """Make text safe inside a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def fmt_num(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def fmt_dim(value: int | None) -> str:
    return "-" if value is None else str(value)


def fmt_cos(value: float | None) -> str:
    return "-" if value is None else f"{value:.6f}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


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


def parity_lines(parity: ParityResult) -> list[str]:
    b, c = parity.baseline, parity.candidate
    n = parity.documents_total
    lines = [
        "## 1. Vector parity",
        "",
        f'{n} documents in batches of 8, `encoding_format: "float"`.',
        "",
        "| metric | baseline | candidate |",
        "|---|---|---|",
        f"| dimension | {fmt_dim(b.dimension)} | {fmt_dim(c.dimension)} |",
        f"| L2 norm of the first vector | {fmt_num(b.first_norm, 6)} "
        f"| {fmt_num(c.first_norm, 6)} |",
        f"| sum of usage.prompt_tokens ({n} documents) | {fmt_num(b.prompt_tokens)} "
        f"| {fmt_num(c.prompt_tokens)} |",
        f"| documents embedded | {b.embedded}/{n} | {c.embedded}/{n} |",
        "",
        f"- Cosine per document: {cosine_line(parity.documents)}",
        f"- Cosine per query, without instruction: {cosine_line(parity.queries)}",
    ]
    for name, side in (("baseline", b), ("candidate", c)):
        for error in side.errors:
            lines.append(f"- {name} error: {cell(error)}")
    lines.append("")
    return lines


def row_match(row: Row) -> str:
    mark = SEVERITY_MARK[row.severity]
    if row.severity == "ok":
        return f"{mark} ({cell(row.notes[0])})" if row.notes else mark
    return f"{mark}: {cell('; '.join(row.notes))}"


def contract_lines(rows: list[Row]) -> list[str]:
    lines = [
        "## 2. Contract",
        "",
        "Each request sent unchanged to both servers. Valid requests must keep the status",
        "class, the vectors' number, length and encoding, and the vectors themselves.",
        "",
        "| request | valid | baseline | candidate | cosine (min) | match |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {cell(row.title)} | {'yes' if row.valid else 'no'} | {_cell_text(row.baseline)} "
            f"| {_cell_text(row.candidate)} | {fmt_cos(row.cosine_min)} | {row_match(row)} |"
        )
    lines.append("")
    return lines


def _cell_text(c: Cell) -> str:
    return cell(c.text)


def _figure_cells(f: Figures) -> list[str]:
    return [
        fmt_num(f.sequential_p50_ms),
        fmt_num(f.sequential_p99_ms),
        fmt_num(f.concurrent_p50_ms),
        fmt_num(f.concurrent_p99_ms),
        fmt_num(f.concurrent_docs_per_s),
        str(f.errors),
    ]


def latency_lines(latency: LatencyResult | None, skipped: str | None = None) -> list[str]:
    lines = ["## 3. Latency and throughput", ""]
    if latency is None:
        return lines + [f"Not measured: {skipped or 'skipped'}.", ""]
    p = latency.plan
    lines += [
        f"{p.sequential} sequential requests and {p.concurrent} requests at concurrency "
        f"{p.concurrency}, each a batch of {p.batch_size} documents; median of "
        f"{p.repetitions} repetition{'s' if p.repetitions != 1 else ''} (errors: total).",
        "",
        "| | sequential p50 (ms) | sequential p99 (ms) | concurrent p50 (ms) "
        "| concurrent p99 (ms) | concurrent docs/s | errors |",
        "|---|---|---|---|---|---|---|",
        "| baseline | " + " | ".join(_figure_cells(latency.baseline.median)) + " |",
        "| candidate | " + " | ".join(_figure_cells(latency.candidate.median)) + " |",
        "| candidate / baseline | "
        + " | ".join(fmt_ratio(latency.ratios.get(name)) for name in FIGURES)
        + " | |",
        "",
    ]
    for name, side in (("baseline", latency.baseline), ("candidate", latency.candidate)):
        per_rep = ", ".join(fmt_num(r.concurrent_docs_per_s) for r in side.repetitions)
        lines.append(f"- {name} docs/s per repetition: {per_rep}")
        for example in side.error_examples:
            lines.append(f"- {name} error: {cell(example)}")
    lines.append("")
    return lines


def to_markdown(report: ProbeReport) -> str:
    m = report.meta
    lines = [
        "# Embeddings parity probe",
        "",
        f"- baseline: `{m.baseline}`",
        f"- candidate: `{m.candidate}`",
        f"- model: `{m.model}`; corpus: `{m.corpus}` "
        f"({m.documents} documents, {m.queries} queries)",
        f"- started {m.started}, took {m.duration_s:.1f} s{'; quick mode' if m.quick else ''}",
        f"- threshold: min cosine ≥ {report.thresholds.min_cosine}",
        "",
    ]
    lines += verdict_lines(report.verdict)
    lines += parity_lines(report.parity)
    lines += contract_lines(report.contract)
    lines += latency_lines(report.latency, report.latency_skipped)
    return "\n".join(lines).rstrip() + "\n"
