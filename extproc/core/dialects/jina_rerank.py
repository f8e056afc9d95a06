"""Jina's rerank: ``POST /v1/rerank`` ``{model, query, documents: [str or {text}],
top_n, return_documents}`` (documents come back unless the client says not)
answered ``{model, usage, results: [{index, relevance_score, document?: {text}}]}``."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from extproc.core.dialects import json_fields
from extproc.core.dialects import rerank_fields as fields
from extproc.core.tasks.rerank import Ranked, Ranking


class JinaRerank(fields.DocumentsRerank):
    name = "jina"
    paths = ("/v1/rerank",)
    returns_documents = True

    def write_answer(
        self, ranked: Sequence[Ranked], *, model: str, prompt_tokens: int | None
    ) -> bytes:
        usage = {"total_tokens": prompt_tokens} if prompt_tokens is not None else {}
        return orjson.dumps({"model": model, "usage": usage, "results": fields.results(ranked)})

    def read_answer(self, body: bytes) -> Ranking | None:
        doc = json_fields.read_json(body)
        if not isinstance(doc, dict) or "meta" in doc:
            return None
        return fields.ranking(doc.get("results"), "relevance_score")


DIALECT = JinaRerank()
