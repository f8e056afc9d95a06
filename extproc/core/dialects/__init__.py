"""The client dialects: one module a dialect (a reader and a writer each way, on the
base class of its task, :mod:`extproc.core.tasks`), found by task and name.

``openai_embeddings`` (embeddings); ``tei_rerank``, ``cohere_rerank`` (v1 and v2) and
``jina_rerank`` (reranking), which read their shared fields with ``rerank_fields``.
Adding a dialect is one module, its line below, its value in the policy's enum and
its tests (docs/upstreams.md, "Adding a dialect").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from extproc.core.dialects import cohere_rerank, jina_rerank, openai_embeddings, tei_rerank
from extproc.core.registry import named, table
from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.core.tasks.rerank import RerankDialect

EMBEDDINGS_DIALECTS: Final[Mapping[str, EmbeddingsDialect]] = table(openai_embeddings.DIALECT)
RERANK_DIALECTS: Final[Mapping[str, RerankDialect]] = table(
    tei_rerank.DIALECT, cohere_rerank.V1, cohere_rerank.V2, jina_rerank.DIALECT
)
OPENAI: Final = openai_embeddings.DIALECT


def rerank_dialect(name: str) -> RerankDialect:
    return named(RERANK_DIALECTS, name, "rerank dialect")


__all__ = ["EMBEDDINGS_DIALECTS", "OPENAI", "RERANK_DIALECTS", "rerank_dialect"]
