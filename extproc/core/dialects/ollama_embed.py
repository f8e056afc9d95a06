"""Ollama's embeddings, both routes:

- ``POST /api/embed`` ``{model, input, truncate, dimensions, options, keep_alive}``
  answered ``{model, embeddings, total_duration, load_duration,
  prompt_eval_count}``: ``model`` as the client named it, the durations in
  nanoseconds (the gateway's time with the request; the model is always loaded),
  ``prompt_eval_count`` the upstream's token count. ``truncate`` (default true):
  false refuses a long input. No input (absent, ``""`` or ``[]``) is answered by the
  gateway as Ollama answers it, ``{model, embeddings: []}``, with nothing upstream;
- the older ``POST /api/embeddings`` ``{model, prompt, options, keep_alive}``
  answered ``{embedding}``: one text, and on Ollama itself a vector that is not
  normalised (the path's ``normalized: false`` asks the upstream for such); no
  prompt (absent or ``""``) is ``{embedding: []}``.

``options`` and ``keep_alive`` are Ollama's own and read by nobody. Errors
``{error}``: 400, 404 for a model it does not serve.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final

import numpy as np

from extproc.core.api_errors import ErrorClass
from extproc.core.dialects import embed_fields as fields
from extproc.core.dialects import json_fields
from extproc.core.dialects.json_fields import optional
from extproc.core.embeddings_body import EmbeddingsBody
from extproc.core.endpoint import ClientAnswer
from extproc.core.error_dialect import ErrorDialect
from extproc.core.plan import ResponsePlan
from extproc.core.request_json import EmbeddingsRequest
from extproc.core.response_rewrite import dump
from extproc.core.tasks import embed
from extproc.core.vectors import FloatMatrix

_NO_VECTORS: Final = np.zeros((0, 0), dtype=np.float32)
_ERRORS = ErrorDialect(
    body={"error": "{message}"},
    statuses={ErrorClass.TOO_LARGE: 400, ErrorClass.TOO_MANY_INPUTS: 400},
)


class OllamaEmbed(embed.EmbeddingsDialect):
    name = "ollama"
    paths = ("/api/embed",)
    errors = _ERRORS
    timed = True
    field_names: ClassVar[Mapping[str, str]] = {"input": "input", "dimensions": "dimensions"}

    def read_request(self, body: bytes, reading: embed.Reading) -> EmbeddingsRequest | ClientAnswer:
        read = fields.read_body(body, reading)
        name = read.doc.get("model")
        model = reading.model(name)
        if read.doc.get("input") in (None, "", []):  # Ollama loads the model, embeds nothing
            return ClientAnswer(200, dump({"model": name, "embeddings": []}))
        cut = fields.truncation(optional(read.doc, "truncate", bool), model)
        answer = (("model", name),)
        return fields.checked(reading, model, read, self.field_names, truncation=cut, answer=answer)

    def write_request(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        if not fields.says(request, embed.PLAIN_FIELDS - {"input_type"}):
            return None
        body = {k: request.get(k) for k in ("model", "input", "dimensions")}
        return {k: v for k, v in body.items() if v is not None}

    def read_answer(self, body: bytes) -> embed.ReadAnswer | None:
        doc = json_fields.read_json(body)
        named = isinstance(doc, dict) and isinstance(doc.get("model"), str)
        if named and doc.get("embeddings") == []:  # no input: no vector
            return embed.ReadAnswer(_NO_VECTORS)
        rows = embed.float_rows(doc.get("embeddings")) if named else None
        if rows is None:
            return None
        count = doc.get("prompt_eval_count")
        return embed.ReadAnswer(rows, count if isinstance(count, int) else None)

    def write_answer(
        self, plan: ResponsePlan, answer: EmbeddingsBody, vectors: FloatMatrix, layout: embed.Layout
    ) -> bytes:
        options = fields.options(plan)
        doc: dict[str, Any] = {
            "model": options["model"],
            "embeddings": list(vectors),
            "total_duration": options.get("elapsed_ns", 0),
            "load_duration": 0,
        }
        if answer.prompt_tokens is not None:
            doc["prompt_eval_count"] = answer.prompt_tokens
        return dump(doc)


class OllamaEmbeddings(embed.EmbeddingsDialect):
    name = "ollama_embeddings"
    paths = ("/api/embeddings",)
    errors = _ERRORS
    field_names: ClassVar[Mapping[str, str]] = {"input": "prompt"}

    def read_request(self, body: bytes, reading: embed.Reading) -> EmbeddingsRequest | ClientAnswer:
        read = fields.read_body(body, reading)
        model = reading.model(read.doc.get("model"))
        if not optional(read.doc, "prompt", str):  # one text, never an array; none: no vector
            return ClientAnswer(200, dump({"embedding": []}))
        return fields.checked(reading, model, read, self.field_names)

    def write_request(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        text = request.get("input")
        if isinstance(text, list) and len(text) == 1:
            text = text[0]
        if not fields.says(request, frozenset({"model", "input"})) or not isinstance(text, str):
            return None
        return {"model": request.get("model"), "prompt": text}

    def read_answer(self, body: bytes) -> embed.ReadAnswer | None:
        doc = json_fields.read_json(body)
        if not isinstance(doc, dict):
            return None
        if doc.get("embedding") == []:  # no prompt: no vector
            return embed.ReadAnswer(_NO_VECTORS)
        rows = embed.float_rows([doc.get("embedding")])
        return None if rows is None else embed.ReadAnswer(rows)

    def write_answer(
        self, plan: ResponsePlan, answer: EmbeddingsBody, vectors: FloatMatrix, layout: embed.Layout
    ) -> bytes:
        (vector,) = vectors
        return dump({"embedding": vector})


EMBED = OllamaEmbed()
EMBEDDINGS = OllamaEmbeddings()
