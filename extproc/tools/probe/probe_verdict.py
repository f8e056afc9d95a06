"""The probe's verdict: the toolkit's checks of the vector parity section and the
contract table, and the latency section's (any error during the latency runs, on
either server, fails it). Pure."""

from __future__ import annotations

from collections.abc import Sequence

from extproc.tools.parity import Check, Thresholds, Verdict
from extproc.tools.probe.latency import LatencyResult
from extproc.tools.toolkit.contract_table import Row
from extproc.tools.toolkit.readiness_checks import PROBE_THRESHOLDS, comparison_verdict
from extproc.tools.toolkit.vector_parity import ParityResult


def latency_checks(latency: LatencyResult | None) -> list[Check]:
    """A failed check per server with errors in the latency runs (none when not run)."""
    if latency is None:
        return []
    checks = []
    for name, side in (("baseline", latency.baseline), ("candidate", latency.candidate)):
        if side.median.errors:
            example = f" (e.g. {side.error_examples[0]})" if side.error_examples else ""
            checks.append(
                Check("latency", False, f"{side.median.errors} errors on the {name}{example}")
            )
    return checks


def decide(
    parity: ParityResult,
    rows: Sequence[Row],
    latency: LatencyResult | None,
    thresholds: Thresholds = PROBE_THRESHOLDS,
) -> Verdict:
    """Every failed check, named by section ("parity", "contract", "latency")."""
    return comparison_verdict(parity, rows, thresholds, more=latency_checks(latency))
