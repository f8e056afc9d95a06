"""The one contract interface: an endpoint is a client dialect on a task.

A request's route picks its :class:`Endpoint` once, at the request headers (the
contract's route table, :mod:`extproc.core.routes`). The endpoint's dialect says how
its clients' requests are read and their answers written; the dialect's task
(embeddings, reranking) decides what happens between the two; the upstream adapter
of the model the request names (:mod:`extproc.core.upstreams`) writes what the
upstream is asked and reads what it answers. Both halves are pure:
:meth:`Endpoint.forward` takes the client's body and gives what the upstream gets
and a :class:`Plan`; :meth:`Endpoint.answer` takes the upstream's answer and that
plan and gives what the client gets, in the endpoint's error dialect for errors.

A task is the base class its dialects subclass (:mod:`extproc.core.tasks`); a
dialect is one module (:mod:`extproc.core.dialects`). Nothing above the core asks
which task or dialect a request has: it holds the endpoint and the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from extproc.core.answer_layout import AnswerLayout
from extproc.core.api_errors import ApiError
from extproc.core.error_dialect import ErrorDialect
from extproc.core.plan import RequestStats
from extproc.core.policy.model import GatewayPolicy, Served
from extproc.core.request_coding import BodyCoding
from extproc.core.status import is_success
from extproc.core.tokens import ModelTokenizer
from extproc.core.upstream_errors import parse_upstream_error
from extproc.core.upstreams.adapter import client_error

Clock = Callable[[], float]


class Loaded(Protocol):
    """What a task reads of a loaded contract (extproc/core/contract.py): the policy
    and a ready tokenizer for each of its models and rerankers."""

    @property
    def policy(self) -> GatewayPolicy: ...

    @property
    def tokenizers(self) -> Mapping[str, ModelTokenizer]: ...


class Plan(Protocol):
    """What the response phase must do, decided while the request is rewritten."""

    @property
    def model(self) -> str: ...

    @property
    def input_count(self) -> int: ...

    @property
    def needs_response(self) -> bool:
        """The gateway must see a 2xx body (to rewrite or check it)."""
        ...

    def answer_bytes(self) -> int:
        """What the response phase holds at once: the upstream's body and the
        client's (admission control reserves it)."""
        ...

    def to_json(self) -> str | None:
        """The plan as text, for a response processed on a second ext_proc stream
        (envoy/standalone.yaml); None for a plan that cannot travel so, whose
        endpoint's routes carry the whole exchange on one stream."""
        ...


P = TypeVar("P", bound=Plan)


@dataclass(frozen=True)
class Forward(Generic[P]):
    """Send the request upstream: ``upstream_body`` in place of the client's (None:
    the client's body goes as sent), and the plan for its answer."""

    upstream_body: bytes | None
    plan: P
    stats: RequestStats


@dataclass(frozen=True)
class ClientAnswer:
    status: int
    body: bytes
    prompt_tokens: int | None = None  # the upstream's usage, where its answer was read


class Dialect(Protocol[P]):
    """How one kind of client speaks to one task; a task's base class implements
    ``forward`` and ``answer`` from the dialect's reader and writer."""

    @property
    def name(self) -> str:
        """The dialect's name in a policy file (lower case)."""
        ...

    @property
    def task(self) -> str:
        """The task it speaks to: ``embeddings`` or ``rerank``."""
        ...

    @property
    def paths(self) -> tuple[str, ...]:
        """Where its clients post, by default: the first is its canonical path."""
        ...

    def forward(
        self,
        endpoint: Endpoint[P],
        body: bytes,
        contract: Loaded,
        clock: Clock,
        coding: BodyCoding | None,
    ) -> Forward[P] | ClientAnswer: ...

    def answer(
        self, endpoint: Endpoint[P], plan: P, status: int, body: bytes, clock: Clock | None
    ) -> ClientAnswer | None: ...


def needs_response_body(plan: Plan | None, status: int) -> bool:
    """Decided on the response headers: must the gateway see (and buffer) the body?
    Any error's (it gets the endpoint's error dialect); a 2xx's when the plan reads it."""
    if not is_success(status):
        return True
    return plan is not None and plan.needs_response


@dataclass(frozen=True)
class Endpoint(Generic[P]):
    """One route the gateway serves: its dialect (and so its task), the upstream
    path its requests go to, and how its errors read."""

    route: str
    dialect: Dialect[P]
    upstream_path: str
    errors: ErrorDialect
    # Each model's success body as the legacy server laid it out, where it has one.
    answers: Mapping[str, AnswerLayout] = field(default_factory=dict)
    # The models a dialect's own path serves, by name (empty: every model).
    served: Mapping[str, Served] = field(default_factory=dict)

    def forward(
        self, body: bytes, contract: Loaded, *, clock: Clock, coding: BodyCoding | None = None
    ) -> Forward[P] | ClientAnswer:
        """Raise an ApiError for the client's mistake; else what goes upstream, or the
        client's answer where the dialect's server answered without its model (nothing
        goes upstream). ``clock`` (seconds, monotonic) times the tokenizing against its
        budget."""
        try:
            return self.dialect.forward(self, body, contract, clock, coding)
        except ApiError as error:
            error.request = body
            raise

    def answer(
        self, plan: P | None, status: int, body: bytes, *, clock: Clock | None = None
    ) -> ClientAnswer | None:
        """The client's answer to the upstream's; None: the upstream's, unchanged.
        Without a plan (Envoy's own reply, or a response whose request the gateway
        never read) an error gets this endpoint's error dialect and a 2xx passes.
        ``clock``: the forward's, for a dialect whose answers say how long they took."""
        if plan is not None:
            return self.dialect.answer(self, plan, status, body, clock)
        if is_success(status):
            return None
        # No plan, no model: which upstream kind answered is unknown, so the
        # tolerant parser reads every kind's shape.
        error = client_error(status, parse_upstream_error(body), None)
        return ClientAnswer(error.status, self.errors.write(error, error.status))
