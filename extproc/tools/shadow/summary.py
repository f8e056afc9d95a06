"""The JSON summary a comparator serves at ``/summary``, from its tally. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Final

from ddsketch import DDSketch

from extproc.tools.parity import Check, Thresholds, Verdict, cosine_check, rerank_check
from extproc.tools.shadow.pair_comparison import ShadowTolerances
from extproc.tools.shadow.tally import KindTally, RerankTally, Tally, TokenTally

FORMAT: Final = 2
DROP_REASONS: Final = ("expired", "evicted", "duplicate", "late")
TOKEN_SUMS: Final = ("requests", "equal", "baseline_total", "candidate_total")
_TOLERANCES: Final = ShadowTolerances()
_THRESHOLDS: Final = Thresholds()


def summarize(
    tally: Tally,
    *,
    tolerances: ShadowTolerances = _TOLERANCES,
    thresholds: Thresholds = _THRESHOLDS,
    pending: int = 0,
) -> dict[str, Any]:
    kinds = tally.kinds.values()
    halves: dict[str, dict[str, int]] = {"received": dict(tally.halves_received)}
    for reason in DROP_REASONS:
        halves[reason] = {
            key.split("/", 1)[1]: n
            for key, n in tally.halves_dropped.items()
            if key.startswith(f"{reason}/")
        }
    summary: dict[str, Any] = {
        "format": FORMAT,
        "pairs": tally.pairs,
        "pairs_with_noise": tally.pairs_with_noise,
        "pending_halves": pending,
        "tolerances": asdict(tolerances),
        "inputs": {name: _kind(kind) for name, kind in tally.kinds.items()},
        "status": {
            "pairs": dict(sorted(tally.status_pairs.items())),
            "mismatches": sum(tally.status_mismatches.values()),
            "mismatch_pairs": dict(sorted(tally.status_mismatches.items())),
            "explained_by_noise": tally.status_explained_by_noise,
            "examples": list(tally.status_examples),
        },
        "shape": {
            "dimension_mismatches": sum(k.dimension_mismatches for k in kinds),
            "count_mismatches": tally.count_mismatches,
            "unusable_bodies": dict(tally.unusable_bodies),
        },
        "request_mismatches": tally.request_mismatches,
        "rerank": _rerank(tally.rerank),
        "tokens": _tokens([kind.tokens for kind in kinds]),
        "latency": {
            "pairs": int(tally.latency_ratio.count),
            "sources": dict(tally.latency_sources),
            "ratio": _quantiles(tally.latency_ratio),
            "baseline_s": _quantiles(tally.baseline_latency_s),
            "candidate_s": _quantiles(tally.candidate_latency_s),
        },
        "halves": halves,
        "expired_halves": sum(halves["expired"].values()),
        "tap_problems": dict(tally.tap_problems),
        "worst": list(tally.worst),
    }
    summary["verdict"] = {
        **judge(summary, thresholds).to_json(),
        "thresholds": thresholds.to_json(),
    }
    return summary


def judge(summary: Mapping[str, Any], thresholds: Thresholds = _THRESHOLDS) -> Verdict:
    """The verdict from a summary's JSON, so that ``extproc shadow-report`` can re-judge
    a running comparator's summary against its own thresholds."""
    pairs = int(summary.get("pairs", 0))
    checks = [Check("data", pairs > 0, f"{pairs} request pairs compared")]
    inputs = summary.get("inputs", {})
    for kind, label, threshold in (
        ("document", "documents", thresholds.min_cosine),
        ("query", "queries", thresholds.query_cosine),
    ):
        stats = inputs.get(kind, {})
        lowest = stats.get("min_unexplained_cosine")
        checks.append(
            cosine_check(
                label,
                int(stats.get("compared", 0)),
                None if lowest is None else float(lowest),
                threshold,
                explained=int(stats.get("explained_by_noise", 0)),
            )
        )
    status, shape = summary.get("status", {}), summary.get("shape", {})
    mismatches, allowed = int(status.get("mismatches", 0)), thresholds.max_status_mismatches
    which = ", ".join(f"{k} x{n}" for k, n in sorted(status.get("mismatch_pairs", {}).items()))
    dims, counts = int(shape.get("dimension_mismatches", 0)), int(shape.get("count_mismatches", 0))
    unusable = int(shape.get("unusable_bodies", {}).get("candidate", 0))
    same = int(summary.get("request_mismatches", 0))
    checks += [
        Check(
            "status classes",
            mismatches <= allowed,
            f"{mismatches} mismatches (baseline/candidate: {which or 'none'}), allowed {allowed}",
        ),
        Check(
            "shapes",
            dims == 0 and counts == 0 and unusable == 0,
            f"{dims} dimension mismatches, {counts} vector-count mismatches, "
            f"{unusable} unusable candidate bodies",
        ),
        Check("same requests", same == 0, f"{same} pairs whose taps saw different request bytes"),
    ]
    rerank = summary.get("rerank") or {}
    if int(rerank.get("pairs", 0)):
        differences = {k: int(n) for k, n in rerank.get("differences", {}).items()}
        checks.append(rerank_check(int(rerank["pairs"]), differences))
    return Verdict(tuple(checks))


def _kind(kind: KindTally) -> dict[str, Any]:
    cosine: dict[str, float] | None = None
    if kind.min_cosine is not None and kind.max_cosine is not None:
        cosine = {"min": kind.min_cosine}
        for q in (0.01, 0.05, 0.5):
            distance = kind.distance.get_quantile_value(1.0 - q)
            value = kind.min_cosine if distance is None else 1.0 - float(distance)
            cosine[f"p{round(q * 100):02d}"] = min(max(value, kind.min_cosine), kind.max_cosine)
        cosine["max"] = kind.max_cosine
    return {
        "requests": kind.requests,
        "compared": kind.inputs,
        "cosine": cosine,
        "min_unexplained_cosine": kind.min_unexplained_cosine,
        "mismatches": kind.mismatches,
        "explained_by_noise": kind.explained_by_noise,
        "dimension_mismatches": kind.dimension_mismatches,
        "norm_mismatches": kind.norm_mismatches,
        "dims": {"baseline": dict(kind.baseline_dims), "candidate": dict(kind.candidate_dims)},
        "norms": {
            "baseline": list(kind.baseline_norm) if kind.baseline_norm else None,
            "candidate": list(kind.candidate_norm) if kind.candidate_norm else None,
        },
        "tokens": _tokens([kind.tokens]),
    }


def _rerank(tally: RerankTally) -> dict[str, Any]:
    return {
        "pairs": tally.pairs,
        "same": tally.same,
        "differences": dict(sorted(tally.differences.items())),
        "max_score_difference": tally.max_score_difference,
        "examples": list(tally.examples),
    }


def _tokens(tallies: list[TokenTally]) -> dict[str, int]:
    sums = {name: sum(getattr(t, name) for t in tallies) for name in TOKEN_SUMS}
    maximum = max(t.max_abs_diff for t in tallies)
    return {**sums, "different": sums["requests"] - sums["equal"], "max_abs_diff": maximum}


def _quantiles(sketch: DDSketch) -> dict[str, float] | None:
    if sketch.count == 0:
        return None
    return {
        f"p{round(q * 100):02d}": float(sketch.get_quantile_value(q) or 0.0)
        for q in (0.5, 0.9, 0.99)
    }
