"""The rerank task: the base class of every rerank dialect.

A dialect reads its clients' body into one :class:`RerankRequest` and writes the
ranking back in its shape (and, for the tools, writes requests and reads answers
as its clients do). Between the two the task is the same for every dialect.

Decisions, once, on the request: which reranker (the endpoint's path, then the
``model`` the client names, or the one of its path); the scores the client gets
(TEI's ``raw_scores`` when it sends it, else the legacy server's scale); what
happens to a (query, document) pair over ``max_tokens`` (TEI's ``truncate`` when it
sends it, else the policy's ``truncation``: cut by the upstream, or refused with a
413); ``top_n`` (the client's, or the policy's default) and whether the answer
carries the documents.

On the answer: the upstream is asked for raw logits where it can give them, and the
gateway takes the sigmoid itself (float64) where the client gets that scale; the
documents are ordered best first (a tie to the earlier document, as a stable sort
gives), cut to ``top_n`` and written in the dialect. An upstream error keeps its
status (a 404 for a served model is a 503); a 2xx that is not a rerank answer for
this request is a 502.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from extproc.core.api_errors import (
    InvalidFieldError,
    ServerError,
    TooLargeError,
    UnknownModelError,
    quoted,
)
from extproc.core.endpoint import ClientAnswer, Clock, Endpoint, Forward, Loaded
from extproc.core.plan import RequestStats
from extproc.core.policy.model import RerankPolicy, ScoreScale
from extproc.core.request_coding import BodyCoding
from extproc.core.request_headers import check_body_size
from extproc.core.status import is_success
from extproc.core.tokens import TokenizeBudget, TokenizeBudgetError
from extproc.core.upstreams import BadRerankAnswerError, RerankAsk, adapter_for

# What a result costs in the answers beyond its document's text, roughly.
_BYTES_PER_RESULT = 160


@dataclass(frozen=True)
class RerankRequest:
    """A rerank request, in no dialect's terms. ``None``: the client did not say."""

    model: str | None
    query: str
    documents: tuple[str, ...]
    top_n: int | None = None
    return_documents: bool | None = None
    raw_scores: bool | None = None  # TEI's
    truncate: bool | None = None  # TEI's
    truncate_left: bool = False  # TEI's truncation_direction "Left"
    max_tokens_per_doc: int | None = None  # Cohere v2's: each document cut to this many


@dataclass(frozen=True)
class Ranked:
    """One document's place in an answer."""

    index: int
    score: float
    text: str | None  # when the answer carries the documents


@dataclass(frozen=True)
class Ranking:
    """A rerank answer as a client reads it, in no dialect's terms."""

    scores: Mapping[int, float]  # by document position
    order: tuple[int, ...]  # document positions, as answered
    documents: bool  # the answer carries the documents

    @property
    def count(self) -> int:
        return len(self.order)


@dataclass(frozen=True)
class RerankPlan:
    """What the answer must become."""

    reranker: RerankPolicy
    input_count: int  # documents sent
    raw: bool  # the client gets logits
    top_n: int | None
    documents: tuple[str, ...] | None  # carried in the answer, when the client wants them
    # What the response phase holds at once: the upstream's answer (vLLM's carries
    # every document's text) and the client's.
    held_bytes: int = 0

    needs_response = True  # every rerank answer is rewritten into the dialect

    @property
    def model(self) -> str:
        return self.reranker.name

    def answer_bytes(self) -> int:
        return self.held_bytes

    def to_json(self) -> None:
        return None  # the rerank routes carry the whole exchange on one stream


class RerankDialect:
    """One rerank dialect: a subclass sets the class attributes and writes the
    reader and writer of each direction."""

    name: ClassVar[str]
    task: ClassVar[str] = "rerank"
    paths: ClassVar[tuple[str, ...]]
    # Whether answers carry the documents when the client does not say.
    returns_documents: ClassVar[bool] = False
    # Whether its requests name the model (TEI's do not: one model per path).
    names_model: ClassVar[bool] = True
    # What its clients may ask besides a plain request, by label (the tools send
    # each); and what asks for a long pair to be cut, where the client says.
    client_options: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    cut_option: ClassVar[Mapping[str, Any] | None] = None

    def read_request(self, body: bytes, max_documents: int) -> RerankRequest:
        """The checked request; an ApiError for the client's mistake."""
        raise NotImplementedError

    def write_answer(
        self, ranked: Sequence[Ranked], *, model: str, prompt_tokens: int | None
    ) -> bytes:
        """The client's answer, ``ranked`` best first (already cut to top_n)."""
        raise NotImplementedError

    def write_request(
        self, model: str, query: str, documents: Sequence[str], **options: Any
    ) -> dict[str, Any]:
        """A request as its clients write it (the tools send these)."""
        raise NotImplementedError

    def read_answer(self, body: bytes) -> Ranking | None:
        """An answer as its clients read it; None when ``body`` is not one."""
        raise NotImplementedError

    def forward(
        self,
        endpoint: Endpoint[RerankPlan],
        body: bytes,
        contract: Loaded,
        clock: Clock,
        coding: BodyCoding | None,
    ) -> Forward[RerankPlan]:
        policy = contract.policy
        if coding is not None:
            coding.check(body, policy.limits.max_request_bytes)
        check_body_size(len(body), policy.limits)
        request = self.read_request(body, policy.limits.max_inputs)
        return _forward(self, policy.rerankers_at(endpoint.route), request, contract, clock)

    def answer(
        self,
        endpoint: Endpoint[RerankPlan],
        plan: RerankPlan,
        status: int,
        body: bytes,
        clock: Clock | None = None,
    ) -> ClientAnswer:
        errors = endpoint.errors
        adapter = adapter_for(plan.reranker.upstream_kind)
        if not is_success(status):
            error = adapter.client_error(status, body, plan.model)
            return ClientAnswer(error.status, errors.write(error, error.status))
        try:
            answered = adapter.read_scores(body, plan.input_count)
        except BadRerankAnswerError as exc:
            fault = ServerError(
                502,
                f"The upstream returned an invalid rerank response: {exc}.",
                code="bad_upstream_response",
            )
            return ClientAnswer(502, errors.write(fault, 502))
        scores = list(answered.scores)
        if answered.raw and not plan.raw:
            scores = [sigmoid(x) for x in scores]
        elif plan.raw and not answered.raw:
            scores = [logit(p) for p in scores]
        order = sorted(range(plan.input_count), key=lambda i: -scores[i])  # stable
        if plan.top_n is not None:
            order = order[: plan.top_n]
        texts = plan.documents
        ranked = [Ranked(i, scores[i], None if texts is None else texts[i]) for i in order]
        written = self.write_answer(ranked, model=plan.model, prompt_tokens=answered.prompt_tokens)
        return ClientAnswer(200, written)


