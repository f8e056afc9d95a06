"""Cohere's rerank, both versions:

- v1: ``POST /v1/rerank`` ``{model?, query, documents: [str or {text}], top_n,
  return_documents}`` answered ``{id, results: [{index, relevance_score, document?:
  {text}}], meta}``;
- v2: ``POST /v2/rerank`` ``{model, query, documents: [str], top_n,
  max_tokens_per_doc}`` answered ``{id, results: [{index, relevance_score}], meta}``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import orjson

from extproc.core.dialects import json_fields
from extproc.core.dialects import rerank_fields as fields
from extproc.core.tasks.rerank import Ranked, Ranking


class CohereV1Rerank(fields.DocumentsRerank):
    name = "cohere_v1"
    paths = ("/v1/rerank",)
    model_required = False
    version = "1"

    def write_answer(
        self, ranked: Sequence[Ranked], *, model: str, prompt_tokens: int | None
    ) -> bytes:
        meta = {"api_version": {"version": self.version}}
        return orjson.dumps(
            {"id": str(uuid.uuid4()), "results": fields.results(ranked), "meta": meta}
        )

    def read_answer(self, body: bytes) -> Ranking | None:
        doc = json_fields.read_json(body)
        if not isinstance(doc, dict) or "meta" not in doc:
            return None
        return fields.ranking(doc.get("results"), "relevance_score")


class CohereV2Rerank(CohereV1Rerank):
    name = "cohere_v2"
    paths = ("/v2/rerank",)
    client_options: ClassVar[Mapping[str, Mapping[str, Any]]] = {"top_n 2": {"top_n": 2}}
    model_required = True
    objects = False
    per_doc = True
    version = "2"


V1 = CohereV1Rerank()
V2 = CohereV2Rerank()
