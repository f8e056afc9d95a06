"""Medians over repetitions per case and workload, and the shipped-vs-naive ratios."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from bench.workloads import WORKLOADS, Case


def _median(values: list[Any]) -> Any:
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else None


def _added_p50(mine: list[dict[str, Any]], by: dict[tuple[str, str, int], dict[str, Any]]) -> Any:
    """p50 minus B's p50 of the same workload in the same repetition, then the median."""
    added = []
    for c in mine:
        base = by.get(("B", c["workload"], c["repetition"]))
        if base is not None:
            added.append(c["p50_ms"] - base["p50_ms"])
    return _median(added)


def _memory_mb(mine: list[dict[str, Any]], key: str) -> list[float]:
    return [
        c["extproc_memory_kb"][key] / 1024
        for c in mine
        if c["extproc_memory_kb"] and key in c["extproc_memory_kb"]
    ]


def summary_row(
    case: Case,
    workload: str,
    mine: list[dict[str, Any]],
    by: dict[tuple[str, str, int], dict[str, Any]],
    probes: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    def med(get: Callable[[dict[str, Any]], Any]) -> Any:
        return _median([get(c) for c in mine])

    rss = _memory_mb(mine, "VmRSS") if case.uses_extproc else []
    hwm = _memory_mb(mine, "VmHWM") if case.uses_extproc else []
    return {
        "case": case.key,
        "label": case.label,
        "workload": workload,
        "repetitions": len(mine),
        "p50_ms": med(lambda c: c["p50_ms"]),
        "p99_ms": med(lambda c: c["p99_ms"]),
        "req_per_s": med(lambda c: c["req_per_s"]),
        "docs_per_s": med(lambda c: c["docs_per_s"]),
        "added_p50_vs_B_ms": _added_p50(mine, by) if case.key != "B" else None,
        # Exact, from the single probe request before the load:
        "ext_proc_msgs_per_req": probes.get(f"{case.key}/{WORKLOADS[workload].inputs}", {}).get(
            "ext_proc_msgs"
        ),
        # Under load Envoy also counts the requests wrk abandons at its end (reset
        # part-way), so this reads slightly lower:
        "ext_proc_msgs_per_req_under_load": med(lambda c: c["ext_proc_msgs_per_req"]),
        "extproc_cpu_ms_per_req": (
            med(lambda c: c["cpu_ms_per_req"]["extproc"]) if case.uses_extproc else None
        ),
        "envoy_cpu_ms_per_req": med(lambda c: c["cpu_ms_per_req"].get("envoy")),
        "upstream_cpu_ms_per_req": med(lambda c: c["cpu_ms_per_req"]["upstream"]),
        "wrk_cpu_ms_per_req": med(lambda c: c["cpu_ms_per_req"]["wrk"]),
        # ext_proc's RSS after the cell (one process serves N and S all run long):
        "extproc_rss_mb": statistics.median(rss) if rss else None,
        "extproc_rss_mb_max": max(rss) if rss else None,
        "extproc_peak_rss_mb": max(hwm) if hwm else None,
        "non_2xx_3xx": sum(c["non_2xx_3xx"] for c in mine),
        "socket_errors": sum(c["socket_errors"] for c in mine),
        "requests": sum(c["requests"] for c in mine),
        "other_load_cores": med(lambda c: c["cpu_cores_busy"]["others"]),
    }


def summarise(
    cells: list[dict[str, Any]],
    cases: list[Case],
    workloads: list[str],
    probes: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    """One row per workload and case that has cells, in that order."""
    by = {(c["case"], c["workload"], c["repetition"]): c for c in cells}
    rows = []
    for wl in workloads:
        for case in cases:
            mine = [c for c in cells if c["case"] == case.key and c["workload"] == wl]
            if mine:
                rows.append(summary_row(case, wl, mine, by, probes))
    return rows


def _ratio(
    rows: dict[tuple[str, str], dict[str, Any]],
    what: str,
    wl: str,
    key: str,
    *,
    limit: float,
    le: bool,
) -> dict[str, Any] | None:
    """Shipped S over naive N for one figure; what[0] names the request, "a" or "b",
    or "n": the full rewrite against an upstream that cuts itself (S-n, F-n) over the
    naive full rewrite (N-b)."""
    naive = "b" if what[0] == "n" else what[0]
    s, n = rows.get(("S-" + what[0], wl)), rows.get(("N-" + naive, wl))
    if not s or not n or s[key] is None or n[key] in (None, 0):
        return None
    value = s[key] / n[key]
    # The floor of S's message pattern (F: same messages, no work) against the real
    # naive gateway: the best ratio any work saved inside the server can reach.
    f = rows.get(("F-" + what[0], wl))
    bound = f[key] / n[key] if f and f[key] is not None else None
    # The library floor (L: the same messages carrying the contract's body work done
    # by the libraries alone): the best ratio any Python server doing that work reaches.
    lib = rows.get(("L-" + what[0], wl))
    library = lib[key] if lib and lib[key] is not None else None
    return {
        "target": what,
        "workload": wl,
        "shipped": s[key],
        "naive": n[key],
        "ratio": value,
        "floor": f[key] if f else None,
        "floor_ratio": bound,
        "library": library,
        "library_ratio": None if library is None else library / n[key],
        "limit": f"{'<=' if le else '>='} {limit:g}",
        "met": value <= limit if le else value >= limit,
        "reachable": None if bound is None else (bound <= limit if le else bound >= limit),
    }


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The performance targets as ratios of shipped S to naive N, from this run."""
    get = {(r["case"], r["workload"]): r for r in rows}
    wanted = [
        ("b: full rewrite, added p50", "seed-c1", "added_p50_vs_B_ms", 0.6, True),
        ("b: full rewrite, req/s", "sat-c16", "req_per_s", 1.2, False),
        ("a: no rewrite, req/s", "sat-c16", "req_per_s", 1.6, False),
        ("n: native dimensions, added p50", "seed-c1", "added_p50_vs_B_ms", 0.6, True),
        ("n: native dimensions, req/s", "sat-c16", "req_per_s", 1.8, False),
    ]
    out = []
    for what, wl, key, limit, le in wanted:
        ratio = _ratio(get, what, wl, key, limit=limit, le=le)
        if ratio is not None:
            out.append(ratio)
    return out


def cpu_beyond_floor(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ext_proc CPU per request of each shipped case minus its floor's (S-x - F-x), per
    workload of this run: the server's own work, with the message pattern's cost
    taken out. The limits are the targets: 0.3 ms for the full rewrite, 0.1 ms with
    no rewrite."""
    get = {(r["case"], r["workload"]): r for r in rows}
    limits = {"a": 0.1, "b": 0.3, "n": None}
    out = []
    for wl in dict.fromkeys(r["workload"] for r in rows):
        for request, limit in limits.items():
            s, f = get.get((f"S-{request}", wl)), get.get((f"F-{request}", wl))
            if not s or not f:
                continue
            mine, floor = s["extproc_cpu_ms_per_req"], f["extproc_cpu_ms_per_req"]
            if mine is None or floor is None:
                continue
            lib = get.get((f"L-{request}", wl))
            library = lib["extproc_cpu_ms_per_req"] if lib else None
            out.append(
                {
                    "request": request,
                    "workload": wl,
                    "shipped_ms": mine,
                    "floor_ms": floor,
                    "beyond_floor_ms": mine - floor,
                    # What the libraries alone add to the floor (L - F): the part of
                    # the server's work no Python around them can save.
                    "library_beyond_floor_ms": None if library is None else library - floor,
                    "limit_ms": limit,
                    "met": None if limit is None else mine - floor <= limit,
                }
            )
    return out


# (what, case, against, workload, figure, at least): what more ext_proc processes buy.
WORKERS_TARGETS = [
    ("b2: full rewrite, 2 workers, req/s", "S-b2", "S-b", "sat-c16", "req_per_s", 1.25),
]


def workers_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The 2-worker case against the same path with one ext_proc process, this run."""
    get = {(r["case"], r["workload"]): r for r in rows}
    out = []
    for what, case, against, wl, key, limit in WORKERS_TARGETS:
        mine, base = get.get((case, wl)), get.get((against, wl))
        if not mine or not base or mine[key] is None or base[key] in (None, 0):
            continue
        ratio = mine[key] / base[key]
        out.append(
            {
                "target": what,
                "workload": wl,
                "case": case,
                "against": against,
                "value": mine[key],
                "against_value": base[key],
                "ratio": ratio,
                "limit": f">= {limit:g}",
                "met": ratio >= limit,
            }
        )
    return out


# (path, case with one ext_proc process, case with two workers)
CAPACITY_PATHS = [
    ("plain request (no rewrite)", "S-a", "S-a2"),
    ("native cut (upstream cuts dimensions)", "S-n", "S-n2"),
    ("emulated full rewrite", "S-b", "S-b2"),
]


def capacity(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """CPU per request of ext_proc (all its processes) and Envoy on each shipped path,
    with one ext_proc process and with two, per saturation workload of this run; in
    cores per 1,000 req/s that is the same number (ms per request x 1,000 / 1,000)."""
    get = {(r["case"], r["workload"]): r for r in rows}
    out = []
    for wl in dict.fromkeys(r["workload"] for r in rows):
        if not wl.startswith("sat-"):
            continue
        for path, *cases in CAPACITY_PATHS:
            for workers, case in zip((1, 2), cases, strict=True):
                row = get.get((case, wl))
                if not row or row["extproc_cpu_ms_per_req"] is None:
                    continue
                extproc, envoy = row["extproc_cpu_ms_per_req"], row["envoy_cpu_ms_per_req"]
                out.append(
                    {
                        "path": path,
                        "case": case,
                        "workers": workers,
                        "workload": wl,
                        "req_per_s": row["req_per_s"],
                        "extproc_cpu_ms_per_req": extproc,
                        "envoy_cpu_ms_per_req": envoy,
                        "extproc_cores_per_1000_rps": extproc,
                        "gateway_cores_per_1000_rps": None if envoy is None else extproc + envoy,
                    }
                )
    return out
