"""OpenAI's embeddings: ``POST /v1/embeddings`` (or its alias ``/embeddings``)
``{model, input, encoding_format, dimensions, user}`` plus the legacy contract's
``input_type`` and ``instruction``, answered ``{object, data: [{object, index,
embedding}], model, usage}``: the upstream's own dialect, so a request and an
answer the contract leaves alone pass byte for byte. The request is read by
:mod:`extproc.core.request_json`; the answer is the upstream's, its vectors
replaced where they change (:func:`extproc.core.response_rewrite.write_openai_answer`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from extproc.core.embeddings_body import EmbeddingsBody, parse_embeddings_body
from extproc.core.plan import ResponsePlan
from extproc.core.request_headers import UPSTREAM_PATH
from extproc.core.request_json import EmbeddingsRequest, read_request
from extproc.core.response_rewrite import write_openai_answer
from extproc.core.tasks.embed import EmbeddingsDialect, Layout, ReadAnswer, Reading
from extproc.core.vectors import BadVectorsError, FloatMatrix


class OpenAIEmbeddings(EmbeddingsDialect):
    name = "openai"
    paths = (UPSTREAM_PATH, "/embeddings")
    own_shape = False

    def read_request(self, body: bytes, reading: Reading) -> EmbeddingsRequest:
        return read_request(body, reading.policy, reading.tokenizers, coding=reading.coding)

    def write_request(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        return dict(request)

    def read_answer(self, body: bytes) -> ReadAnswer | None:
        return read_openai_answer(body)

    def write_answer(
        self, plan: ResponsePlan, answer: EmbeddingsBody, vectors: FloatMatrix, layout: Layout
    ) -> bytes:
        return write_openai_answer(plan, answer, vectors, layout)


def read_openai_answer(body: bytes) -> ReadAnswer | None:
    """OpenAI's ``{data: [{embedding}], usage}``, float or base64, in ``index`` order."""
    try:
        parsed = parse_embeddings_body(body)
    except BadVectorsError:
        return None
    return ReadAnswer(parsed.vectors, parsed.prompt_tokens)


DIALECT = OpenAIEmbeddings()
