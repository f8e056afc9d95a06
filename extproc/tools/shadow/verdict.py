"""Ready or not: the cut-over verdict from a JSON summary (pure).

Checks, all of which must pass for ``ready``:

- something was compared (at least one pair);
- documents: the lowest cosine not explained by noise is >= ``min_cosine``;
- queries: the same against ``min_query_cosine`` (default: ``min_cosine``). A
  query embedded without its instruction is the seed's silent failure;
- status classes: at most ``max_status_mismatches`` requests whose baseline and
  candidate status classes differ (and the noise replica does not explain it);
- shapes: no dimension or vector-count mismatch, no unusable candidate 2xx body;
- both taps saw the same request bytes (else the set-up compares the wrong things).

A kind with no inputs compared passes its cosine check vacuously (said in the detail).
It works on the summary's JSON, so ``extproc shadow-report`` can re-judge a running
comparator's summary against its own thresholds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    min_cosine: float = 0.999  # documents
    min_query_cosine: float | None = None  # None: the same as min_cosine
    max_status_mismatches: int = 0

    @property
    def query_cosine(self) -> float:
        return self.min_cosine if self.min_query_cosine is None else self.min_query_cosine

    def to_json(self) -> dict[str, Any]:
        return {
            "min_cosine": self.min_cosine,
            "min_query_cosine": self.query_cosine,
            "max_status_mismatches": self.max_status_mismatches,
        }


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Verdict:
    checks: tuple[Check, ...]

    @property
    def ready(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def label(self) -> str:
        return "ready" if self.ready else "not ready"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.label,
            "ready": self.ready,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
        }


def judge(summary: Mapping[str, Any], thresholds: Thresholds = Thresholds()) -> Verdict:
    pairs = int(summary.get("pairs", 0))
    checks = [Check("data", pairs > 0, f"{pairs} request pairs compared")]
    inputs = summary.get("inputs", {})
    for kind, label, threshold in (
        ("document", "documents", thresholds.min_cosine),
        ("query", "queries", thresholds.query_cosine),
    ):
        checks.append(_cosine_check(label, inputs.get(kind, {}), threshold))

    status = summary.get("status", {})
    mismatches = int(status.get("mismatches", 0))
    pairs_detail = ", ".join(
        f"{key} x{n}" for key, n in sorted(status.get("mismatch_pairs", {}).items())
    )
    checks.append(
        Check(
            "status classes",
            mismatches <= thresholds.max_status_mismatches,
            f"{mismatches} mismatches (baseline/candidate: {pairs_detail or 'none'}), "
            f"allowed {thresholds.max_status_mismatches}",
        )
    )
    shape = summary.get("shape", {})
    dims = int(shape.get("dimension_mismatches", 0))
    counts = int(shape.get("count_mismatches", 0))
    unusable = int(shape.get("unusable_bodies", {}).get("candidate", 0))
    checks.append(
        Check(
            "shapes",
            dims == 0 and counts == 0 and unusable == 0,
            f"{dims} dimension mismatches, {counts} vector-count mismatches, "
            f"{unusable} unusable candidate bodies",
        )
    )
    same = int(summary.get("request_mismatches", 0))
    checks.append(
        Check(
            "same requests",
            same == 0,
            f"{same} pairs whose taps saw different request bytes",
        )
    )
    return Verdict(tuple(checks))


def _cosine_check(label: str, stats: Mapping[str, Any], threshold: float) -> Check:
    compared = int(stats.get("compared", 0))
    lowest = stats.get("min_unexplained_cosine")
    explained = int(stats.get("explained_by_noise", 0))
    if compared == 0:
        return Check(label, True, f"no {label} compared")
    if lowest is None:
        return Check(
            label, True, f"{explained} of {compared} inputs below {threshold}, all within noise"
        )
    ok = float(lowest) >= threshold
    sign = ">=" if ok else "<"
    noise = f", {explained} more below it but within noise" if explained else ""
    return Check(
        label,
        ok,
        f"min cosine {float(lowest):.4f} {sign} {threshold} over {compared} inputs{noise}",
    )