def _forward(
    dialect: RerankDialect,
    entries: tuple[RerankPolicy, ...],
    request: RerankRequest,
    contract: Loaded,
    clock: Clock,
) -> Forward[RerankPlan]:
    reranker = _reranker(entries, request)
    raw = (
        request.raw_scores if request.raw_scores is not None else reranker.scores is ScoreScale.RAW
    )
    cut = request.truncate if request.truncate is not None else not reranker.truncation.refuse
    adapter = adapter_for(reranker.upstream_kind)
    per_doc = request.max_tokens_per_doc
    if per_doc is not None:
        if not adapter.cuts_documents:
            raise InvalidFieldError(
                f"'max_tokens_per_doc' is not available for {reranker.name!r} here: send "
                "shorter documents instead.",
                param="max_tokens_per_doc",
            )
        # The pairs are counted before the upstream's document cut: one still over
        # the limit after it is cut as a whole, as Cohere cuts.
        cut = True
    truncate_to = None
    if reranker.max_tokens is not None:
        longest = _longest_pair(request, reranker, contract, clock)
        if longest > reranker.max_tokens:
            if not cut:
                raise TooLargeError(
                    f"A (query, document) pair has {longest} tokens; the model takes at most "
                    f"{reranker.max_tokens}.",
                    param="documents",
                )
            if request.truncate_left:
                # The upstreams cut a pair as the tokenizer does from the right; their
                # left cut keeps other tokens than a tokenizer cutting from the left.
                raise InvalidFieldError(
                    f"A (query, document) pair has {longest} tokens, over the model's "
                    f"{reranker.max_tokens}, and this gateway cuts pairs from the right "
                    "only: send truncation_direction 'Right' or shorter texts.",
                    param="truncation_direction",
                )
            truncate_to = reranker.max_tokens
    wanted = request.return_documents
    returning = reranker.return_documents if wanted is None else wanted
    text = sum(map(len, request.documents))
    count = len(request.documents)
    plan = RerankPlan(
        reranker=reranker,
        input_count=count,
        raw=raw,
        top_n=request.top_n or reranker.top_n,
        documents=request.documents if returning else None,
        held_bytes=text * (2 if returning else 1) + _BYTES_PER_RESULT * count,
    )
    upstream_body = adapter.write_rerank(
        RerankAsk(reranker.upstream_model, request.query, request.documents, truncate_to, per_doc)
    )
    return Forward(upstream_body, plan, RequestStats(inputs=plan.input_count))


def _reranker(entries: tuple[RerankPolicy, ...], request: RerankRequest) -> RerankPolicy:
    """The entry the request names; else the one taking any name; else the path's one
    entry for a request naming none."""
    for entry in entries:
        if entry.name == request.model:
            return entry
    for entry in entries:
        if entry.any_name:
            return entry
    names = ", ".join(sorted(r.name for r in entries))
    if request.model is None:
        if len(entries) == 1:
            return entries[0]
        raise InvalidFieldError(
            f"Missing required parameter: 'model' (one of {names}).",
            param="model",
            reason="missing",
        )
    raise UnknownModelError(
        f"The model {quoted(request.model)} does not exist; this endpoint serves: {names}."
    )


def _longest_pair(
    request: RerankRequest, reranker: RerankPolicy, contract: Loaded, clock: Clock
) -> int:
    limits = contract.policy.limits
    budget = TokenizeBudget(limits.max_tokenize_bytes, limits.max_tokenize_ms / 1000, clock=clock)
    try:
        counts = contract.tokenizers[reranker.key].pair_counts(
            request.query, request.documents, budget
        )
    except TokenizeBudgetError:
        raise TooLargeError(
            "The documents need more tokenization than the gateway does per request; send "
            "fewer or shorter documents.",
            param="documents",
        ) from None
    return max(counts)


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def logit(p: float) -> float:
    """The logit whose sigmoid is ``p`` (float64; infinite at 0 and 1)."""
    if p <= 0.0:
        return -math.inf
    if p >= 1.0:
        return math.inf
    return math.log(p / (1.0 - p))
