"""Everything index-check measures, from the two servers' vectors of the sample (pure).

Four retrievals, exact top-k: old queries in the old index (today), new queries in
the old index (cut over, index kept), new in new (re-indexed), old in new. For each,
per query: overlap@k and rank-biased overlap with today, whether the top result
changed, and with judgements recall@k and nDCG@k. Per text, old against new: cosine
and both norms (:class:`Similarity`), summarised by the toolkit's spread (min, p1,
median).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from extproc.core.vectors import FloatMatrix
from extproc.tools.index_check.index_verdict import (
    DEFAULT_THRESHOLDS,
    IndexThresholds,
    IndexVerdict,
    Similarity,
    decide,
)
from extproc.tools.index_check.rankings import top_k
from extproc.tools.index_check.retrieval_metrics import (
    ndcg_at_k,
    overlap_at_k,
    rank_biased_overlap,
    recall_at_k,
    top1_changed,
)

Floats = npt.NDArray[np.float64]
# (query vectors, index) for each retrieval, as the report names them
RETRIEVALS = (("old", "old"), ("new", "old"), ("new", "new"), ("old", "new"))


@dataclass(frozen=True)
class Retrieval:
    queries: str  # "old" or "new"
    index: str
    overlap: Floats  # per query, overlap@k with today's top k
    rbo: Floats
    top1_changed: float  # share of queries
    recall: Floats | None  # per query, with judgements
    ndcg: Floats | None
    rankings: tuple[tuple[str, ...], ...]  # per query, the top-k document ids

    @property
    def name(self) -> str:
        return f"{self.queries}/{self.index}"


@dataclass(frozen=True)
class Measures:
    k: int
    documents: Similarity
    queries: Similarity
    retrievals: tuple[Retrieval, ...]
    verdict: IndexVerdict

    def retrieval(self, queries: str, index: str) -> Retrieval:
        return next(r for r in self.retrievals if (r.queries, r.index) == (queries, index))


def similarity(old: FloatMatrix, new: FloatMatrix, texts: Sequence[str]) -> Similarity:
    """Old against new vectors of the same texts (the same width: checked by the caller)."""
    wide_old, wide_new = old.astype(np.float64), new.astype(np.float64)
    old_norms = np.linalg.norm(wide_old, axis=1)
    new_norms = np.linalg.norm(wide_new, axis=1)
    dots = np.einsum("ij,ij->i", wide_old, wide_new)
    cosines = dots / np.maximum(old_norms * new_norms, 1e-30)
    lengths = np.array([len(t) for t in texts], dtype=np.int64)
    return Similarity(cosines, old_norms, new_norms, lengths)


def measure(
    document_ids: Sequence[str],
    document_texts: Sequence[str],
    query_texts: Sequence[str],
    *,
    old: tuple[FloatMatrix, FloatMatrix],
    new: tuple[FloatMatrix, FloatMatrix],
    qrels: Sequence[Mapping[str, int]] | None,
    t: IndexThresholds = DEFAULT_THRESHOLDS,
) -> Measures:
    """``old``/``new``: (document vectors, query vectors) from each server, rows in the
    sample's order; ``qrels``: per query (same order), its judgements, or None."""
    (old_docs, old_queries), (new_docs, new_queries) = old, new
    vectors = {"old": (old_docs, old_queries), "new": (new_docs, new_queries)}
    ids = np.array(document_ids, dtype=object)
    rankings: dict[tuple[str, str], list[tuple[str, ...]]] = {}
    for q, i in RETRIEVALS:
        positions = top_k(vectors[q][1], vectors[i][0], t.k)
        rankings[(q, i)] = [tuple(ids[row]) for row in positions]
    today = rankings[("old", "old")]
    retrievals = []
    for q, i in RETRIEVALS:
        ranked = rankings[(q, i)]
        overlap = np.array([overlap_at_k(a, b, t.k) for a, b in zip(today, ranked, strict=True)])
        rbo = np.array([rank_biased_overlap(a, b) for a, b in zip(today, ranked, strict=True)])
        changed = float(np.mean([top1_changed(a, b) for a, b in zip(today, ranked, strict=True)]))
        recall = ndcg = None
        if qrels is not None:
            recall = np.array([recall_at_k(r, j, t.k) for r, j in zip(ranked, qrels, strict=True)])
            ndcg = np.array([ndcg_at_k(r, j, t.k) for r, j in zip(ranked, qrels, strict=True)])
        retrievals.append(Retrieval(q, i, overlap, rbo, changed, recall, ndcg, tuple(ranked)))
    documents = similarity(old_docs, new_docs, document_texts)
    queries = similarity(old_queries, new_queries, query_texts)
    kept = retrievals[1]
    gain = None
    if kept.ndcg is not None and retrievals[0].ndcg is not None:
        gain = kept.ndcg - retrievals[0].ndcg
    verdict = decide(kept.overlap, gain, documents, queries, t)
    return Measures(t.k, documents, queries, tuple(retrievals), verdict)
