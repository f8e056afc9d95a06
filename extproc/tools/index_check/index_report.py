"""index-check's report: Markdown (report.md, also printed), JSON (report.json) and a
page with its two plots (report.html): overlap with today per query, and how far
today's top result moves when the index is kept."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

import numpy as np

from extproc.tools.index_check.index_measures import Measures, Retrieval
from extproc.tools.index_check.index_verdict import IndexThresholds, IndexVerdict, Similarity
from extproc.tools.toolkit.report_files import report_json
from extproc.tools.toolkit.report_format import cell, table
from extproc.tools.toolkit.run_meta import RunMeta
from extproc.tools.toolkit.stats import Spread, spread
from extproc.tools.toolkit.svg_charts import cosine_histogram, grouped_bars

STYLE = (
    "body{font-family:sans-serif;max-width:980px;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px}"
)


@dataclass(frozen=True)
class Sizes:
    documents: int
    queries: int
    corpus: int  # documents the re-index estimate is for
    judged: bool


@dataclass(frozen=True)
class IndexCheckReport:
    run: RunMeta  # the servers (their embeddings endpoints), the model, when
    sizes: Sizes
    dimensions: int | None
    thresholds: IndexThresholds
    widths: tuple[int, int]  # old, new vector width
    measures: Measures | None  # None when the widths differ
    verdict: IndexVerdict
    candidate_docs_per_s: float
    requests: dict[str, int]  # per server, spent

    @property
    def reindex_seconds(self) -> float:
        rate = self.candidate_docs_per_s
        return self.sizes.corpus / rate if rate > 0 else float("inf")


def duration(seconds: float) -> str:
    if not np.isfinite(seconds):
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def cosine_spread(sim: Similarity) -> Spread | None:
    """Where the old-against-new cosines of the texts lie; None for no texts."""
    return spread(sim.cosines.tolist()) if sim.cosines.size else None


def _spread_row(what: str, sim: Similarity) -> list[str]:
    s = cosine_spread(sim)
    cosines = ["-"] * 3 if s is None else [f"{s.min:.6f}", f"{s.p1:.6f}", f"{s.median:.6f}"]
    old, new = float(np.median(sim.old_norms)), float(np.median(sim.new_norms))
    return [what, *cosines, f"{old:.4f}", f"{new:.4f}"]


def _mean(values: Any) -> str:
    return "-" if values is None else f"{float(np.mean(values)):.4f}"


def _retrieval_row(r: Retrieval) -> list[str]:
    return [
        f"{r.queries} queries, {r.index} index",
        _mean(r.overlap),
        _mean(r.rbo),
        f"{r.top1_changed:.1%}",
        _mean(r.recall),
        _mean(r.ndcg),
    ]


def to_markdown(report: IndexCheckReport) -> str:
    v, t, sizes, run = report.verdict, report.thresholds, report.sizes, report.run
    lines = [
        f"# extproc index-check: `{run.model}`",
        "",
        f"- old (the legacy server, which built the index): `{run.baseline}`",
        f"- new (what clients call after cut-over): `{run.candidate}`",
        f"- sample: {sizes.documents:,} documents, {sizes.queries:,} queries, "
        f"{'with' if sizes.judged else 'without'} judgements; k = {t.k}"
        + (f"; dimensions {report.dimensions}" if report.dimensions else ""),
        f"- started {run.started}, took {run.duration_s:.1f} s; requests: "
        + ", ".join(f"{k} {n}" for k, n in report.requests.items()),
        "",
        f"**Result: {v.label}** (exit code {int(v.exit_code)})",
        "",
        *(f"- {cell(reason)}" for reason in v.reasons),
    ]
    if v.cause:
        lines += [f"- likely cause: {cell(v.cause)}"]
    lines += [
        "",
        f"Re-indexing {sizes.corpus:,} documents with the new path: about "
        f"{duration(report.reindex_seconds)} at the {report.candidate_docs_per_s:,.0f} "
        "documents/s measured here (one client, 4 requests in flight).",
        "",
    ]
    m = report.measures
    if m is None:
        old, new = report.widths
        return "\n".join([*lines, f"The old vectors are {old}-d, the new ones {new}-d.", ""])
    lines += ["## Old against new vectors, per text", ""]
    lines += table(
        ["texts", "cosine min", "p1", "p50", "norm old (p50)", "norm new (p50)"],
        [_spread_row("documents", m.documents), _spread_row("queries", m.queries)],
    )
    lines += ["", f"## Retrieval, top {t.k}, against today (old queries, old index)", ""]
    lines += table(
        ["retrieval", f"overlap@{t.k}", "RBO", "top-1 changed", f"recall@{t.k}", f"nDCG@{t.k}"],
        [_retrieval_row(r) for r in m.retrievals],
    )
    today, kept = m.retrieval("old", "old"), m.retrieval("new", "old")
    if today.ndcg is not None and kept.ndcg is not None:
        holds = kept.ndcg.mean() >= today.ndcg.mean() - t.ndcg_tolerance
        lines += [
            "",
            f"Backward compatibility (new queries in the old index retrieve at least as well "
            f"as the old queries, nDCG@{t.k} within {t.ndcg_tolerance}): "
            f"{'holds' if holds else 'does not hold'}.",
        ]
    lines += [
        "",
        f"Thresholds: mean overlap@{t.k} at least {t.min_overlap}, nDCG@{t.k} loss at most "
        f"{t.ndcg_tolerance}, {t.min_queries} queries at least, {t.confidence:.0%} bootstrap "
        "intervals (docs/index-check.md says why).",
    ]
    return "\n".join(lines) + "\n"


def rank_shifts(m: Measures) -> list[int]:
    """Queries by the rank today's top result has when the index is kept (1..k, then
    'not in the top k')."""
    today, kept = m.retrieval("old", "old"), m.retrieval("new", "old")
    counts = [0] * (m.k + 1)
    for was, now in zip(today.rankings, kept.rankings, strict=True):
        if not was:
            continue
        counts[now.index(was[0]) if was[0] in now else m.k] += 1
    return counts


def to_html(report: IndexCheckReport) -> str:
    body = ["<h1>extproc index-check</h1>", f"<pre>{escape(to_markdown(report))}</pre>"]
    m = report.measures
    if m is not None:
        kept = m.retrieval("new", "old")
        body.append(
            cosine_histogram(
                [float(x) for x in kept.overlap],
                report.thresholds.min_overlap,
                f"overlap@{m.k} with today, per query (index kept)",
            )
        )
        labels = [str(i + 1) for i in range(m.k)] + [f">{m.k}"]
        counts = [float(c) for c in rank_shifts(m)]
        body.append(
            grouped_bars(labels, [("queries", counts)], "rank of today's top result", "queries")
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>index-check: {escape(report.verdict.label)}</title>"
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def to_json(report: IndexCheckReport) -> bytes:
    m = report.measures
    doc: dict[str, Any] = {
        "baseline": report.run.baseline,
        "candidate": report.run.candidate,
        "model": report.run.model,
        "started": report.run.started,
        "duration_s": round(report.run.duration_s, 3),
        "sample": {
            "documents": report.sizes.documents,
            "queries": report.sizes.queries,
            "judged": report.sizes.judged,
            "corpus": report.sizes.corpus,
        },
        "k": report.thresholds.k,
        "dimensions": report.dimensions,
        "widths": {"old": report.widths[0], "new": report.widths[1]},
        "result": {
            "label": report.verdict.label,
            "exit_code": int(report.verdict.exit_code),
            "reasons": list(report.verdict.reasons),
            "cause": report.verdict.cause,
        },
        "reindex": {
            "documents_per_s": report.candidate_docs_per_s,
            "estimate_s": report.reindex_seconds,
        },
        "requests": report.requests,
    }
    if m is not None:
        doc["cosines"] = {
            what: None if s is None else {"min": s.min, "p1": s.p1, "p50": s.median}
            for what, s in (
                ("documents", cosine_spread(m.documents)),
                ("queries", cosine_spread(m.queries)),
            )
        }
        doc["retrievals"] = {
            r.name: {
                "overlap": float(np.mean(r.overlap)),
                "rbo": float(np.mean(r.rbo)),
                "top1_changed": r.top1_changed,
                "recall": None if r.recall is None else float(np.mean(r.recall)),
                "ndcg": None if r.ndcg is None else float(np.mean(r.ndcg)),
                "overlap_per_query": [float(x) for x in r.overlap],
            }
            for r in m.retrievals
        }
        doc["rank_shifts"] = rank_shifts(m)
    return report_json(doc)
