"""Cohere's embed, both versions:

- v1: ``POST /v1/embed`` ``{texts, model?, input_type, embedding_types?, truncate}``
  answered ``{id, embeddings, texts, meta, response_type}``: ``embeddings`` a list of
  float vectors (``embeddings_floats``) without ``embedding_types``, else an object
  by type (``embeddings_by_type``);
- v2: ``POST /v2/embed`` ``{model, texts, input_type, embedding_types?,
  output_dimension?, max_tokens?, truncate?}`` answered by type (float unless it
  asks otherwise; ``base64`` too: the float32 bytes, little-endian).

``input_type`` is the role's field (``search_query``, ``search_document``; a
symmetric ``classification`` or ``clustering`` takes a document's prompt unless the
policy has a template of that name). ``truncate``: ``NONE`` refuses a long input,
``START`` cuts its start, ``END`` its end; unset, the model's policy decides.
``max_tokens`` cuts every input to fewer tokens than the model's limit.
``output_dimension`` is a Matryoshka size. ``meta.billed_units.input_tokens`` is the
upstream's token count. Errors ``{message}``, 400 (404 for a model it does not
serve)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from extproc.core.api_errors import ErrorClass, InvalidFieldError
from extproc.core.dialects import embed_fields as fields
from extproc.core.dialects import json_fields
from extproc.core.dialects.json_fields import optional, positive
from extproc.core.embeddings_body import EmbeddingsBody
from extproc.core.error_dialect import ErrorDialect
from extproc.core.plan import ResponsePlan
from extproc.core.quantize import quantise
from extproc.core.request_json import EmbeddingsRequest
from extproc.core.response_rewrite import dump
from extproc.core.tasks import embed
from extproc.core.vectors import FloatMatrix

SYMMETRIC: Final = frozenset({"classification", "clustering"})
# A long input's side to cut (True: its start), or None: refused.
_TRUNCATE: Final[Mapping[str, bool | None]] = {"NONE": None, "START": True, "END": False}


class CohereV1Embed(embed.EmbeddingsDialect):
    name = "cohere_v1"
    paths = ("/v1/embed",)
    version = "1"
    errors = ErrorDialect(body={"message": "{message}"}, statuses={ErrorClass.TOO_LARGE: 400})
    field_names: ClassVar[Mapping[str, str]] = {"input": "texts"}
    role_field = "input_type"
    model_required: ClassVar[bool] = False
    types: ClassVar[tuple[str, ...]] = ("float", "int8", "uint8", "binary", "ubinary")
    default_types: ClassVar[tuple[str, ...]] = ()  # v1: a plain float list

    def read_request(self, body: bytes, reading: embed.Reading) -> EmbeddingsRequest:
        read = fields.read_body(body, reading)
        doc = read.doc
        model = reading.model(doc.get("model"), required=self.model_required)
        texts = doc.get("texts")
        if texts is not None and not (
            isinstance(texts, list) and all(isinstance(t, str) for t in texts)
        ):
            raise InvalidFieldError("'texts' must be an array of strings.", param="texts")
        dimensions = doc.get("output_dimension") if self.version == "2" else None
        asked = doc.get("embedding_types")
        kinds = (
            self.default_types
            if asked is None
            else fields.embedding_types(asked, "embedding_types", self.types, model, dimensions)
        )
        truncate = optional(doc, "truncate", str)
        if truncate is not None and truncate.upper() not in _TRUNCATE:
            raise InvalidFieldError("'truncate' must be one of NONE, START, END.", param="truncate")
        cut = None
        if truncate is not None:
            left = _TRUNCATE[truncate.upper()]  # None: refused
            cut = fields.truncation(left is not None, model, left=left is True)
        answer = (("texts", tuple(texts or ())), ("types", kinds), ("scaling", model.quantization))
        return fields.checked(
            reading,
            model,
            read,
            self.field_names,
            role=fields.role(doc.get("input_type"), "input_type", model, SYMMETRIC),
            truncation=cut,
            token_limit=positive(doc, "max_tokens") if self.version == "2" else None,
            answer=answer,
        )

    def write_request(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        said = embed.PLAIN_FIELDS if self.version == "2" else embed.PLAIN_FIELDS - {"dimensions"}
        texts: Any = request.get("input")
        if not fields.says(request, said) or not _strings(texts):
            return None
        body = {
            "model": request.get("model"),
            "texts": [texts] if isinstance(texts, str) else list(texts),
            "input_type": request.get("input_type"),
            "embedding_types": list(self.default_types) or None,
            "output_dimension": request.get("dimensions"),
        }
        return {k: v for k, v in body.items() if v is not None}

    def read_answer(self, body: bytes) -> embed.ReadAnswer | None:
        doc = json_fields.read_json(body)
        if not isinstance(doc, dict) or "response_type" not in doc:
            return None
        embeddings = doc.get("embeddings")
        if isinstance(embeddings, dict):
            embeddings = embeddings.get("float")
        rows = embed.float_rows(embeddings)
        if rows is None:
            return None
        units = (
            doc.get("meta", {}).get("billed_units") if isinstance(doc.get("meta"), dict) else None
        )
        tokens = units.get("input_tokens") if isinstance(units, dict) else None
        return embed.ReadAnswer(rows, int(tokens) if isinstance(tokens, (int, float)) else None)

    def write_answer(
        self, plan: ResponsePlan, answer: EmbeddingsBody, vectors: FloatMatrix, layout: embed.Layout
    ) -> bytes:
        options = fields.options(plan)
        kinds: tuple[str, ...] = options["types"]
        embeddings: Any
        if kinds:
            embeddings = {kind: quantise(vectors, kind, options["scaling"]) for kind in kinds}
            response_type = "embeddings_by_type"
        else:
            embeddings = list(vectors)
            response_type = "embeddings_floats"
        meta: dict[str, Any] = {"api_version": {"version": self.version}}
        if answer.prompt_tokens is not None:
            meta["billed_units"] = {"input_tokens": answer.prompt_tokens}
        return dump(
            {
                "id": str(uuid.uuid4()),
                "embeddings": embeddings,
                "texts": list(options["texts"]),
                "meta": meta,
                "response_type": response_type,
            }
        )


class CohereV2Embed(CohereV1Embed):
    name = "cohere_v2"
    paths = ("/v2/embed",)
    version = "2"
    field_names: ClassVar[Mapping[str, str]] = {
        "input": "texts",
        "dimensions": "output_dimension",
    }
    model_required = True
    types = ("float", "int8", "uint8", "binary", "ubinary", "base64")
    default_types = ("float",)


def _strings(value: Any) -> bool:
    """A text or a list of them: what Cohere's ``texts`` can carry."""
    if isinstance(value, str):
        return True
    return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)


V1 = CohereV1Embed()
V2 = CohereV2Embed()
