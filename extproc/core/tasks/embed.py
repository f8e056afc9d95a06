"""The embeddings task: the base class of every embeddings dialect.

A dialect reads its clients' body into one :class:`EmbeddingsRequest` (checked
against the model's policy: every client mistake is its 4xx) and writes the
answer's vectors back in its shape. Between the two the task is the same for every
dialect: the model's prompt, truncation and Matryoshka rule decide what the
upstream is asked (:func:`extproc.core.request_rewrite.plan_request`), and its
answer is checked, cut and re-encoded (:func:`extproc.core.response_rewrite.
rewrite_response`) before the dialect writes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from extproc.core.answer_layout import AnswerLayout
from extproc.core.embeddings_body import EmbeddingsBody
from extproc.core.endpoint import ClientAnswer, Clock, Endpoint, Forward, Loaded
from extproc.core.plan import ResponsePlan
from extproc.core.policy.model import GatewayPolicy
from extproc.core.request_coding import BodyCoding
from extproc.core.request_json import EmbeddingsRequest
from extproc.core.request_rewrite import plan_request
from extproc.core.response_rewrite import rewrite_response
from extproc.core.tokens import ModelTokenizer
from extproc.core.vectors import FloatMatrix


class EmbeddingsDialect:
    """One embeddings dialect: a subclass sets the class attributes and writes
    :meth:`read_request` and :meth:`write_answer`."""

    name: ClassVar[str]
    task: ClassVar[str] = "embeddings"
    paths: ClassVar[tuple[str, ...]]

    def read_request(
        self,
        body: bytes,
        policy: GatewayPolicy,
        tokenizers: Mapping[str, ModelTokenizer],
        coding: BodyCoding | None,
    ) -> EmbeddingsRequest:
        """The checked request; an ApiError for the client's mistake."""
        raise NotImplementedError

    def write_answer(
        self,
        plan: ResponsePlan,
        answer: EmbeddingsBody,
        vectors: FloatMatrix,
        layout: AnswerLayout | None,
    ) -> bytes:
        """The client's 2xx body: the upstream's checked ``answer`` and the
        ``vectors`` the client gets (cut where the plan says), in the legacy server's
        ``layout`` where the model has one."""
        raise NotImplementedError

    def forward(
        self,
        endpoint: Endpoint[ResponsePlan],
        body: bytes,
        contract: Loaded,
        clock: Clock,
        coding: BodyCoding | None,
    ) -> Forward[ResponsePlan]:
        request = self.read_request(body, contract.policy, contract.tokenizers, coding)
        return plan_request(request, contract.policy, contract.tokenizers, clock=clock)

    def answer(
        self, endpoint: Endpoint[ResponsePlan], plan: ResponsePlan, status: int, body: bytes
    ) -> ClientAnswer | None:
        layout = endpoint.answers.get(plan.model)
        return rewrite_response(
            plan, status, body, endpoint.errors, write=self.write_answer, layout=layout
        )
