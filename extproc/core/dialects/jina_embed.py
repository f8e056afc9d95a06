"""Jina's embeddings: ``POST /v1/embeddings``, OpenAI's request and answer with more
fields: ``task`` (the role's field: ``retrieval.query``, ``retrieval.passage``; a
symmetric ``text-matching``, ``classification`` or ``separation`` takes a
document's prompt unless the policy has a template of that name), ``input`` items
that may be ``{"text"}`` objects, ``embedding_type`` (``float``, ``base64``,
``binary``, ``ubinary``, or a list of them: each item's ``embedding`` is then an
object by type), ``normalized`` (false: the vectors as the model pools them),
``truncate`` (false refuses a long input, true cuts its end) and ``late_chunking``
(refused: the upstream embeds each input alone).

Every OpenAI request reads here as on OpenAI's path, and one without Jina's fields
is answered as OpenAI's is: a Jina path at ``/v1/embeddings`` serves both kinds of
client. Errors: the policy's, as OpenAI's clients get them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar, Final

from extproc.core.api_errors import InvalidFieldError
from extproc.core.dialects import embed_fields as fields
from extproc.core.dialects.json_fields import optional
from extproc.core.dialects.openai_embeddings import read_openai_answer
from extproc.core.embeddings_body import EmbeddingsBody
from extproc.core.plan import ResponsePlan
from extproc.core.quantize import quantise
from extproc.core.request_headers import UPSTREAM_PATH
from extproc.core.request_json import EmbeddingsRequest, check_fields
from extproc.core.response_rewrite import openai_body, write_openai_answer
from extproc.core.tasks.embed import EmbeddingsDialect, Layout, ReadAnswer, Reading
from extproc.core.vectors import FloatMatrix

SYMMETRIC: Final = frozenset({"text-matching", "classification", "separation"})
# Jina's own fields: read here, never sent upstream.
_OWN: Final = ("task", "embedding_type", "normalized", "late_chunking", "truncate")
# What OpenAI's `encoding_format` already says.
_ENCODINGS: Final = ("float", "base64")


class JinaEmbed(EmbeddingsDialect):
    name = "jina"
    paths = (UPSTREAM_PATH,)
    own_shape = False
    role_field = "task"
    types: ClassVar[tuple[str, ...]] = ("float", "base64", "binary", "ubinary")

    def read_request(self, body: bytes, reading: Reading) -> EmbeddingsRequest:
        read = fields.read_body(body, reading)
        doc, bom = read.doc, read.bom
        own: dict[str, Any] = {key: doc.pop(key) for key in _OWN if key in doc}
        if optional(own, "late_chunking", bool):
            raise InvalidFieldError(
                "'late_chunking' is not supported here: each input is embedded alone; "
                "leave it out or set it to false.",
                param="late_chunking",
            )
        doc["input"] = _texts(doc.get("input"))
        model = reading.model(doc.get("model"))
        task = fields.role(own.get("task"), "task", model, SYMMETRIC)
        if task is not None:
            doc[model.prompts.role_field] = task
        asked = own.get("embedding_type")
        kinds: tuple[str, ...] = ()
        if isinstance(asked, str) and asked in _ENCODINGS:
            doc["encoding_format"] = asked
        elif asked is not None:
            kinds = fields.embedding_types(
                asked, "embedding_type", self.types, model, doc.get("dimensions")
            )
        normalized = optional(own, "normalized", bool)
        request = check_fields(doc, reading.policy, reading.tokenizers, bom=bom, model=model)
        return replace(
            request,
            truncation=fields.truncation(optional(own, "truncate", bool), model),
            raw_vectors=normalized is False,
            answer=(("types", kinds), ("listed", isinstance(asked, list))) if kinds else (),
        )

    def write_request(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        body = {k: v for k, v in request.items() if k != "input_type"}
        if request.get("input_type") is not None:
            body["task"] = request["input_type"]
        return body

    def read_answer(self, body: bytes) -> ReadAnswer | None:
        return read_openai_answer(body)

    def write_answer(
        self, plan: ResponsePlan, answer: EmbeddingsBody, vectors: FloatMatrix, layout: Layout
    ) -> bytes:
        options = fields.options(plan)
        kinds: tuple[str, ...] = options.get("types", ())
        if not kinds:
            return write_openai_answer(plan, answer, vectors, layout)
        by_type = {kind: quantise(vectors, kind, None) for kind in kinds}
        embeddings: list[Any] = (
            [{kind: rows[i] for kind, rows in by_type.items()} for i in range(len(vectors))]
            if options.get("listed")
            else by_type[kinds[0]]
        )
        return openai_body(plan, answer, embeddings, layout)


def _texts(value: Any) -> Any:
    """``input`` with Jina's ``{"text"}`` items as their strings (OpenAI's forms as
    they are, for the checks to read)."""
    if not isinstance(value, list):
        return value
    texts = []
    for i, item in enumerate(value):
        text = item.get("text") if isinstance(item, dict) else item
        if isinstance(item, dict) and not isinstance(text, str):
            raise InvalidFieldError(
                f"input[{i}] must be a string or an object with a 'text' string "
                "(images are not embedded here).",
                param="input",
            )
        texts.append(text)
    return texts


DIALECT = JinaEmbed()
