"""Exact top-k retrieval over the sample (numpy, brute force): what a vector index
returns for a query, without an approximate index's own noise.

Scores are inner products, as an index of unit vectors is searched (cosine and inner
product agree there; where the new vectors are not unit length, the inner product is
what an index built for unit vectors would rank by). Ties go to the document that
comes first in the sample, so a ranking is a function of the scores alone.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Matrix = npt.NDArray[np.float32]
Ranking = npt.NDArray[np.int64]  # (queries, k) document positions, best first

_QUERY_BLOCK = 256  # queries scored at a time: bounds the score matrix's memory


def top_k(queries: Matrix, documents: Matrix, k: int) -> Ranking:
    """For each query row, the positions of the ``k`` best-scoring document rows."""
    if queries.shape[1] != documents.shape[1]:
        raise ValueError(
            f"queries have {queries.shape[1]} dimensions, documents {documents.shape[1]}"
        )
    k = min(k, documents.shape[0])
    out = np.empty((queries.shape[0], k), dtype=np.int64)
    for start in range(0, queries.shape[0], _QUERY_BLOCK):
        scores = queries[start : start + _QUERY_BLOCK] @ documents.T
        # stable sort on the negated scores: equal scores keep document order
        order = np.argsort(-scores, axis=1, kind="stable")
        out[start : start + _QUERY_BLOCK] = order[:, :k]
    return out
