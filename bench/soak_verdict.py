"""The soak's verdict: no errors, ext_proc RSS flat and under its ceiling, p99 stable."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from bench.render import fmt


def span(indices: list[int]) -> str:
    return f"{indices[0]}-{indices[-1]}" if len(indices) > 1 else str(indices[0])


def thirds(n: int) -> tuple[list[int], list[int]]:
    """The first and the last third of n windows after the warm-up (>= 1 window each)."""
    third = max(1, (n - 1) // 3)
    return list(range(2, 2 + third)), list(range(n - third + 1, n + 1))


def errors_check(
    windows: list[dict[str, Any]], *, checks_ok: bool, alive: bool, complete: bool
) -> dict[str, Any]:
    wrk_errors = sum(w["errors"] for w in windows)
    envoy_5xx = sum(w["envoy_codes"].get("5xx", 0) for w in windows)
    processes = (
        f"processes {'the same, alive' if alive else 'DIED or restarted'}"
        if complete
        else "soak cut short"
    )
    return {
        "name": "errors",
        "pass": complete and wrk_errors == 0 and envoy_5xx == 0 and checks_ok and alive,
        "value": wrk_errors,
        "limit": "== 0",
        "detail": f"wrk non-2xx + socket errors {wrk_errors}, Envoy 5xx {envoy_5xx}, "
        f"check requests {'ok' if checks_ok else 'FAILED'}, " + processes,
    }


def rss_flat_check(
    windows: list[dict[str, Any]], samples: list[dict[str, Any]], growth_limit: float
) -> dict[str, Any]:
    """The max ext_proc VmRSS over the last third against the end of window 1."""
    n = len(windows)
    late = thirds(n)[1]
    baseline = windows[0]["extproc_rss_mb_end"] if windows else None
    late_rss = [s["extproc_rss_mb"] for s in samples if s["window"] in late and s["extproc_rss_mb"]]
    late_max = max(late_rss) if late_rss else None
    growth = late_max / baseline - 1 if baseline and late_max and n >= 3 else None
    return {
        "name": "rss_flat",
        "pass": growth is not None and growth < growth_limit,
        "value": growth,
        "limit": f"< {growth_limit:.0%}",
        "baseline_mb": baseline,
        "late_max_mb": late_max,
        "late_windows": late,
        "detail": f"ext_proc VmRSS max over windows {span(late)} "
        f"{fmt(late_max, 1)} MB vs {fmt(baseline, 1)} MB at the end of window 1",
    }


def rss_ceiling_check(samples: list[dict[str, Any]], limit_mb: float) -> dict[str, Any]:
    all_rss = [s["extproc_rss_mb"] for s in samples if s["extproc_rss_mb"]]
    peak = max(all_rss) if all_rss else None
    return {
        "name": "rss_ceiling",
        "pass": peak is not None and peak <= limit_mb,
        "value": peak,
        "limit": f"<= {limit_mb:g} MB",
        "detail": f"largest ext_proc VmRSS sampled {fmt(peak, 1)} MB",
    }


def p99_check(windows: list[dict[str, Any]], ratio_limit: float) -> dict[str, Any]:
    """The median p99 of the last third against that of the first third after the warm-up."""
    n = len(windows)
    early, late = thirds(n)
    by_index = {w["window"]: w for w in windows}
    first = statistics.median(by_index[i]["p99_ms"] for i in early) if n >= 3 else None
    last = statistics.median(by_index[i]["p99_ms"] for i in late) if n >= 3 else None
    ratio = last / first if first and last is not None else None
    return {
        "name": "p99_stable",
        "pass": ratio is not None and ratio <= ratio_limit,
        "value": ratio,
        "limit": f"<= {ratio_limit:g}x",
        "first_ms": first,
        "last_ms": last,
        "early_windows": early,
        "late_windows": late,
        "detail": f"median p99 of windows {span(late)} {fmt(last)} ms vs windows "
        f"{span(early)} {fmt(first)} ms",
    }


def rss_slope(samples: list[dict[str, Any]]) -> float | None:
    """ext_proc RSS trend after the warm-up, MB per minute (least squares)."""
    steady = [s for s in samples if s["window"] and s["window"] > 1 and s["extproc_rss_mb"]]
    if len(steady) < 3 or len({s["t_s"] for s in steady}) < 2:
        return None
    return statistics.linear_regression(
        [s["t_s"] / 60 for s in steady], [s["extproc_rss_mb"] for s in steady]
    ).slope


def verdict(
    *,
    windows: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    checks_ok: bool,
    alive: bool,
    args: argparse.Namespace,
    complete: bool,
) -> dict[str, Any]:
    checks = [
        errors_check(windows, checks_ok=checks_ok, alive=alive, complete=complete),
        rss_flat_check(windows, samples, args.rss_growth),
    ]
    if args.rss_limit_mb > 0:
        checks.append(rss_ceiling_check(samples, args.rss_limit_mb))
    checks.append(p99_check(windows, args.p99_ratio))
    return {
        "pass": all(c["pass"] for c in checks),
        "checks": checks,
        "extproc_rss_slope_mb_per_min": rss_slope(samples),
    }


def verdict_lines(result: dict[str, Any]) -> list[str]:
    v = result["verdict"]
    lines = [f"verdict: {'PASS' if v['pass'] else 'FAIL'}"]
    for check in v["checks"]:
        value = check["value"]
        if check["name"] == "rss_flat" and value is not None:
            shown = f"{value:+.1%}"
        elif check["name"] == "p99_stable" and value is not None:
            shown = f"{value:.2f}x"
        else:
            shown = fmt(value, 1)
        lines.append(
            f"  {'ok  ' if check['pass'] else 'FAIL'} {check['name']:<12} {shown} "
            f"(limit {check['limit']}): {check['detail']}"
        )
    slope = v.get("extproc_rss_slope_mb_per_min")
    if slope is not None:
        lines.append(f"  ext_proc RSS trend after warm-up: {slope:+.2f} MB/min (least squares)")
    return lines
