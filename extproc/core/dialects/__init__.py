"""The client dialects: one module a dialect (a reader and a writer each way, on the
base class of its task, :mod:`extproc.core.tasks`), found by task and name.

``openai_embeddings``, ``tei_embed``, ``cohere_embed`` (v1 and v2),
``ollama_embed`` (both routes) and ``jina_embed`` (embeddings), which read their
shared fields with ``embed_fields``; ``tei_rerank``, ``cohere_rerank`` (v1 and v2) and
``jina_rerank`` (reranking), which read theirs with ``rerank_fields``; both with
``json_fields``.
Adding a dialect is one module, its line below, its value in the policy's enum and
its tests (docs/upstreams.md, "Adding a dialect").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from extproc.core.dialects import (
    cohere_embed,
    cohere_rerank,
    jina_embed,
    jina_rerank,
    ollama_embed,
    openai_embeddings,
    tei_embed,
    tei_rerank,
)
from extproc.core.registry import named, table
from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.core.tasks.rerank import RerankDialect

EMBEDDINGS_DIALECTS: Final[Mapping[str, EmbeddingsDialect]] = table(
    openai_embeddings.DIALECT,
    tei_embed.DIALECT,
    cohere_embed.V1,
    cohere_embed.V2,
    ollama_embed.EMBED,
    ollama_embed.EMBEDDINGS,
    jina_embed.DIALECT,
)
RERANK_DIALECTS: Final[Mapping[str, RerankDialect]] = table(
    tei_rerank.DIALECT, cohere_rerank.V1, cohere_rerank.V2, jina_rerank.DIALECT
)
OPENAI: Final = openai_embeddings.DIALECT
# OpenAI's own paths, and the dialects that read every OpenAI request (and may so
# serve those paths).
OPENAI_PATHS: Final = frozenset(OPENAI.paths)
OPENAI_READERS: Final = frozenset(d.name for d in EMBEDDINGS_DIALECTS.values() if not d.own_shape)


def rerank_dialect(name: str) -> RerankDialect:
    return named(RERANK_DIALECTS, name, "rerank dialect")
