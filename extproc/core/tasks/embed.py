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

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Final

import numpy as np

from extproc.core.answer_layout import AnswerLayout
from extproc.core.api_errors import ApiError, InvalidFieldError, UnknownModelError, quoted
from extproc.core.embeddings_body import EmbeddingsBody
from extproc.core.endpoint import ClientAnswer, Clock, Endpoint, Forward, Loaded
from extproc.core.error_dialect import ErrorDialect
from extproc.core.plan import ResponsePlan
from extproc.core.policy.model import GatewayPolicy, ModelPolicy, Served
from extproc.core.request_coding import BodyCoding
from extproc.core.request_json import EmbeddingsRequest
from extproc.core.request_rewrite import plan_request
from extproc.core.response_rewrite import rewrite_response
from extproc.core.tokens import ModelTokenizer
from extproc.core.vectors import FloatMatrix

Layout = AnswerLayout | None


@dataclass(frozen=True)
class Reading:
    """What a request at one path is read against: the policy, its tokenizers, how
    Envoy decoded the body, and the models the path serves (empty: every model, as
    OpenAI's paths do)."""

    policy: GatewayPolicy
    tokenizers: Mapping[str, ModelTokenizer]
    coding: BodyCoding | None = None
    served: Mapping[str, Served] = field(default_factory=dict)

    def model(self, name: object, *, required: bool = True, field: str = "model") -> ModelPolicy:
        """The model a request naming ``name`` (None: none) is for at this path; the
        client's 4xx when it names none where one is ``required``, or none the path
        can pick, or one the path does not serve."""
        if name is not None and not isinstance(name, str):
            raise InvalidFieldError(f"'{field}' must be a string.", param=field)
        if name is None and required:
            raise InvalidFieldError(
                f"Missing required parameter: '{field}'.", param=field, reason="missing"
            )
        if name is None and len(self.served) == 1:
            return self.policy.models[next(iter(self.served))]
        model = self.policy.model(name)
        if model is not None and (not self.served or model.name in self.served):
            return model
        if name is None:
            raise InvalidFieldError(
                f"Missing required parameter: '{field}'.", param=field, reason="missing"
            )
        names = sorted(self.served or self.policy.models)
        raise UnknownModelError(
            f"The model {quoted(name)} does not exist; this path serves: {', '.join(names)}.",
            param=field,
        )

    def normalized(self, model: ModelPolicy) -> bool:
        """Whether this path answered ``model``'s vectors at unit length."""
        served = self.served.get(model.name) if self.served else None
        return served is None or served.normalized


def own_words(error: ApiError, names: Mapping[str, str]) -> ApiError:
    """``error`` with OpenAI's field names (``input``, ``dimensions``, the role's
    field) replaced by the dialect's, in its ``param`` and its message."""
    if error.param is not None and error.param in names:
        error.param = names[error.param]
    message = error.message
    for old, new in names.items():
        if "_" in old or "." in old:  # a name no sentence uses as a word
            message = re.sub(rf"\b{re.escape(old)}\b", new, message)
        else:  # 'input', `input`, input[3]; never "per input"
            message = re.sub(
                rf"(?<=['`]){re.escape(old)}(?=['`])|\b{re.escape(old)}(?=\[)", new, message
            )
    error.message = message
    return error


@dataclass(frozen=True)
class ReadAnswer:
    """An answer as a dialect's clients read it: a vector an input, and the token
    count where the dialect says one."""

    vectors: FloatMatrix
    prompt_tokens: int | None = None


def float_rows(value: Any) -> FloatMatrix | None:
    """A JSON list of equally long lists of numbers as a float32 matrix; None for
    anything else."""
    if not isinstance(value, list) or not value:
        return None
    rows = value
    width = len(rows[0]) if isinstance(rows[0], list) else 0
    if not width or any(not isinstance(r, list) or len(r) != width for r in rows):
        return None
    if any(isinstance(x, bool) or not isinstance(x, (int, float)) for r in rows for x in r):
        return None
    return np.asarray(rows, dtype=np.float32)


