"""The probe's report as one self-contained HTML page, for either task: inline CSS,
inline SVG, no scripts, no external assets (nothing is fetched when it is opened).
The meta items and the verdict are shown alike for both tasks; then the task's
sections, as in the Markdown."""

from __future__ import annotations

from html import escape

from extproc.tools.probe.latency import FIGURES, LatencyResult
from extproc.tools.probe.probe_report import (
    FIGURE_LABELS,
    TITLES,
    EmbeddingsSections,
    ProbeReport,
    RerankSections,
    meta_lines,
    queries_line,
)
from extproc.tools.toolkit.comparison_markdown import (
    SEVERITY_MARK,
    cosine_line,
    parity_table,
    verdict_lists,
)
from extproc.tools.toolkit.contract_table import ContractRow
from extproc.tools.toolkit.report_format import fmt_cos, fmt_num, fmt_ratio
from extproc.tools.toolkit.svg_charts import cosine_histogram, grouped_bars

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1100px;
color:#222;line-height:1.4;padding:0 1em}
table{border-collapse:collapse;margin:.5em 0 1em}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3} td.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#1a7f37} .warn{color:#9a6700} .fail{color:#cf222e;font-weight:bold}
.verdict{font-size:1.3em;padding:.4em .8em;display:inline-block;border-radius:4px}
.verdict.ready{background:#dafbe1} .verdict.not{background:#ffebe9}
code{background:#f6f8fa;padding:0 .2em} .charts{display:flex;flex-wrap:wrap;gap:1em}
"""


def _code_spans(text: str) -> str:
    """Text with Markdown `code` spans, as HTML (the text is escaped first)."""
    parts = escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _verdict(report: ProbeReport) -> list[str]:
    v = report.verdict
    klass = "ready" if v.ready else "not"
    out = [
        f'<p class="verdict {klass}">Verdict: <strong>{escape(v.label.upper())}</strong> '
        f"(exit code {int(v.exit_code)})</p>"
    ]
    for heading, kind, items in verdict_lists(v):
        note = " <small>(do not change the exit code)</small>" if kind == "warn" else ""
        out += [
            f"<h3>{heading}{note}</h3><ul>",
            *(f'<li class="{kind}">{_code_spans(i)}</li>' for i in items),
        ]
        out.append("</ul>")
    return out


def _parity(sections: EmbeddingsSections) -> list[str]:
    p = sections.parity
    n = p.documents_total
    out = [
        "<h2>1. Vector parity</h2>",
        f'<p>{n} documents in batches of 8, <code>encoding_format: "float"</code>.</p>',
        "<table><tr><th>metric</th><th>baseline</th><th>candidate</th></tr>",
    ]
    out += [
        f'<tr><td>{escape(k)}</td><td class="num">{escape(x)}</td>'
        f'<td class="num">{escape(y)}</td></tr>'
        for k, x, y in parity_table(p)
    ]
    out.append("</table><ul>")
    out.append(f"<li>Cosine per document: {escape(cosine_line(p.documents))}</li>")
    out.append(f"<li>Cosine per query, without instruction: {escape(cosine_line(p.queries))}</li>")
    for name, side in (("baseline", p.baseline), ("candidate", p.candidate)):
        out += [f'<li class="fail">{name} error: {escape(e)}</li>' for e in side.errors]
    out.append("</ul>")
    threshold = sections.thresholds.min_cosine
    charts = [cosine_histogram(list(p.documents.cosines), threshold, "Cosine per document")]
    if p.queries.cosines:
        charts.append(
            cosine_histogram(
                list(p.queries.cosines), threshold, "Cosine per query (no instruction)"
            )
        )
    query_row = next((r for r in sections.contract if r.key == "input_type_query"), None)
    if query_row is not None and query_row.cosines:
        charts.append(
            cosine_histogram(
                list(query_row.cosines), threshold, 'Cosine per query with input_type: "query"'
            )
        )
    out.append('<div class="charts">' + "".join(charts) + "</div>")
    return out


def _contract_row(row: ContractRow) -> str:
    mark = SEVERITY_MARK[row.severity]
    notes = "; ".join(row.notes)
    match = (
        f"{mark}: {notes}"
        if notes and row.severity != "ok"
        else (f"{mark} ({notes})" if notes else mark)
    )
    return (
        f"<tr><td>{_code_spans(row.title)}</td><td>{'yes' if row.valid else 'no'}</td>"
        f"<td>{escape(row.baseline.text)}</td><td>{escape(row.candidate.text)}</td>"
        f'<td class="num">{escape(fmt_cos(row.cosine_min))}</td>'
        f'<td class="{row.severity}">{escape(match)}</td></tr>'
    )


def _contract(sections: EmbeddingsSections) -> list[str]:
    out = [
        "<h2>2. Contract</h2>",
        "<p>Each request sent unchanged to both servers. Valid requests must keep the status "
        "class, the vectors' number, length and encoding, and the vectors themselves.</p>",
        "<table><tr><th>request</th><th>valid</th><th>baseline</th><th>candidate</th>"
        "<th>cosine (min)</th><th>match</th></tr>",
    ]
    out += [_contract_row(row) for row in sections.contract]
    out.append("</table>")
    return out


def _latency(latency: LatencyResult | None, skipped: str | None) -> list[str]:
    out = ["<h2>3. Latency and throughput</h2>"]
    if latency is None:
        return out + [f"<p>Not measured: {escape(skipped or 'skipped')}.</p>"]
    p = latency.plan
    out.append(
        f"<p>{p.sequential} sequential requests and {p.concurrent} requests at concurrency "
        f"{p.concurrency}, each a batch of {p.batch_size} documents; median of "
        f"{p.repetitions} repetition(s) (errors: total).</p>"
    )
    head = "".join(f"<th>{escape(FIGURE_LABELS[n])}</th>" for n in FIGURES)
    out.append(f"<table><tr><th></th>{head}<th>errors</th></tr>")
    for name, side in (("baseline", latency.baseline), ("candidate", latency.candidate)):
        m = side.median
        cells = "".join(f'<td class="num">{fmt_num(getattr(m, n))}</td>' for n in FIGURES)
        klass = "fail" if m.errors else "num"
        out.append(f'<tr><td>{name}</td>{cells}<td class="{klass}">{m.errors}</td></tr>')
    ratio_cells = "".join(
        f'<td class="num">{fmt_ratio(latency.ratios.get(n))}</td>' for n in FIGURES
    )
    out.append(f"<tr><td>candidate / baseline</td>{ratio_cells}<td></td></tr></table>")
    ms_names = FIGURES[:4]
    charts = [
        grouped_bars(
            [
                FIGURE_LABELS[n].replace("concurrent", "conc.").replace("sequential", "seq.")
                for n in ms_names
            ],
            [
                ("baseline", [getattr(latency.baseline.median, n) for n in ms_names]),
                ("candidate", [getattr(latency.candidate.median, n) for n in ms_names]),
            ],
            "Latency per batch request (median of repetitions)",
            "ms",
        ),
        grouped_bars(
            ["concurrent docs/s"],
            [
                ("baseline", [latency.baseline.median.concurrent_docs_per_s]),
                ("candidate", [latency.candidate.median.concurrent_docs_per_s]),
            ],
            "Throughput at concurrency " + str(p.concurrency),
            "docs/s",
        ),
    ]
    out.append('<div class="charts">' + "".join(charts) + "</div>")
    return out


def _rerank(sections: RerankSections) -> list[str]:
    out = [f"<p>{escape(queries_line(sections))}</p>", "<h2>Every request</h2>", "<table>"]
    out.append("<tr><th>request</th><th>baseline</th><th>candidate</th><th></th></tr>")
    for r in sections.rows:
        klass, said = ("fail", r.problem) if r.problem else ("ok", "same")
        out.append(
            f"<tr><td>{escape(r.label)}</td><td>{escape(r.baseline)}</td>"
            f'<td>{escape(r.candidate)}</td><td class="{klass}">{escape(said)}</td></tr>'
        )
    out.append("</table>")
    return out


def to_html(report: ProbeReport) -> str:
    title = TITLES[report.meta.task]
    body = [
        f"<h1>{title}</h1>",
        "<ul>",
        *(f"<li>{_code_spans(item)}</li>" for item in meta_lines(report)),
        "</ul>",
    ]
    body += _verdict(report)
    sections = report.sections
    if isinstance(sections, RerankSections):
        body += _rerank(sections)
    else:
        body += _parity(sections)
        body += _contract(sections)
        body += _latency(sections.latency, sections.latency_skipped)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{title}: {escape(report.verdict.label.upper())}</title>"
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
