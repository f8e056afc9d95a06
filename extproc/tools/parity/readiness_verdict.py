"""Ready or not: the verdict model of the probe and of shadow mode (pure).

A verdict is a list of named checks, each passed or failed with a one-line detail,
plus warnings that do not change it. It is *ready* when every check passes,
*inconclusive* when the baseline itself could not be read (nothing to compare
against), else *not ready*; the exit codes follow (0, 2, 1).

The rerank check asks that every rerank pair be the same. Cosine checks judge the
lowest cosine of a kind of input (documents, queries)
against its threshold; a kind with nothing compared passes vacuously, and says so.
Queries have their own threshold (by default the documents'): a query embedded
without its instruction is the silent failure of a migration, 200 on both sides
with far-off vectors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    READY = 0
    NOT_READY = 1
    INCONCLUSIVE = 2  # also: bad arguments, nothing readable


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
    warnings: tuple[str, ...] = ()
    inconclusive: bool = False

    @property
    def ready(self) -> bool:
        return not self.inconclusive and all(check.ok for check in self.checks)

    @property
    def exit_code(self) -> ExitCode:
        if self.inconclusive:
            return ExitCode.INCONCLUSIVE
        return ExitCode.READY if self.ready else ExitCode.NOT_READY

    @property
    def label(self) -> str:
        return {
            ExitCode.READY: "ready",
            ExitCode.NOT_READY: "not ready",
            ExitCode.INCONCLUSIVE: "inconclusive",
        }[self.exit_code]

    @property
    def failures(self) -> tuple[str, ...]:
        return tuple(f"{c.name}: {c.detail}" for c in self.checks if not c.ok)

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.label,
            "ready": self.ready,
            "exit_code": int(self.exit_code),
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
            "warnings": list(self.warnings),
        }


def cosine_check(
    label: str, compared: int, lowest: float | None, threshold: float, *, explained: int = 0
) -> Check:
    """``lowest``: the lowest cosine over ``compared`` inputs, leaving out the
    ``explained`` ones (within the baseline's own noise); None when all were."""
    if compared == 0:
        return Check(label, True, f"no {label} compared")
    if lowest is None:
        return Check(
            label, True, f"{explained} of {compared} inputs below {threshold}, all within noise"
        )
    ok = lowest >= threshold
    sign = ">=" if ok else "<"
    noise = f", {explained} more below it but within noise" if explained else ""
    return Check(
        label, ok, f"min cosine {lowest:.4f} {sign} {threshold} over {compared} inputs{noise}"
    )


def rerank_check(compared: int, differences: Mapping[str, int]) -> Check:
    """Every rerank pair the same: ``differences`` counts the ``compared`` pairs a
    client would tell apart, by kind of difference."""
    differ = sum(differences.values())
    kinds = ", ".join(f"{k} x{n}" for k, n in sorted(differences.items()))
    return Check(
        "rerank answers",
        differ == 0,
        f"{differ} of {compared} rerank pairs a client would tell apart ({kinds or 'none'})",
    )
