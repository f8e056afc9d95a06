"""``extproc shadow-report``: a running comparator's summary as seed-style tables.

The tables follow a cut-over study's: vectors (dimension,
vector length, token sums, cosine per document and per query), the contract
(status classes side by side), the worst inputs, rerank pairs, latency; then the verdict,
re-judged here against the report's own thresholds. Rendering is pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from extproc.runtime.blocking_http import request_once
from extproc.tools.parity import Thresholds
from extproc.tools.shadow.summary import judge
from extproc.tools.toolkit.report_format import cell, fmt_ratio, table, table_row

_THRESHOLDS = Thresholds()


def fetch_summary(url: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """GET ``{url}/summary`` (``url`` may also name the /summary path itself).
    OSError when there is no 200 answer, ValueError when it is not a summary."""
    target = url if url.rstrip("/").endswith("/summary") else url.rstrip("/") + "/summary"
    result = request_once("GET", target, timeout_s=timeout_s)
    if result.status != 200:
        raise OSError(result.error or f"HTTP {result.status}")
    doc = orjson.loads(result.body)
    if not isinstance(doc, dict) or "pairs" not in doc:
        raise ValueError(f"{target} did not answer a shadow summary")
    return doc


def render_report(summary: Mapping[str, Any], thresholds: Thresholds = _THRESHOLDS) -> str:
    verdict = judge(summary, thresholds)
    lines: list[str] = []
    noise = summary.get("pairs_with_noise", 0)
    lines.append(
        f"Shadow comparison: {summary.get('pairs', 0):,} request pairs"
        + (f", {noise:,} with a noise replica" if noise else "")
    )
    lines += ["", "## Vectors", ""]
    lines += _vectors_table(summary)
    lines += ["", "## Contract (status classes, baseline vs candidate)", ""]
    lines += _status_table(summary)
    worst = summary.get("worst", [])
    if worst:
        lines += ["", "## Worst inputs (lowest cosine, not explained by noise)", ""]
        lines += _worst_table(worst)
    rerank = summary.get("rerank") or {}
    if rerank.get("pairs"):
        lines += ["", "## Reranking (each pair compared whole)", ""]
        lines += _rerank_lines(rerank)
    lines += ["", "## Latency (2xx embeddings pairs)", ""]
    lines += _latency_table(summary)
    lines += ["", "## Halves", ""]
    lines += _halves_lines(summary)
    lines += ["", f"Verdict: {verdict.label}"]
    lines += [f"  [{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}" for c in verdict.checks]
    return "\n".join(lines) + "\n"


def _rerank_lines(rerank: Mapping[str, Any]) -> list[str]:
    worst = rerank.get("max_score_difference")
    kinds = ", ".join(f"{k} x{n:,}" for k, n in sorted(rerank.get("differences", {}).items()))
    lines = [
        f"{rerank['pairs']:,} pairs, {rerank.get('same', 0):,} the same as a client sees them "
        f"(status, error body, results, documents, order, scores within 1e-4); "
        f"largest score difference {'-' if worst is None else f'{worst:.2e}'}"
        + (f"; different: {kinds}" if kinds else ""),
    ]
    examples = rerank.get("examples") or []
    if examples:
        keys = ("request_id", "baseline", "candidate", "problem")
        rows = [[cell(str(e.get(key, ""))) for key in keys] for e in examples]
        lines += ["", *table(["request id", "baseline", "candidate", "difference"], rows)]
    return lines


def _vectors_table(summary: Mapping[str, Any]) -> list[str]:
    inputs = summary.get("inputs", {})
    rows: list[tuple[str, ...]] = []
    for kind, label in (("document", "documents"), ("query", "queries")):
        stats = inputs.get(kind, {})
        if not stats.get("requests"):
            continue
        dims = stats.get("dims", {})
        rows.append(
            (f"Dimension ({label})", _dims(dims.get("baseline")), _dims(dims.get("candidate")))
        )
        norms = stats.get("norms", {})
        rows.append(
            (
                f"Vector length (L2), {label}",
                _span(norms.get("baseline")),
                _span(norms.get("candidate")),
            )
        )
        tokens = stats.get("tokens", {})
        if tokens.get("requests"):
            rows.append(
                (
                    f"Sum of prompt tokens, {label} ({tokens['requests']:,} requests)",
                    f"{tokens['baseline_total']:,}",
                    f"{tokens['candidate_total']:,}",
                )
            )
    for kind, label in (("document", "document"), ("query", "query")):
        stats = inputs.get(kind, {})
        cosine = stats.get("cosine")
        if cosine:
            extra = []
            if stats.get("explained_by_noise"):
                extra.append(f"{stats['explained_by_noise']:,} within noise")
            if stats.get("mismatches"):
                extra.append(f"{stats['mismatches']:,} mismatches")
            suffix = f" ({', '.join(extra)})" if extra else ""
            rows.append(
                (
                    f"Cosine similarity per {label} ({stats['compared']:,} inputs)",
                    f"Min {cosine['min']:.4f} · P05 {cosine['p05']:.4f} · "
                    f"Median {cosine['p50']:.4f} · Max {cosine['max']:.4f}{suffix}",
                )
            )
        elif stats.get("requests"):
            rows.append((f"Cosine similarity per {label}", "not compared (see below)"))
    return table(("Metric", "Baseline", "Candidate"), rows)


def _status_table(summary: Mapping[str, Any]) -> list[str]:
    status = summary.get("status", {})
    mismatched = status.get("mismatch_pairs", {})
    pairs = []
    for key, n in sorted(status.get("pairs", {}).items()):
        baseline, _, candidate = key.partition("/")
        flag = " (mismatch)" if key in mismatched else ""
        pairs.append((baseline, candidate, f"{n:,}{flag}"))
    rows = table(("Baseline", "Candidate", "Requests"), pairs)
    examples = status.get("examples", [])
    if examples:
        rows += ["", "Status mismatches (most recent):", ""]
        keys = ("request_id", "kind", "baseline", "candidate")
        rows += table(
            ("Request id", "Input kind", "Baseline", "Candidate"),
            ([str(e.get(key, "")) for key in keys] for e in examples[-10:]),
        )
    shape = summary.get("shape", {})
    notes = []
    if shape.get("dimension_mismatches"):
        notes.append(f"{shape['dimension_mismatches']:,} inputs with different dimensions")
    if shape.get("count_mismatches"):
        notes.append(f"{shape['count_mismatches']:,} responses with different vector counts")
    for role, n in sorted(shape.get("unusable_bodies", {}).items()):
        notes.append(f"{n:,} unusable {role} 2xx bodies")
    tokens = summary.get("tokens", {})
    if tokens.get("different"):
        notes.append(
            f"usage.prompt_tokens differs in {tokens['different']:,} of "
            f"{tokens['requests']:,} requests (max |diff| {tokens['max_abs_diff']:,})"
        )
    if notes:
        rows += ["", *(f"- {note}" for note in notes)]
    return rows


def _worst_table(worst: list[Mapping[str, Any]]) -> list[str]:
    with_text = any("text" in entry for entry in worst)
    head = ("Request id", "Input", "Kind", "Cosine", "Dims (baseline/candidate)")
    rows = []
    for entry in worst[:10]:
        cosine = entry.get("cosine")
        row = [
            str(entry["request_id"]),
            str(entry["index"]),
            str(entry["kind"]),
            f"{cosine:.4f}" if cosine is not None else "-",
            f"{entry['baseline_dims']}/{entry['candidate_dims']}",
        ]
        if with_text:
            text = str(entry.get("text", "")).replace("|", "\\|").replace("\n", " ")
            row.append(text[:60])
        rows.append(row)
    return table((*head, "Text") if with_text else head, rows)


def _latency_table(summary: Mapping[str, Any]) -> list[str]:
    latency = summary.get("latency", {})
    if not latency.get("pairs"):
        return ["No 2xx pairs yet."]
    sources = latency.get("sources", {})
    envoy, tap = sources.get("envoy", 0), sources.get("tap", 0)
    if envoy and not tap:
        how = "Envoy's upstream service time (time to the first response byte)"
    elif tap and not envoy:
        how = "tap message times as the comparator saw them (upper bounds)"
    else:
        how = f"Envoy's upstream service time for {envoy:,} pairs, tap times for {tap:,}"
    rows = [f"Measured by: {how}.", "", "| | p50 | p90 | p99 |", "|---|---|---|---|"]
    for key, label, shown in (
        ("baseline_s", "Baseline", _ms),
        ("candidate_s", "Candidate", _ms),
        ("ratio", "Candidate / baseline", fmt_ratio),
    ):
        q = latency.get(key) or {}
        rows.append(table_row([label, *(shown(q.get(p)) for p in ("p50", "p90", "p99"))]))
    return rows


def _halves_lines(summary: Mapping[str, Any]) -> list[str]:
    halves = summary.get("halves", {})
    lines = [f"- received: {_roles(halves.get('received', {}))}"]
    for reason in ("expired", "evicted", "duplicate", "late"):
        if halves.get(reason):
            lines.append(f"- {reason}: {_roles(halves[reason])}")
    if summary.get("tap_problems"):
        lines.append(f"- tap streams without a half: {_roles(summary['tap_problems'])}")
    if summary.get("request_mismatches"):
        lines.append(
            f"- {summary['request_mismatches']:,} pairs whose taps saw different requests "
            "(check that nothing rewrites the request before the mirror)"
        )
    return lines


def _dims(counts: Mapping[str, int] | None) -> str:
    if not counts:
        return "-"
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])
    if len(ordered) == 1:
        return ordered[0][0]
    return ", ".join(f"{k} ({v:,})" for k, v in ordered[:4])


def _span(span: list[float] | None) -> str:
    if not span:
        return "-"
    lo, hi = span
    return f"{lo:.4f}" if round(lo, 4) == round(hi, 4) else f"{lo:.4f} .. {hi:.4f}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def _roles(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items())) or "none"
