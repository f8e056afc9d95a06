"""Hugging Face text-embeddings-inference's embeddings: ``POST /embed`` (and ``POST /``,
where ``huggingface_hub``'s ``InferenceClient(base_url=...).feature_extraction``
posts) ``{inputs, normalize, truncate, truncation_direction, prompt_name,
dimensions}`` answered ``[[float, ...], ...]``, one vector an input even for one
string. Its requests name no model: a path serves one. ``normalize: false`` asks for
the vectors as the model pools them; ``truncate: false`` refuses a long input (413),
``true`` cuts it on ``truncation_direction``'s side; unset, the model's policy
decides (TEI's own default is the server's ``--auto-truncate``). ``prompt_name`` is
the role's field. Errors ``{error, error_type}``: 413 for what is too large or too
long, 400 (``Empty``) for no input or an empty one, 422 for the rest."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from extproc.core.api_errors import ErrorClass, InvalidFieldError
from extproc.core.dialects import embed_fields as fields
from extproc.core.dialects import json_fields
from extproc.core.dialects.json_fields import optional
from extproc.core.embeddings_body import EmbeddingsBody
from extproc.core.error_dialect import ErrorDialect, ErrorShape
from extproc.core.plan import ResponsePlan
from extproc.core.request_json import EmbeddingsRequest
from extproc.core.response_rewrite import dump
from extproc.core.tasks import embed
from extproc.core.vectors import FloatMatrix

_DIRECTIONS = {"Left": True, "left": True, "Right": False, "right": False}


class TeiEmbed(embed.EmbeddingsDialect):
    name = "tei"
    paths = ("/embed", "/")
    names_model = False
    errors = ErrorDialect(
        shape=ErrorShape.TEI,
        statuses={
            ErrorClass.MALFORMED: 422,
            ErrorClass.INVALID: 422,
            ErrorClass.UNKNOWN_MODEL: 422,
            ErrorClass.TOO_LARGE: 413,
            ErrorClass.TOO_LONG: 413,
            ErrorClass.TOO_MANY_INPUTS: 413,
        },
        status_by_reason={"invalid.empty": 400},  # TEI's "Empty"
    )
    field_names: ClassVar[Mapping[str, str]] = {"input": "inputs", "dimensions": "dimensions"}
    role_field = "prompt_name"

    def read_request(self, body: bytes, reading: embed.Reading) -> EmbeddingsRequest:
        read = fields.read_body(body, reading)
        doc = read.doc
        model = reading.model(None, required=False)
        direction = optional(doc, "truncation_direction", str)
        if direction is not None and direction not in _DIRECTIONS:
            raise InvalidFieldError(
                "'truncation_direction' must be 'Left' or 'Right'.", param="truncation_direction"
            )
        inputs = doc.get("inputs")
        if inputs == "" or (isinstance(inputs, list) and (not inputs or "" in inputs)):
            raise InvalidFieldError("`inputs` cannot be empty", param="inputs", reason="empty")
        normalize = optional(doc, "normalize", bool)
        left = _DIRECTIONS.get(direction or "") is True
        return fields.checked(
            reading,
            model,
            read,
            self.field_names,
            role=optional(doc, "prompt_name", str),
            truncation=fields.truncation(optional(doc, "truncate", bool), model, left=left),
            raw_vectors=None if normalize is None else not normalize,
        )

    def write_request(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        if not fields.says(request, embed.PLAIN_FIELDS):
            return None
        body = {"inputs": request.get("input"), "prompt_name": request.get("input_type")}
        body["dimensions"] = request.get("dimensions")
        return {k: v for k, v in body.items() if v is not None}

    def read_answer(self, body: bytes) -> embed.ReadAnswer | None:
        rows = embed.float_rows(json_fields.read_json(body))
        return None if rows is None else embed.ReadAnswer(rows)

    def write_answer(
        self, plan: ResponsePlan, answer: EmbeddingsBody, vectors: FloatMatrix, layout: embed.Layout
    ) -> bytes:
        return dump(list(vectors))


DIALECT = TeiEmbed()
