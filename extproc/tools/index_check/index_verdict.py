"""The verdict: can the old index stay? KEEP INDEX, RE-INDEX (with the likely cause)
or INCONCLUSIVE, from per-query measures of the four retrievals and per-text
similarities of old and new vectors (pure).

The criterion is backward compatibility as Shen et al. (2020) state it: queries
embedded by the new path, searched in the OLD index, must retrieve at least as well
as the old queries did (new/old >= old/old, nDCG@k, within ``ndcg_tolerance``); and
they must agree with today's results (mean overlap@k of new/old with old/old at least
``min_overlap``), since users see the results, not the scores. Each mean is judged by
its bootstrap confidence interval over the queries: a sample whose interval straddles
the threshold is INCONCLUSIVE, as is one of fewer than ``min_queries`` queries.

Two more things keep an index from staying although its rankings hold: new query
vectors of another length (every score against the index scales with it: a threshold
on scores, or a fusion with keyword scores, breaks), and new document vectors that
differ from the old ones (documents indexed from the cut-over on would not match
those already in it).

The verdict is the parity package's (named checks; inconclusive when the sample
cannot tell), under index-check's names for its exit codes, with the likely cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from extproc.tools.parity import Check, ExitCode, Verdict
from extproc.tools.toolkit.stats import Interval, bootstrap_interval

Floats = npt.NDArray[np.float64]
LABELS: Final = {
    ExitCode.READY: "KEEP INDEX",
    ExitCode.NOT_READY: "RE-INDEX",
    ExitCode.INCONCLUSIVE: "INCONCLUSIVE",
}


@dataclass(frozen=True)
class IndexThresholds:
    k: int = 10
    # Mean overlap@k of the kept index's answers with today's: 0.9 is at most one of
    # ten results changed on average.
    min_overlap: float = 0.9
    # nDCG@k the kept index may lose: BEIR's own run-to-run spread for one model is
    # about this size.
    ndcg_tolerance: float = 0.01
    # Fewer queries than this cannot bound a mean to a few hundredths.
    min_queries: int = 30
    # Two engines running the same model agree to about the fourth decimal.
    same_vector: float = 0.9995
    confidence: float = 0.95
    resamples: int = 2000


DEFAULT_THRESHOLDS = IndexThresholds()


@dataclass(frozen=True)
class Similarity:
    """Old against new vectors of the same texts."""

    cosines: Floats
    old_norms: Floats
    new_norms: Floats
    lengths: npt.NDArray[np.int64]  # the texts' lengths, in characters


@dataclass(frozen=True)
class IndexVerdict(Verdict):
    cause: str = ""  # what most likely makes the new vectors differ

    @property
    def label(self) -> str:
        return LABELS[self.exit_code]

    @property
    def reasons(self) -> tuple[str, ...]:
        """Each check's detail, then the warnings."""
        return tuple(check.detail for check in self.checks) + self.warnings


def interval(values: Floats, t: IndexThresholds, seed: int = 0) -> Interval:
    """The mean of per-query ``values`` and its bootstrap interval, at the thresholds'
    confidence."""
    return bootstrap_interval(values, t.confidence, t.resamples, seed)


