"""Hugging Face text-embeddings-inference's rerank: ``POST /rerank`` ``{query, texts,
raw_scores, return_text, truncate, truncation_direction}`` answered ``[{index, score,
text?}]``, best first. Its requests name no model: a path serves one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import orjson

from extproc.core.api_errors import InvalidFieldError
from extproc.core.dialects import json_fields
from extproc.core.dialects import rerank_fields as fields
from extproc.core.tasks.rerank import Ranked, Ranking, RerankDialect, RerankRequest

_DIRECTIONS = ("Left", "Right", "left", "right")


class TeiRerank(RerankDialect):
    name = "tei"
    paths = ("/rerank",)
    names_model = False
    client_options: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "raw scores": {"raw_scores": True},
        "with text": {"return_text": True},
    }
    cut_option: ClassVar[Mapping[str, Any]] = {"truncate": True}

    def read_request(self, body: bytes, max_documents: int) -> RerankRequest:
        doc = fields.json_object(body)
        query = fields.query(doc)
        texts = fields.documents(doc, "texts", max_documents, objects=False)
        direction = json_fields.optional(doc, "truncation_direction", str)
        if direction is not None and direction not in _DIRECTIONS:
            raise InvalidFieldError(
                "'truncation_direction' must be 'Left' or 'Right'.", param="truncation_direction"
            )
        return RerankRequest(
            model=None,
            query=query,
            documents=texts,
            return_documents=json_fields.optional(doc, "return_text", bool),
            raw_scores=json_fields.optional(doc, "raw_scores", bool),
            truncate=json_fields.optional(doc, "truncate", bool),
            truncate_left=direction in ("Left", "left"),
        )

    def write_answer(
        self, ranked: Sequence[Ranked], *, model: str, prompt_tokens: int | None
    ) -> bytes:
        return orjson.dumps(
            [
                {"index": r.index, "score": r.score}
                if r.text is None
                else {"index": r.index, "score": r.score, "text": r.text}
                for r in ranked
            ]
        )

    def write_request(
        self, model: str, query: str, documents: Sequence[str], **options: Any
    ) -> dict[str, Any]:
        return {"query": query, "texts": list(documents), **options}

    def read_answer(self, body: bytes) -> Ranking | None:
        return fields.ranking(json_fields.read_json(body), "score")


DIALECT = TeiRerank()
