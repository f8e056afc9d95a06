"""Vector parity: do both servers give the same vectors for the documents? Section 1
of the probe's report and the first half of learn's verification.

The corpus documents in batches of 8 with float encoding,
then per server the dimension, the L2 norm of the first vector and the sum of
``usage.prompt_tokens``, and the per-document cosine between the two servers. The
queries are also embedded as they are (no ``input_type``), for the "without
instructions" comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from extproc.tools.parity import Answer, cosine
from extproc.tools.toolkit.corpus import Item, batches
from extproc.tools.toolkit.embeddings_client import EmbeddingsClient
from extproc.tools.toolkit.stats import Spread, Vector, l2_norm, spread

BATCH_SIZE = 8


@dataclass(frozen=True)
class SideAnswers:
    """What one server answered for a list of items (vectors keyed by item id)."""

    vectors: dict[str, Vector]
    prompt_tokens: int | None  # None if any batch had no usage
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class SideSummary:
    dimension: int | None
    first_norm: float | None
    prompt_tokens: int | None
    embedded: int
    errors: tuple[str, ...]


@dataclass(frozen=True)
class CosineSet:
    """Per-item cosines between the servers, for the items both embedded."""

    ids: tuple[str, ...]
    cosines: tuple[float, ...]
    spread: Spread | None
    missing: tuple[str, ...] = ()
    incomparable: tuple[str, ...] = field(default=())  # different lengths


@dataclass(frozen=True)
class ParityResult:
    documents_total: int
    baseline: SideSummary
    candidate: SideSummary
    documents: CosineSet
    queries: CosineSet


def embed_items(
    client: EmbeddingsClient, model: str, items: Sequence[Item], batch_size: int = BATCH_SIZE
) -> SideAnswers:
    """Embed ``items`` in batches (float encoding); errors are collected, not raised."""
    vectors: dict[str, Vector] = {}
    errors: list[str] = []
    tokens: int | None = 0
    for batch in batches(items, batch_size):
        body = {"model": model, "input": [item.text for item in batch], "encoding_format": "float"}
        result = client.post_json(body)
        label = f"batch {batch[0].id}..{batch[-1].id}"
        if result.status != 200:
            errors.append(f"{label}: {result.status or result.error}")
            tokens = None
            continue
        answer = Answer.read(result.status, result.body, client.dialect)
        if answer.vectors is None:
            errors.append(f"{label}: {answer.problem}")
            tokens = None
            continue
        if answer.count != len(batch):
            errors.append(f"{label}: {answer.count} vectors for {len(batch)} inputs")
            tokens = None
            continue
        for item, vector in zip(batch, answer.vectors, strict=True):
            vectors[item.id] = vector.astype(np.float64)
        if tokens is not None and answer.prompt_tokens is not None:
            tokens += answer.prompt_tokens
        else:
            tokens = None
    return SideAnswers(vectors=vectors, prompt_tokens=tokens, errors=tuple(errors))


def summarize_side(answers: SideAnswers, ids: Sequence[str]) -> SideSummary:
    dims = sorted({int(v.shape[0]) for v in answers.vectors.values()})
    first = answers.vectors.get(ids[0]) if ids else None
    return SideSummary(
        dimension=dims[0] if len(dims) == 1 else None,
        first_norm=l2_norm(first) if first is not None else None,
        prompt_tokens=answers.prompt_tokens,
        embedded=len(answers.vectors),
        errors=answers.errors + ((f"mixed dimensions {dims}",) if len(dims) > 1 else ()),
    )


def compare_vectors(
    ids: Sequence[str], baseline: dict[str, Vector], candidate: dict[str, Vector]
) -> CosineSet:
    """Cosine per id, for ids both sides have with equal lengths."""
    kept: list[str] = []
    cosines: list[float] = []
    missing: list[str] = []
    incomparable: list[str] = []
    for item_id in ids:
        a, b = baseline.get(item_id), candidate.get(item_id)
        if a is None or b is None:
            missing.append(item_id)
            continue
        try:
            value = cosine(a, b)
        except ValueError:
            incomparable.append(item_id)
            continue
        kept.append(item_id)
        cosines.append(value)
    return CosineSet(
        ids=tuple(kept),
        cosines=tuple(cosines),
        spread=spread(cosines) if cosines else None,
        missing=tuple(missing),
        incomparable=tuple(incomparable),
    )


def compare_parity(
    *,
    doc_ids: Sequence[str],
    query_ids: Sequence[str],
    baseline_docs: SideAnswers,
    candidate_docs: SideAnswers,
    baseline_queries: SideAnswers,
    candidate_queries: SideAnswers,
) -> ParityResult:
    """The pure part of the parity section."""
    return ParityResult(
        documents_total=len(doc_ids),
        baseline=summarize_side(baseline_docs, doc_ids),
        candidate=summarize_side(candidate_docs, doc_ids),
        documents=compare_vectors(doc_ids, baseline_docs.vectors, candidate_docs.vectors),
        queries=compare_vectors(query_ids, baseline_queries.vectors, candidate_queries.vectors),
    )


def run_parity(
    baseline: EmbeddingsClient,
    candidate: EmbeddingsClient,
    model: str,
    documents: Sequence[Item],
    queries: Sequence[Item],
) -> ParityResult:
    base_docs = embed_items(baseline, model, documents)
    cand_docs = embed_items(candidate, model, documents)
    base_queries = embed_items(baseline, model, queries)
    cand_queries = embed_items(candidate, model, queries)
    return compare_parity(
        doc_ids=[d.id for d in documents],
        query_ids=[q.id for q in queries],
        baseline_docs=base_docs,
        candidate_docs=cand_docs,
        baseline_queries=base_queries,
        candidate_queries=cand_queries,
    )
