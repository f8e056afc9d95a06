"""The probe's report, for either task: one ``ProbeReport`` value (what was compared,
the verdict, the task's sections), rendered as Markdown (also printed) and JSON; the
HTML rendering lives in ``html_report.py``, reading the same value.

The sections differ by task: embeddings have the vector parity and contract sections
(the toolkit's, :mod:`extproc.tools.toolkit.comparison_markdown`) and the latency
section (the probe's); reranking has a row per request (the toolkit's rerank table).
The verdict lines are the same for both.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from extproc.tools.parity import Thresholds, Verdict
from extproc.tools.parity.rerank_comparison import SCORE_TOLERANCE, RerankRow
from extproc.tools.probe.latency import FIGURES, Figures, LatencyResult
from extproc.tools.toolkit.comparison_markdown import (
    contract_lines,
    parity_lines,
    rerank_table,
    verdict_lines,
)
from extproc.tools.toolkit.contract_table import ContractRow
from extproc.tools.toolkit.corpus import Corpus
from extproc.tools.toolkit.report_files import report_json
from extproc.tools.toolkit.report_format import cell, fmt_num, fmt_ratio
from extproc.tools.toolkit.run_meta import RunClock, RunMeta
from extproc.tools.toolkit.server_pair import ServerPair
from extproc.tools.toolkit.vector_parity import ParityResult

TITLES = {"embeddings": "Embeddings parity probe", "rerank": "Rerank parity probe"}
FIGURE_LABELS = {
    "sequential_p50_ms": "sequential p50",
    "sequential_p99_ms": "sequential p99",
    "concurrent_p50_ms": "concurrent p50",
    "concurrent_p99_ms": "concurrent p99",
    "concurrent_docs_per_s": "concurrent docs/s",
}


@dataclass(frozen=True)
class Meta(RunMeta):
    """What was compared, with what, when: a tool run's meta, and the probe's own."""

    task: str  # "embeddings" or "rerank"
    corpus: str
    documents: int
    queries: int
    quick: bool = False  # embeddings: the smaller latency runs
    dialect: str = ""  # reranking: the legacy server's dialect, as a policy names it


def probe_meta(
    clock: RunClock,
    task: str,
    servers: ServerPair,
    model: str,
    corpus: Corpus,
    **task_fields: Any,
) -> Meta:
    """The run's :class:`Meta`, its duration up to now; ``task_fields``: the task's own
    (``quick``, ``dialect``)."""
    run = vars(clock.meta(servers, model))
    return Meta(
        **run,
        task=task,
        corpus=corpus.source,
        documents=len(corpus.documents),
        queries=len(corpus.queries),
        **task_fields,
    )


@dataclass(frozen=True)
class EmbeddingsSections:
    thresholds: Thresholds
    parity: ParityResult
    contract: list[ContractRow]
    latency: LatencyResult | None
    latency_skipped: str | None = None  # why latency is None


@dataclass(frozen=True)
class RerankSections:
    queries: tuple[RerankRow, ...]  # a corpus query against its documents, each
    contract: tuple[RerankRow, ...]  # the dialect's contract requests

    @property
    def rows(self) -> tuple[RerankRow, ...]:
        return self.queries + self.contract


@dataclass(frozen=True)
class ProbeReport:
    meta: Meta
    verdict: Verdict
    sections: EmbeddingsSections | RerankSections


# ------------------------------------------------------------------------------ JSON


def to_dict(report: ProbeReport) -> dict[str, Any]:
    sections = report.sections
    doc: dict[str, Any] = {"meta": dataclasses.asdict(report.meta)}
    if isinstance(sections, RerankSections):
        doc["rows"] = [dataclasses.asdict(row) for row in sections.rows]
        doc["score_tolerance"] = SCORE_TOLERANCE
    else:
        doc.update(dataclasses.asdict(sections))
        for row, row_doc in zip(sections.contract, doc["contract"], strict=True):
            row_doc["baseline"]["text"] = row.baseline.text
            row_doc["candidate"]["text"] = row.candidate.text
    doc["verdict"] = {
        "ready": report.verdict.ready,
        "label": report.verdict.label.upper(),
        "exit_code": int(report.verdict.exit_code),
        "failures": list(report.verdict.failures),
        "warnings": list(report.verdict.warnings),
    }
    return doc


def to_json(report: ProbeReport) -> bytes:
    return report_json(to_dict(report))


# -------------------------------------------------------------------------- Markdown


def meta_lines(report: ProbeReport) -> list[str]:
    """What was compared, with what, when: list items, with Markdown code spans (the
    HTML page shows the same items)."""
    m, sections = report.meta, report.sections
    lines = [f"baseline: `{m.baseline}`", f"candidate: `{m.candidate}`"]
    if isinstance(sections, RerankSections):
        lines += [
            f"dialect: {m.dialect.upper()}, model `{m.model}`",
            f"corpus: `{m.corpus}`, {len(sections.rows)} requests to each server",
        ]
    else:
        lines.append(
            f"model: `{m.model}`; corpus: `{m.corpus}` ({m.documents} documents, "
            f"{m.queries} queries)"
        )
    lines.append(
        f"started {m.started}, took {m.duration_s:.1f} s{'; quick mode' if m.quick else ''}"
    )
    if isinstance(sections, EmbeddingsSections):
        lines.append(f"threshold: min cosine ≥ {sections.thresholds.min_cosine}")
    return lines


def queries_line(sections: RerankSections) -> str:
    """How the queries' rows went, with the largest score difference."""
    rows = sections.queries
    worst = [r.worst_score_difference for r in rows if r.worst_score_difference is not None]
    biggest = f"{max(worst):.2e}" if worst else "-"
    return (
        f"{len(rows)} queries: {sum(1 for r in rows if not r.problem)} answered the same; "
        f"largest score difference {biggest} (tolerance {SCORE_TOLERANCE:g})"
    )


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


def rerank_lines(sections: RerankSections) -> list[str]:
    lines = [queries_line(sections), "", "## Every request", ""]
    return lines + rerank_table(sections.rows, "candidate") + [""]


def to_markdown(report: ProbeReport) -> str:
    title = TITLES[report.meta.task]
    lines = [f"# {title}", "", *(f"- {item}" for item in meta_lines(report)), ""]
    lines += verdict_lines(report.verdict)
    sections = report.sections
    if isinstance(sections, RerankSections):
        lines += rerank_lines(sections)
    else:
        lines += parity_lines(sections.parity)
        lines += contract_lines(sections.contract)
        lines += latency_lines(sections.latency, sections.latency_skipped)
    return "\n".join(lines).rstrip() + "\n"