def decide(
    overlap_new_old: Floats,
    ndcg_gain: Floats | None,
    documents: Similarity,
    queries: Similarity,
    t: IndexThresholds = DEFAULT_THRESHOLDS,
) -> IndexVerdict:
    """``overlap_new_old``: per query, overlap@k of new/old with old/old;
    ``ndcg_gain``: per query, nDCG@k of new/old minus that of old/old (None without
    judgements)."""
    if overlap_new_old.size < t.min_queries:
        detail = f"{overlap_new_old.size} queries; at least {t.min_queries} are needed"
        return IndexVerdict((Check("sample", False, detail),), inconclusive=True)
    agreement = interval(overlap_new_old, t)
    fails = agreement.high < t.min_overlap
    unsure = not fails and agreement.low < t.min_overlap
    checks = [
        Check(
            "overlap",
            not fails,
            f"overlap@{t.k} with today {agreement.mean:.3f} "
            f"({t.confidence:.0%} interval {agreement.low:.3f}-{agreement.high:.3f}; "
            f"at least {t.min_overlap} to keep)",
        )
    ]
    if ndcg_gain is not None:
        gain = interval(ndcg_gain, t, seed=1)
        lost = gain.high < -t.ndcg_tolerance
        checks.append(
            Check(
                "nDCG",
                not lost,
                f"nDCG@{t.k} new/old minus old/old {gain.mean:+.4f} "
                f"(interval {gain.low:+.4f} to {gain.high:+.4f}; at least "
                f"-{t.ndcg_tolerance} to keep)",
            )
        )
        fails = fails or lost
        unsure = unsure or (not fails and gain.low < -t.ndcg_tolerance)
    if not fails and unsure:
        return IndexVerdict(
            tuple(checks),
            ("the sample is too small to tell at these tolerances",),
            inconclusive=True,
            cause=likely_cause(documents, queries, t),
        )
    held = None if fails else _held_scores(documents, queries, t)
    if held is not None:
        checks.append(held)
    if fails or held is not None:
        return IndexVerdict(tuple(checks), cause=likely_cause(documents, queries, t))
    return IndexVerdict(tuple(checks))


def _held_scores(documents: Similarity, queries: Similarity, t: IndexThresholds) -> Check | None:
    """The rankings hold: the failed check of what else keeps the index from staying
    (the new queries' length, then the documents' vectors), or None."""
    if _norms_differ(queries):
        return Check(
            "query lengths",
            False,
            "the rankings hold, but every score against the index changes with the new "
            "queries' length (thresholds on scores break)",
        )
    low = float(np.percentile(documents.cosines, 1)) if documents.cosines.size else 1.0
    if low < t.same_vector or _norms_differ(documents):
        return Check(
            "document vectors",
            False,
            f"the rankings hold, but documents embedded from now on would differ from those "
            f"in the index (document cosine p1 {low:.6f})",
        )
    return None


def likely_cause(
    documents: Similarity, queries: Similarity, t: IndexThresholds = DEFAULT_THRESHOLDS
) -> str:
    """What most likely makes the new vectors differ, read from the per-text
    similarities; "" when they do not differ."""
    docs_low = documents.cosines < t.same_vector
    queries_low = queries.cosines < t.same_vector
    if _median(documents.cosines) < 0.9 and _median(queries.cosines) < 0.9:
        return "another model, revision or pooling: documents and queries alike differ"
    for what, sim in (("documents", documents), ("queries", queries)):
        if _norms_differ(sim):
            return (
                f"the new {what}' vectors are not normalised as the old ones "
                f"(median norm {_median(sim.new_norms):.4f} against {_median(sim.old_norms):.4f}): "
                "a cut not re-normalised, or the other way round"
            )
    if queries_low.any() and not docs_low.any():
        return "the query prompt differs: queries are embedded differently, documents alike"
    if docs_low.any() and not queries_low.any():
        if _the_longest(documents, docs_low):
            return "the cut point differs: only the longest documents' vectors differ"
        return "the document prompt differs: documents are embedded differently, queries alike"
    if docs_low.any():
        return "documents and queries are embedded differently (prompts, or the model)"
    return ""


def _median(values: Floats) -> float:
    return float(np.median(values)) if values.size else float("nan")


def _norms_differ(sim: Similarity) -> bool:
    relative = np.abs(sim.new_norms - sim.old_norms) / np.maximum(sim.old_norms, 1e-12)
    return bool(relative.size) and float(np.median(relative)) > 1e-3


def _the_longest(sim: Similarity, low: npt.NDArray[np.bool_]) -> bool:
    """Every differing text is longer than most of those that do not differ (a cut
    changes only texts over the limit; characters stand in for tokens)."""
    if low.all() or not low.any():
        return False
    return int(sim.lengths[low].min()) > float(np.median(sim.lengths[~low]))
