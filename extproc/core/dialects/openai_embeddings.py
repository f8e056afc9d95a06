"""OpenAI's embeddings: ``POST /v1/embeddings`` (or its alias ``/embeddings``)
``{model, input, encoding_format, dimensions, user}`` plus the legacy contract's
``input_type`` and ``instruction``, answered ``{object, data: [{object, index,
embedding}], model, usage}``: the upstream's own dialect, so a request and an
answer the contract leaves alone pass byte for byte. The request is read by
:mod:`extproc.core.request_json`; the answer is the upstream's, its vectors
replaced where they change (:func:`extproc.core.response_rewrite.write_openai_answer`)."""

from __future__ import annotations

from collections.abc import Mapping

from extproc.core.answer_layout import AnswerLayout
from extproc.core.embeddings_body import EmbeddingsBody
from extproc.core.plan import ResponsePlan
from extproc.core.policy.model import GatewayPolicy
from extproc.core.request_coding import BodyCoding
from extproc.core.request_headers import UPSTREAM_PATH
from extproc.core.request_json import EmbeddingsRequest, read_request
from extproc.core.response_rewrite import write_openai_answer
from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.core.tokens import ModelTokenizer
from extproc.core.vectors import FloatMatrix


class OpenAIEmbeddings(EmbeddingsDialect):
    name = "openai"
    paths = (UPSTREAM_PATH, "/embeddings")

    def read_request(
        self,
        body: bytes,
        policy: GatewayPolicy,
        tokenizers: Mapping[str, ModelTokenizer],
        coding: BodyCoding | None,
    ) -> EmbeddingsRequest:
        return read_request(body, policy, tokenizers, coding=coding)

    def write_answer(
        self,
        plan: ResponsePlan,
        answer: EmbeddingsBody,
        vectors: FloatMatrix,
        layout: AnswerLayout | None,
    ) -> bytes:
        return write_openai_answer(plan, answer, vectors, layout)


DIALECT = OpenAIEmbeddings()
