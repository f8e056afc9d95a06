"""The probe's report: one ``ProbeReport`` value, rendered as Markdown (also printed)
and JSON. The verdict, parity and contract sections are the toolkit's
(:mod:`extproc.tools.toolkit.comparison_markdown`); the latency section is the probe's.

The HTML rendering lives in ``html_report.py``; both read the same value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from extproc.tools.parity import Thresholds, Verdict
from extproc.tools.probe.latency import FIGURES, Figures, LatencyResult
from extproc.tools.toolkit.comparison_markdown import contract_lines, parity_lines, verdict_lines
from extproc.tools.toolkit.contract_table import Row
from extproc.tools.toolkit.report_files import report_json
from extproc.tools.toolkit.report_format import cell, fmt_num, fmt_ratio
from extproc.tools.toolkit.vector_parity import ParityResult

FIGURE_LABELS = {
    "sequential_p50_ms": "sequential p50",
    "sequential_p99_ms": "sequential p99",
    "concurrent_p50_ms": "concurrent p50",
    "concurrent_p99_ms": "concurrent p99",
    "concurrent_docs_per_s": "concurrent docs/s",
}


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
    return doc


def to_json(report: ProbeReport) -> bytes:
    return report_json(to_dict(report))


# -------------------------------------------------------------------------- Markdown


def meta_lines(report: ProbeReport) -> list[str]:
    """What was compared, with what, when: list items, with Markdown code spans (the
    HTML page shows the same items)."""
    m = report.meta
    return [
        f"baseline: `{m.baseline}`",
        f"candidate: `{m.candidate}`",
        f"model: `{m.model}`; corpus: `{m.corpus}` ({m.documents} documents, {m.queries} queries)",
        f"started {m.started}, took {m.duration_s:.1f} s{'; quick mode' if m.quick else ''}",
        f"threshold: min cosine ≥ {report.thresholds.min_cosine}",
    ]


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
    lines = ["# Embeddings parity probe", "", *(f"- {item}" for item in meta_lines(report)), ""]
    lines += verdict_lines(report.verdict)
    lines += parity_lines(report.parity)
    lines += contract_lines(report.contract)
    lines += latency_lines(report.latency, report.latency_skipped)
    return "\n".join(lines).rstrip() + "\n"
