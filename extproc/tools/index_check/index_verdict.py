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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Label = Literal["KEEP INDEX", "RE-INDEX", "INCONCLUSIVE"]
EXIT_CODES: dict[Label, int] = {"KEEP INDEX": 0, "RE-INDEX": 1, "INCONCLUSIVE": 2}


@dataclass(frozen=True)
class Thresholds:
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


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float


@dataclass(frozen=True)
class Similarity:
    """Old against new vectors of the same texts."""

    cosines: Floats
    old_norms: Floats
    new_norms: Floats
    lengths: npt.NDArray[np.int64]  # the texts' lengths, in characters


@dataclass(frozen=True)
class Verdict:
    label: Label
    reasons: tuple[str, ...]
    cause: str = ""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.label]


def interval(values: Floats, t: Thresholds, seed: int = 0) -> Interval:
    """The mean of per-query ``values`` and its percentile bootstrap interval."""
    if values.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, values.size, size=(t.resamples, values.size))
    means = values[picks].mean(axis=1)
    tail = (1 - t.confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Interval(float(values.mean()), float(low), float(high))


def decide(
    overlap_new_old: Floats,
    ndcg_gain: Floats | None,
    documents: Similarity,
    queries: Similarity,
    t: Thresholds = DEFAULT_THRESHOLDS,
) -> Verdict:
    """``overlap_new_old``: per query, overlap@k of new/old with old/old;
    ``ndcg_gain``: per query, nDCG@k of new/old minus that of old/old (None without
    judgements)."""
    if overlap_new_old.size < t.min_queries:
        return Verdict(
            "INCONCLUSIVE",
            (f"{overlap_new_old.size} queries; at least {t.min_queries} are needed",),
        )
    agreement = interval(overlap_new_old, t)
    reasons = [
        f"overlap@{t.k} with today {agreement.mean:.3f} "
        f"({t.confidence:.0%} interval {agreement.low:.3f}-{agreement.high:.3f}; "
        f"at least {t.min_overlap} to keep)"
    ]
    fails = agreement.high < t.min_overlap
    unsure = not fails and agreement.low < t.min_overlap
    if ndcg_gain is not None:
        gain = interval(ndcg_gain, t, seed=1)
        reasons.append(
            f"nDCG@{t.k} new/old minus old/old {gain.mean:+.4f} "
            f"(interval {gain.low:+.4f} to {gain.high:+.4f}; at least -{t.ndcg_tolerance} to keep)"
        )
        fails = fails or gain.high < -t.ndcg_tolerance
        unsure = unsure or (not fails and gain.low < -t.ndcg_tolerance)
    if fails:
        return Verdict("RE-INDEX", tuple(reasons), likely_cause(documents, queries, t))
    if unsure:
        reasons.append("the sample is too small to tell at these tolerances")
        return Verdict("INCONCLUSIVE", tuple(reasons), likely_cause(documents, queries, t))
    if _norms_differ(queries):
        reasons.append(
            "the rankings hold, but every score against the index changes with the new "
            "queries' length (thresholds on scores break)"
        )
        return Verdict("RE-INDEX", tuple(reasons), likely_cause(documents, queries, t))
    low = float(np.percentile(documents.cosines, 1)) if documents.cosines.size else 1.0
    if low < t.same_vector or _norms_differ(documents):
        reasons.append(
            f"the rankings hold, but documents embedded from now on would differ from those "
            f"in the index (document cosine p1 {low:.6f})"
        )
        return Verdict("RE-INDEX", tuple(reasons), likely_cause(documents, queries, t))
    return Verdict("KEEP INDEX", tuple(reasons))


def likely_cause(
    documents: Similarity, queries: Similarity, t: Thresholds = DEFAULT_THRESHOLDS
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
