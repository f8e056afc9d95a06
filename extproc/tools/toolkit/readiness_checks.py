"""Ready or not, by the vector parity section and the contract table (pure).

Failures (exit 1, "not ready"):
- the candidate's parity requests fail, or it embeds fewer documents;
- a dimension mismatch on the documents;
- min cosine over the documents < ``min_cosine``;
- a contract row for a valid request fails: another status class, another number,
  length or encoding of vectors, or vectors below ``min_cosine`` (e.g. a dropped query
  instruction);
- any further failed check the caller adds (the probe's latency errors).

Inconclusive (exit 2): the baseline itself did not answer the parity requests, so
there is nothing to compare against.

Warnings (reported, exit status unchanged): token totals that differ, queries without
instruction below ``min_cosine``, bad requests answered in another status class, valid
probes that both servers refuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from extproc.tools.parity import Check, Thresholds, Verdict
from extproc.tools.toolkit.contract_table import ContractRow
from extproc.tools.toolkit.vector_parity import ParityResult

# Offline, on a fixed corpus, the probe can afford a stricter bar than live traffic.
PROBE_THRESHOLDS: Final = Thresholds(min_cosine=0.9995)


def _parity_checks(parity: ParityResult, t: Thresholds) -> tuple[list[Check], list[str], bool]:
    failures: list[Check] = []
    warnings: list[str] = []
    base, cand = parity.baseline, parity.candidate
    inconclusive = bool(base.errors) or base.embedded < parity.documents_total
    if inconclusive:
        first = base.errors[0] if base.errors else "missing vectors"
        failures.append(
            Check(
                "parity",
                False,
                f"the baseline embedded {base.embedded}/{parity.documents_total} "
                f"documents ({first})",
            )
        )
    if cand.errors or cand.embedded < parity.documents_total:
        first = cand.errors[0] if cand.errors else "missing vectors"
        failures.append(
            Check(
                "parity",
                False,
                f"the candidate embedded {cand.embedded}/{parity.documents_total} "
                f"documents ({first})",
            )
        )
    if (
        base.dimension is not None
        and cand.dimension is not None
        and base.dimension != cand.dimension
    ):
        failures.append(Check("parity", False, f"dimension {base.dimension} vs {cand.dimension}"))
    docs = parity.documents
    if docs.spread is not None and docs.spread.min < t.min_cosine:
        worst = docs.ids[docs.cosines.index(docs.spread.min)]
        failures.append(
            Check(
                "parity",
                False,
                f"min cosine on documents {docs.spread.min:.6f} < {t.min_cosine} ({worst})",
            )
        )
    elif docs.spread is None and not inconclusive:
        failures.append(Check("parity", False, "no document could be compared"))
    if docs.incomparable:
        failures.append(
            Check(
                "parity", False, f"{len(docs.incomparable)} documents have vectors of other lengths"
            )
        )
    if base.prompt_tokens != cand.prompt_tokens and base.prompt_tokens is not None:
        warnings.append(
            f"parity: document prompt tokens {base.prompt_tokens} vs {cand.prompt_tokens}"
        )
    queries = parity.queries
    if queries.spread is not None and queries.spread.min < t.min_cosine:
        warnings.append(
            f"parity: min cosine on queries without instruction {queries.spread.min:.6f} "
            f"< {t.min_cosine}"
        )
    return failures, warnings, inconclusive


def comparison_verdict(
    parity: ParityResult,
    rows: Sequence[ContractRow],
    thresholds: Thresholds = PROBE_THRESHOLDS,
    *,
    more: Sequence[Check] = (),
) -> Verdict:
    """Every failed check, named by section ("parity", "contract"), then ``more``."""
    failures, warnings, inconclusive = _parity_checks(parity, thresholds)
    for row in rows:
        if row.severity == "fail":
            failures.append(Check("contract", False, f"{row.title}: {'; '.join(row.notes)}"))
        elif row.severity == "warn":
            warnings.append(f"contract: {row.title}: {'; '.join(row.notes)}")
    failures += [check for check in more if not check.ok]
    return Verdict(tuple(failures), warnings=tuple(warnings), inconclusive=inconclusive)
