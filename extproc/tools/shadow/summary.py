"""The JSON summary a comparator serves at ``/summary``, from a (merged) tally. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from typing import Any, Final

from extproc.tools.shadow.compare import Tolerances
from extproc.tools.shadow.sketch import Sketch
from extproc.tools.shadow.tally import KindTally, Tally
from extproc.tools.shadow.verdict import Thresholds, judge

FORMAT: Final = 1
DROP_REASONS: Final = ("expired", "evicted", "duplicate", "late")
_TOLERANCES: Final = Tolerances()
_THRESHOLDS: Final = Thresholds()


def summarize(
    tally: Tally,
    *,
    tolerances: Tolerances = _TOLERANCES,
    thresholds: Thresholds = _THRESHOLDS,
) -> dict[str, Any]:
    tokens = _tokens(tally.kinds.values())
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
            "dimension_mismatches": sum(k.dimension_mismatches for k in tally.kinds.values()),
            "count_mismatches": tally.count_mismatches,
            "unusable_bodies": dict(tally.unusable_bodies),
        },
        "request_mismatches": tally.request_mismatches,
        "tokens": tokens,
        "latency": {
            "pairs": tally.latency_ratio.count,
            "sources": dict(tally.latency_sources),
            "ratio": _quantiles(tally.latency_ratio, (0.5, 0.9, 0.99)),
            "baseline_s": _quantiles(tally.baseline_latency_s, (0.5, 0.9, 0.99)),
            "candidate_s": _quantiles(tally.candidate_latency_s, (0.5, 0.9, 0.99)),
        },
        "halves": halves,
        "expired_halves": sum(halves["expired"].values()),
        "tap_problems": dict(tally.tap_problems),
        "forwarding": dict(tally.forwarding),
        "worst": list(tally.worst),
    }
    summary["verdict"] = judge(summary, thresholds).to_json()
    summary["verdict"]["thresholds"] = thresholds.to_json()
    return summary


def _kind(kind: KindTally) -> dict[str, Any]:
    distance = kind.distance
    cosine: dict[str, float] | None = None
    if distance.count and kind.min_cosine is not None and kind.max_cosine is not None:
        cosine = {"min": kind.min_cosine}
        for q in (0.01, 0.05, 0.5):
            value = distance.quantile(1.0 - q)
            cosine[f"p{round(q * 100):02d}"] = 1.0 - value if value is not None else kind.min_cosine
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
        "tokens": {
            "requests": kind.token_requests,
            "equal": kind.tokens_equal,
            "baseline_total": kind.baseline_tokens,
            "candidate_total": kind.candidate_tokens,
            "max_abs_diff": kind.max_abs_token_diff,
        },
    }


def _tokens(kinds: Iterable[KindTally]) -> dict[str, int]:
    kinds = list(kinds)
    requests = sum(k.token_requests for k in kinds)
    equal = sum(k.tokens_equal for k in kinds)
    return {
        "requests": requests,
        "equal": equal,
        "different": requests - equal,
        "baseline_total": sum(k.baseline_tokens for k in kinds),
        "candidate_total": sum(k.candidate_tokens for k in kinds),
        "max_abs_diff": max((k.max_abs_token_diff for k in kinds), default=0),
    }


def _quantiles(sketch: Sketch, qs: tuple[float, ...]) -> dict[str, float] | None:
    if sketch.count == 0:
        return None
    out: dict[str, float] = {}
    for q in qs:
        value = sketch.quantile(q)
        if value is not None:
            out[f"p{round(q * 100):02d}"] = value
    return out
