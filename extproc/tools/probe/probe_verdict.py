"""The probe's verdict, by task (pure).

Embeddings: the toolkit's checks of the vector parity section and the contract table,
and the latency section's (any error during the latency runs, on either server, fails
it). Reranking: every row the same (the parity package's ``rerank answers`` check,
shadow mode's too); INCONCLUSIVE when the baseline gave no query an answer in the
dialect (another dialect, path or server: nothing to compare against).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from extproc.tools.parity import Check, Thresholds, Verdict, rerank_check
from extproc.tools.probe.latency import LatencyResult
from extproc.tools.probe.probe_report import RerankSections
from extproc.tools.toolkit.contract_table import ContractRow
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
    rows: Sequence[ContractRow],
    latency: LatencyResult | None,
    thresholds: Thresholds = PROBE_THRESHOLDS,
) -> Verdict:
    """Every failed check, named by section ("parity", "contract", "latency")."""
    return comparison_verdict(parity, rows, thresholds, more=latency_checks(latency))


def rerank_verdict(sections: RerankSections) -> Verdict:
    """Every row the same; INCONCLUSIVE when no query's baseline reply was an answer."""
    rows = sections.rows
    answered = sum(1 for r in sections.queries if r.baseline_answered)
    baseline = Check(
        "baseline",
        answered > 0,
        f"the baseline answered {answered} of {len(sections.queries)} queries"
        if answered
        else "the baseline gave no query a rerank answer: check --dialect, the path and the URL",
    )
    differences = Counter(r.difference for r in rows if r.problem)
    checks = (baseline, rerank_check(len(rows), differences))
    return Verdict(checks, inconclusive=not answered)