# The fields of an OpenAI-shaped request every dialect's writer takes.
PLAIN_FIELDS: Final = frozenset({"model", "input", "input_type", "dimensions"})


class EmbeddingsDialect:
    """One embeddings dialect: a subclass sets the class attributes and writes
    :meth:`read_request` and :meth:`write_answer`."""

    name: ClassVar[str]
    task: ClassVar[str] = "embeddings"
    paths: ClassVar[tuple[str, ...]]
    # Its own error bodies and statuses (None: the policy's, as OpenAI's clients get).
    errors: ClassVar[ErrorDialect | None] = None
    # Whether its requests name the model (TEI's do not: one model a path).
    names_model: ClassVar[bool] = True
    # Its answers are its own shape (else OpenAI's, unless a request asks otherwise).
    own_shape: ClassVar[bool] = True
    # Its answers say how long the request took (the writer finds ``elapsed_ns``
    # among the plan's answer options).
    timed: ClassVar[bool] = False
    # Its names for the OpenAI fields it has (``input``: ``texts``), and for the
    # role's field of any model's prompts: what its reader reads as those, and how
    # a mistake is told in the client's words.
    field_names: ClassVar[Mapping[str, str]] = {}
    role_field: ClassVar[str | None] = None

    def read_request(self, body: bytes, reading: Reading) -> EmbeddingsRequest | ClientAnswer:
        """The checked request; an ApiError for the client's mistake; or the answer the
        dialect's own server gives without its model (Ollama's to no input)."""
        raise NotImplementedError

    def write_answer(
        self, plan: ResponsePlan, answer: EmbeddingsBody, vectors: FloatMatrix, layout: Layout
    ) -> bytes:
        """The client's 2xx body: the upstream's checked ``answer`` and the
        ``vectors`` the client gets (cut where the plan says), in the legacy server's
        ``layout`` where the model has one."""
        raise NotImplementedError

    def write_request(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """An OpenAI-shaped request (``model``, ``input``, ``input_type``,
        ``dimensions``) as this dialect's clients write it, for the tools to send;
        None where the dialect has no way to say one of its fields."""
        raise NotImplementedError

    def read_answer(self, body: bytes) -> ReadAnswer | None:
        """A 2xx body as this dialect's clients read it; None when it is not one."""
        raise NotImplementedError

    def forward(
        self,
        endpoint: Endpoint[ResponsePlan],
        body: bytes,
        contract: Loaded,
        clock: Clock,
        coding: BodyCoding | None,
    ) -> Forward[ResponsePlan] | ClientAnswer:
        policy = contract.policy
        reading = Reading(policy, contract.tokenizers, coding, endpoint.served)
        try:
            request = self.read_request(body, reading)
            if isinstance(request, ClientAnswer):
                return request
            shaped = self.name if self.own_shape or request.answer else None
            tokenizers = contract.tokenizers
            return plan_request(request, policy, tokenizers, clock=clock, dialect=shaped)
        except ApiError as error:
            names = {ours: theirs for ours, theirs in self.field_names.items() if ours != theirs}
            if not names and self.role_field is None:
                raise
            if self.role_field is not None:
                names |= {m.prompts.role_field: self.role_field for m in policy.models.values()}
            raise own_words(error, names) from None

    def answer(
        self,
        endpoint: Endpoint[ResponsePlan],
        plan: ResponsePlan,
        status: int,
        body: bytes,
        clock: Clock | None,
    ) -> ClientAnswer | None:
        if self.timed and clock is not None:
            elapsed = max(0, int((clock() - plan.started) * 1e9))
            plan = replace(plan, answer=(*plan.answer, ("elapsed_ns", elapsed)))
        layout = endpoint.answers.get(plan.model)
        return rewrite_response(
            plan, status, body, endpoint.errors, write=self.write_answer, layout=layout
        )
