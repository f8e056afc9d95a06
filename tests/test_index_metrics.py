"""index-check's pure parts against values worked out by hand: the retrieval
measures (ties included), exact top-k, the BEIR files, and the verdict with its
likely cause."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

from extproc.tools.index_check.beir_files import (
    SampleError,
    Text,
    build_sample,
    parse_qrels,
    parse_texts,
    read_lines,
)
from extproc.tools.index_check.index_measures import measure
from extproc.tools.index_check.index_verdict import (
    IndexThresholds,
    Similarity,
    decide,
    interval,
    likely_cause,
)
from extproc.tools.index_check.rankings import top_k
from extproc.tools.index_check.retrieval_metrics import (
    ndcg_at_k,
    overlap_at_k,
    rank_biased_overlap,
    recall_at_k,
    top1_changed,
)

# --------------------------------------------------------------------- measures


def test_overlap_at_k() -> None:
    assert overlap_at_k(list("abcd"), list("dcba"), 4) == 1.0
    assert overlap_at_k(list("abcd"), list("abxy"), 4) == 0.5
    assert overlap_at_k(list("abcd"), list("xbcd"), 2) == 0.5  # only the top 2 count
    with pytest.raises(ValueError):
        overlap_at_k(["a"], ["a"], 0)


def test_rank_biased_overlap_by_hand() -> None:
    """p = 0.5, depth 2: X_1 = 0 and X_2 = 2 for ab / ba, so
    RBO_ext = (2/2)(0.25) + (0.5/0.5)(0*0.5 + (2/2)*0.25) = 0.5."""
    assert rank_biased_overlap(["a", "b"], ["b", "a"], p=0.5) == pytest.approx(0.5)
    # identical rankings: 1 whatever p
    assert rank_biased_overlap(list("abcde"), list("abcde"), p=0.9) == pytest.approx(1.0)
    # disjoint: 0
    assert rank_biased_overlap(list("abc"), list("xyz")) == 0.0
    # ab / ac, p = 0.5: X_1 = 1, X_2 = 1: (1/2)(0.25) + (0.5*1 + 0.25/2) = 0.75
    assert rank_biased_overlap(["a", "b"], ["a", "c"], p=0.5) == pytest.approx(0.75)
    # top-weighted: a change at rank 1 costs more than one at rank 3
    head = rank_biased_overlap(list("abc"), list("xbc"))
    tail = rank_biased_overlap(list("abc"), list("abx"))
    assert head < tail < 1


def test_top1_and_recall() -> None:
    assert top1_changed(["a", "b"], ["b", "a"]) and not top1_changed(["a"], ["a", "b"])
    relevant = {"a": 2, "c": 1, "z": 0}  # a grade of 0 is not relevant
    assert recall_at_k(["a", "b", "c"], relevant, 2) == 0.5
    assert recall_at_k(["a", "b", "c"], relevant, 3) == 1.0
    assert recall_at_k(["a"], {}, 1) == 0.0


def test_ndcg_by_hand() -> None:
    """Linear gain: ranking b, a with a = 2, b = 1:
    DCG = 1/log2(2) + 2/log2(3); ideal = 2/log2(2) + 1/log2(3)."""
    relevant = {"a": 2, "b": 1}
    dcg = 1 + 2 / math.log2(3)
    ideal = 2 + 1 / math.log2(3)
    assert ndcg_at_k(["b", "a"], relevant, 10) == pytest.approx(dcg / ideal)
    assert ndcg_at_k(["a", "b"], relevant, 10) == pytest.approx(1.0)
    assert ndcg_at_k(["x", "y"], relevant, 10) == 0.0
    assert ndcg_at_k(["a"], {}, 10) == 0.0
    # the ideal counts judged documents beyond k as well as the cut-off
    assert ndcg_at_k(["a"], {"a": 1, "b": 1}, 1) == pytest.approx(1.0)


def test_top_k_exact_and_ties() -> None:
    documents = np.array([[1, 0], [0, 1], [1, 0], [0.6, 0.8]], dtype=np.float32)
    queries = np.array([[1, 0], [0, 1]], dtype=np.float32)
    ranking = top_k(queries, documents, 3)
    # rows 0 and 2 tie for the first query: the earlier one first
    assert ranking[0].tolist() == [0, 2, 3]
    assert ranking[1].tolist() == [1, 3, 0]
    assert top_k(queries, documents, 10).shape == (2, 4)
    with pytest.raises(ValueError):
        top_k(queries, np.zeros((2, 3), dtype=np.float32), 1)


# --------------------------------------------------------------------- files


def test_beir_files(tmp_path: Path) -> None:
    corpus = parse_texts(
        ['{"_id": "d1", "title": "T", "text": "one"}', "", '{"_id": 2, "text": "two"}'], "c"
    )
    assert corpus == [Text("d1", "T one"), Text("2", "two")]
    qrels = parse_qrels(["query-id\tcorpus-id\tscore", "q1\td1\t1", "q1\t2\t0"], "q")
    assert qrels == {"q1": {"d1": 1}}
    queries = [Text("q1", "where"), Text("q2", "what")]
    sample = build_sample(corpus, queries, qrels, sample=1)
    assert [d.id for d in sample.documents] == ["d1"] and [q.id for q in sample.queries] == ["q1"]
    assert sample.corpus_size == 2
    for lines, says in (
        (['{"_id": "a", "text": "x"}', '{"_id": "a", "text": "y"}'], "appears twice"),
        (["not json"], "not JSON"),
        (['{"_id": "", "text": "x"}'], "_id"),
        (['{"_id": "a", "text": ""}'], "no text"),
    ):
        with pytest.raises(SampleError, match=says):
            parse_texts(lines, "c")
    with pytest.raises(SampleError, match="not an integer"):
        parse_qrels(["q\td\thigh"], "q")
    with pytest.raises(SampleError, match="document ids the corpus lacks"):
        build_sample(corpus, queries, {"q1": {"nope": 1}}, sample=None)
    with pytest.raises(SampleError, match="query ids"):
        build_sample(corpus, queries, {"q9": {"d1": 1}}, sample=None)
    with pytest.raises(SampleError, match="no document"):
        build_sample([], queries, None, sample=None)
    with pytest.raises(SampleError, match="no query"):
        build_sample(corpus, [], None, sample=None)
    fifo = tmp_path / "fifo"

    os.mkfifo(fifo)
    with pytest.raises(SampleError, match="FIFO"):
        read_lines(fifo, "a corpus")
    with pytest.raises(SampleError):
        read_lines(tmp_path / "missing.jsonl", "a corpus")


# --------------------------------------------------------------------- verdict


def similarity(
    cosines: list[float], *, new_norm: float = 1.0, lengths: list[int] | None = None
) -> Similarity:
    n = len(cosines)
    return Similarity(
        np.array(cosines),
        np.ones(n),
        np.full(n, new_norm),
        np.array(lengths if lengths is not None else [100] * n, dtype=np.int64),
    )


SAME = similarity([1.0] * 50)


def test_keep_reindex_inconclusive() -> None:
    t = IndexThresholds()
    keep = decide(np.full(50, 0.98), np.zeros(50), SAME, SAME, t)
    assert keep.label == "KEEP INDEX" and keep.exit_code == 0
    worse = decide(np.full(50, 0.98), np.full(50, -0.05), SAME, similarity([0.9] * 50), t)
    assert worse.label == "RE-INDEX" and worse.exit_code == 1
    assert "query prompt" in worse.cause
    apart = decide(np.full(50, 0.5), None, SAME, similarity([0.9] * 50), t)
    assert apart.label == "RE-INDEX"
    few = decide(np.full(5, 1.0), None, SAME, SAME, t)
    assert few.label == "INCONCLUSIVE" and few.exit_code == 2
    # a mean right at the threshold with a wide spread: the interval straddles it
    rng = np.random.default_rng(3)
    noisy = np.clip(0.9 + rng.normal(0, 0.1, 40), 0, 1)
    assert decide(noisy, None, SAME, SAME, t).label == "INCONCLUSIVE"


def test_interval_brackets_the_mean() -> None:
    values = np.linspace(0, 1, 101)
    i = interval(values, IndexThresholds())
    assert i.low < i.mean < i.high and i.mean == pytest.approx(0.5)
    assert interval(np.full(10, 0.3), IndexThresholds()).low == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("documents", "queries", "says"),
    [
        (similarity([0.5] * 10), similarity([0.6] * 10), "another model"),
        (similarity([1.0] * 10, new_norm=0.4), SAME, "not normalised"),
        (SAME, similarity([0.8] * 10), "query prompt"),
        (similarity([0.9] * 10), SAME, "document prompt"),
        (similarity([1.0] * 8 + [0.99] * 2, lengths=[100] * 8 + [5000] * 2), SAME, "cut point"),
        (SAME, SAME, ""),
    ],
)
def test_likely_cause(documents: Similarity, queries: Similarity, says: str) -> None:
    cause = likely_cause(documents, queries)
    assert (says in cause) if says else cause == ""


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def test_measure_the_four_retrievals() -> None:
    """Synthetic vectors: 40 queries each placed next to its own document. The same
    vectors keep the index; queries moved far from their documents (as a dropped
    prompt moves them) make the kept index retrieve worse, and the cause is named."""
    rng = np.random.default_rng(0)
    docs = unit(rng.normal(size=(200, 16)))
    queries = unit(docs[:40] + rng.normal(scale=0.05, size=(40, 16)))
    ids = [f"d{i}" for i in range(200)]
    texts = ["text"] * 200
    qrels = [{f"d{i}": 1} for i in range(40)]
    same = measure(ids, texts, ["q"] * 40, old=(docs, queries), new=(docs, queries), qrels=qrels)
    assert same.verdict.label == "KEEP INDEX"
    today = same.retrieval("old", "old")
    assert today.overlap.min() == 1.0 and today.top1_changed == 0.0
    assert today.ndcg is not None and today.ndcg.mean() > 0.9
    moved = unit(rng.normal(size=(40, 16)))
    worse = measure(ids, texts, ["q"] * 40, old=(docs, queries), new=(docs, moved), qrels=qrels)
    assert worse.verdict.label == "RE-INDEX"
    assert "query prompt" in worse.verdict.cause
    kept = worse.retrieval("new", "old")
    assert kept.ndcg is not None and kept.ndcg.mean() < 0.5
    # both re-embedded alike: re-indexing restores what the kept index loses
    assert worse.retrieval("new", "new").overlap.mean() < 1.0


def test_rankings_that_hold_are_not_enough() -> None:
    """Queries of another length keep every ranking (a scaled query ranks alike) but
    change every score; documents that differ would not match the index from now on."""
    shorter = decide(np.full(50, 1.0), np.zeros(50), SAME, similarity([1.0] * 50, new_norm=0.5))
    assert shorter.label == "RE-INDEX" and "not normalised" in shorter.cause
    assert "score" in shorter.reasons[-1]
    documents = decide(np.full(50, 1.0), None, similarity([0.95] * 50), SAME)
    assert documents.label == "RE-INDEX" and "document prompt" in documents.cause
