"""Numbers as text: the benchmark's table (stdout) and Markdown (results file), and the
plain table shapes the soak shares."""

from __future__ import annotations

from typing import Any

from bench.workloads import WORKLOADS


def fmt(value: Any, digits: int = 2) -> str:
    """None as "-"; floats with fewer decimals as they grow."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def text_table(
    head: list[str], rows: list[list[str]], *, left: set[int], widths: list[int] | None = None
) -> str:
    """Columns padded to their widest cell (at least ``widths``); ``left`` columns are
    left-aligned, the others right-aligned; a rule under the head."""
    table = [head, *rows]
    least = widths or [0] * len(head)
    sizes = [max(least[i], *(len(r[i]) for r in table)) for i in range(len(head))]

    def line(row: list[str]) -> str:
        return " | ".join(
            cell.ljust(sizes[i]) if i in left else cell.rjust(sizes[i])
            for i, cell in enumerate(row)
        )

    return "\n".join([line(head), "-+-".join("-" * w for w in sizes), *map(line, rows)])


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


# -- the benchmark's summary rows -------------------------------------------------

# (heading, summary key or None for the error count, minimum width, decimals or None)
COLUMNS: list[tuple[str, str | None, int, int | None]] = [
    ("case", "label", 24, None),
    ("p50 ms", "p50_ms", 7, 2),
    ("p99 ms", "p99_ms", 7, 2),
    ("req/s", "req_per_s", 7, 0),
    ("docs/s", "docs_per_s", 8, 0),
    ("+p50 vs B", "added_p50_vs_B_ms", 9, 2),
    ("msgs/req", "ext_proc_msgs_per_req", 8, 2),
    ("extproc CPU ms/req", "extproc_cpu_ms_per_req", 18, 2),
    ("Envoy CPU ms/req", "envoy_cpu_ms_per_req", 16, 2),
    ("upstr CPU", "upstream_cpu_ms_per_req", 9, 3),
    ("extproc RSS MB", "extproc_rss_mb", 14, 0),
    ("err", None, 5, None),
    ("others' cores", "other_load_cores", 13, 2),
]
_LEFT = {i for i, (_, key, _, _) in enumerate(COLUMNS) if key in (None, "label")}


def _cell(row: dict[str, Any], key: str | None, digits: int | None) -> str:
    if key is None:
        return str(row["non_2xx_3xx"] + row["socket_errors"])
    if digits is None:
        return str(row[key])
    if digits == 0 and row[key] is not None:
        return f"{row[key]:,.0f}"
    return fmt(row[key], digits or 2)


def _cells(row: dict[str, Any]) -> list[str]:
    return [_cell(row, key, digits) for _, key, _, digits in COLUMNS]


def summary_table(rows: list[dict[str, Any]], workloads: list[str]) -> str:
    """One section per workload, the cases as rows."""
    head = [name for name, *_ in COLUMNS]
    widths = [width for _, _, width, _ in COLUMNS]
    sections = []
    for wl in workloads:
        mine = [_cells(r) for r in rows if r["workload"] == wl]
        if mine:
            table = text_table(head, mine, left=_LEFT, widths=widths)
            sections.append(f"\n{WORKLOADS[wl].description}  [{wl}]\n{table}")
    return "\n".join(sections)


def summary_markdown(rows: list[dict[str, Any]], workloads: list[str]) -> str:
    head = ["workload"] + [name for name, *_ in COLUMNS]
    body = [[wl, *_cells(r)] for wl in workloads for r in rows if r["workload"] == wl]
    return markdown_table(head, body)


def targets_lines(targets: list[dict[str, Any]]) -> list[str]:
    if not targets:
        return []
    lines = ["\ntargets (shipped S vs naive N, this run):"]
    for t in targets:
        floor = (
            f"; floor F {fmt(t['floor'])} / N = {t['floor_ratio']:.2f}"
            if t.get("floor_ratio") is not None
            else ""
        )
        if t.get("library_ratio") is not None:
            floor += f"; library floor L {fmt(t['library'])} / N = {t['library_ratio']:.2f}"
        lines.append(
            f"  {t['target']:<36} {t['workload']:<8} S {fmt(t['shipped'])} / "
            f"N {fmt(t['naive'])} = {t['ratio']:.2f} (target {t['limit']}): "
            f"{'met' if t['met'] else 'NOT met'}{floor}"
        )
    return lines


def workers_targets_lines(targets: list[dict[str, Any]]) -> list[str]:
    if not targets:
        return []
    lines = ["\ntargets (ext_proc workers vs one process, this run):"]
    for t in targets:
        lines.append(
            f"  {t['target']:<36} {t['workload']:<8} {t['case']} {fmt(t['value'])} / "
            f"{t['against']} {fmt(t['against_value'])} = {t['ratio']:.2f} "
            f"(target {t['limit']}): {'met' if t['met'] else 'NOT met'}"
        )
    return lines


def capacity_lines(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    head = ["workload", "path", "workers", "req/s", "ext_proc ms/req", "Envoy ms/req"]
    head += ["ext_proc cores / 1k req/s", "+ Envoy"]
    body = [
        [
            r["workload"],
            r["path"],
            str(r["workers"]),
            f"{r['req_per_s']:,.0f}",
            fmt(r["extproc_cpu_ms_per_req"]),
            fmt(r["envoy_cpu_ms_per_req"]),
            fmt(r["extproc_cores_per_1000_rps"]),
            fmt(r["gateway_cores_per_1000_rps"]),
        ]
        for r in rows
    ]
    table = text_table(head, body, left={0, 1})
    return ["\ncapacity (CPU per request at saturation; cores per 1,000 req/s):", table]


def beyond_floor_lines(gaps: list[dict[str, Any]]) -> list[str]:
    if not gaps:
        return []
    lines = ["\next_proc CPU beyond its floor (S - F, ms per request, this run):"]
    for g in gaps:
        verdict = (
            ""
            if g["limit_ms"] is None
            else f" (target <= {g['limit_ms']:g}): {'met' if g['met'] else 'NOT met'}"
        )
        library = g.get("library_beyond_floor_ms")
        if library is not None:
            verdict += f"; the libraries alone (L - F) {library:.2f}"
        lines.append(
            f"  {g['request']}  {g['workload']:<8} S {g['shipped_ms']:.2f} - F "
            f"{g['floor_ms']:.2f} = {g['beyond_floor_ms']:.2f}{verdict}"
        )
    return lines


_RSS_MOMENTS = (
    ("after_start", "after start (tokenizer loaded)"),
    ("before_first_big_batch", "before the first 2,048-input request"),
    ("end", "at the end"),
    ("peak_vmhwm", "peak (VmHWM)"),
)


def rss_line(rss: dict[str, Any]) -> str:
    moments = "; ".join(
        f"{label} {fmt(rss[key], 0)}" for key, label in _RSS_MOMENTS if rss.get(key) is not None
    )
    each = ", ".join(fmt(v, 0) for v in rss["after_repetition"])
    return f"\next_proc RSS MB: {moments}; after each repetition {each}"


def capture_lines(captures: list[dict[str, Any]]) -> list[str]:
    lines = []
    for capture in captures:
        lines.append(
            f"\nerrors in {capture['case']} {capture['workload']}: statuses "
            f"{capture['statuses']} wrk {capture['wrk_errors']}"
        )
        lines += [f"  {s['status']}: {s['body'][:300]}" for s in capture["samples"][:3]]
    return lines
