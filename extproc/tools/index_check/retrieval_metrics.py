"""How two retrievals agree, and how well one retrieves (pure functions, per query).

Agreement with today's results: overlap@k (the share of today's top-k still in the top
k), rank-biased overlap (Webber, Moffat and Zobel 2010: top-weighted, p = 0.9 by
default, the extrapolated form for two rankings of depth k, 1 for equal rankings),
and whether the top result changed. Relevance, from graded judgements: recall@k
(relevant documents found in the top k, of those in the sample) and nDCG@k with
linear gain (``rel / log2(rank + 1)``, trec_eval's and so BEIR's), ideal order from
every judged document of the sample.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

DEFAULT_RBO_P = 0.9


def overlap_at_k(today: Sequence[str], other: Sequence[str], k: int) -> float:
    """|today[:k] ∩ other[:k]| / k."""
    if k <= 0:
        raise ValueError("k must be positive")
    return len(set(today[:k]) & set(other[:k])) / k


def rank_biased_overlap(a: Sequence[str], b: Sequence[str], p: float = DEFAULT_RBO_P) -> float:
    """Extrapolated RBO of two rankings of the same depth k:
    ``(X_k / k) p^k + (1 - p) / p * sum_{d=1..k} (X_d / d) p^d``, X_d = |a[:d] ∩ b[:d]|."""
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    k = min(len(a), len(b))
    if k == 0:
        return 1.0
    seen_a: set[str] = set()
    seen_b: set[str] = set()
    shared = 0
    total = 0.0
    for depth in range(1, k + 1):
        x, y = a[depth - 1], b[depth - 1]
        if x == y:
            shared += 1
        else:
            shared += (x in seen_b) + (y in seen_a)
        seen_a.add(x)
        seen_b.add(y)
        total += shared / depth * p**depth
    return shared / k * p**k + (1 - p) / p * total


def top1_changed(today: Sequence[str], other: Sequence[str]) -> bool:
    return bool(today) and bool(other) and today[0] != other[0]


def recall_at_k(ranking: Sequence[str], relevant: Mapping[str, int], k: int) -> float:
    """Relevant documents (grade > 0) in the top k, of all relevant ones; 0 when none."""
    wanted = {d for d, grade in relevant.items() if grade > 0}
    if not wanted:
        return 0.0
    return len(wanted & set(ranking[:k])) / len(wanted)


def ndcg_at_k(ranking: Sequence[str], relevant: Mapping[str, int], k: int) -> float:
    """DCG@k / ideal DCG@k with linear gain; 0 when nothing is relevant."""
    gains = sorted((g for g in relevant.values() if g > 0), reverse=True)
    ideal = sum(g / math.log2(rank + 2) for rank, g in enumerate(gains[:k]))
    if ideal == 0:
        return 0.0
    dcg = sum(relevant.get(d, 0) / math.log2(rank + 2) for rank, d in enumerate(ranking[:k]))
    return dcg / ideal
