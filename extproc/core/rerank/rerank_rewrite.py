"""A legacy rerank request -> what the rerank upstream is asked, plus a plan; the
upstream's answer + the plan -> the client's answer, in the legacy dialect (sans-I/O).

Decisions, once, on the request: which reranker (the path, then the ``model`` the
client names, or the one of its path); the scores the client gets (TEI's
``raw_scores`` when it sends it, else the legacy server's scale); what happens to a
(query, document) pair over ``max_tokens`` (TEI's ``truncate`` when it sends it, else
the policy's: cut by the upstream, or refused with a 413); ``top_n`` (the client's, or
the policy's default) and whether the answer carries the documents.

On the answer: the upstream is asked for raw logits where it can give them, and the
gateway takes the sigmoid itself (float64) where the client gets that scale; the
documents are ordered best first (a tie to the earlier document, as a stable sort
gives), cut to ``top_n`` and written in the dialect. An upstream error keeps its
status (a 404 for a served model is a 503); a 2xx that is not a rerank answer for this
request is a 502.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from extproc.core.error_envelope import ApiError, ErrorDialect, invalid_request
from extproc.core.policy.model import GatewayPolicy, RerankPolicy, ScoreScale
from extproc.core.rerank.dialects import Ranked, RerankRequest, read_request, write_answer
from extproc.core.rerank.rerank_upstreams import (
    RERANK_UPSTREAMS,
    BadRerankAnswerError,
    logit,
    sigmoid,
)
from extproc.core.status import is_success
from extproc.core.tokens import ModelTokenizer, TokenizeBudget, TokenizeBudgetError
from extproc.core.upstream_errors import parse_upstream_error
from extproc.core.upstreams.adapter import client_error


@dataclass(frozen=True)
class RerankPlan:
    """What the answer must become."""

    reranker: RerankPolicy
    count: int  # documents sent
    raw: bool  # the client gets logits
    top_n: int | None
    documents: tuple[str, ...] | None  # carried in the answer, when the client wants them
    # What the response phase holds at once: the upstream's answer (vLLM's carries
    # every document's text) and the client's.
    answer_bytes: int = 0

    needs_response = True  # every rerank answer is rewritten into the dialect

    @property
    def model(self) -> str:
        return self.reranker.name


@dataclass(frozen=True)
class RerankForward:
    upstream_body: bytes
    upstream_path: str
    plan: RerankPlan


@dataclass(frozen=True)
class RerankAnswer:
    status: int
    body: bytes


def rewrite_rerank_request(
    body: bytes,
    policy: GatewayPolicy,
    path: str,
    tokenizers: Mapping[str, ModelTokenizer],
    *,
    clock: Callable[[], float],
) -> RerankForward:
    """Validate and rewrite one rerank request to ``path`` (one of the policy's rerank
    paths; ``clock``, seconds on a monotonic clock, times the tokenizing); raise
    ApiError for the client."""
    entries = policy.rerankers_at(path)
    if not entries:
        raise ApiError(
            404, f"No rerank endpoint at {path}.", type="invalid_request_error", code="unknown_url"
        )
    request = read_request(entries[0].dialect, body, policy.limits.max_inputs)
    reranker = _reranker(entries, request)
    raw = (
        request.raw_scores if request.raw_scores is not None else reranker.scores is ScoreScale.RAW
    )
    cut = request.truncate if request.truncate is not None else reranker.cut_long_pairs
    upstream = RERANK_UPSTREAMS[reranker.upstream_kind]
    per_doc = request.max_tokens_per_doc
    if per_doc is not None:
        if not upstream.cuts_documents:
            raise invalid_request(
                f"'max_tokens_per_doc' is not available for {reranker.name!r} here: send "
                "shorter documents instead.",
                param="max_tokens_per_doc",
            )
        # The pairs are counted before the upstream's document cut: one still over
        # the limit after it is cut as a whole, as Cohere cuts.
        cut = True
    truncate_to = None
    if reranker.max_tokens is not None:
        longest = _longest_pair(request, reranker, tokenizers, policy, clock)
        if longest > reranker.max_tokens:
            if not cut:
                raise ApiError(
                    413,
                    f"A (query, document) pair has {longest} tokens; the model takes at most "
                    f"{reranker.max_tokens}.",
                    type="invalid_request_error",
                    param="documents",
                    code="request_too_large",
                )
            if request.truncate_left:
                # The upstreams cut a pair as the tokenizer does from the right; their
                # left cut keeps other tokens than a tokenizer cutting from the left.
                raise invalid_request(
                    f"A (query, document) pair has {longest} tokens, over the model's "
                    f"{reranker.max_tokens}, and this gateway cuts pairs from the right "
                    "only: send truncation_direction 'Right' or shorter texts.",
                    param="truncation_direction",
                )
            truncate_to = reranker.max_tokens
    wanted = request.return_documents
    returning = reranker.return_documents if wanted is None else wanted
    text_bytes = sum(len(d) for d in request.documents)
    plan = RerankPlan(
        reranker=reranker,
        count=len(request.documents),
        raw=raw,
        top_n=request.top_n or reranker.top_n,
        documents=request.documents if returning else None,
        answer_bytes=text_bytes * (2 if returning else 1) + 160 * len(request.documents),
    )
    upstream_body = upstream.write_request(
        reranker.upstream_model,
        request.query,
        request.documents,
        raw=upstream.can_answer_raw,
        truncate_to=truncate_to,
        max_tokens_per_doc=per_doc,
    )
    return RerankForward(upstream_body, upstream.path, plan)


def rewrite_rerank_response(
    plan: RerankPlan, status: int, body: bytes, errors: ErrorDialect
) -> RerankAnswer:
    dialect = plan.reranker.errors or errors
    if not is_success(status):
        error = client_error(status, parse_upstream_error(body), plan.model)
        return RerankAnswer(error.status, dialect.body(error, error.status))
    upstream = RERANK_UPSTREAMS[plan.reranker.upstream_kind]
    try:
        answered = upstream.read_scores(body, plan.count, raw=upstream.can_answer_raw)
    except BadRerankAnswerError as exc:
        error = ApiError(
            502,
            f"The upstream returned an invalid rerank response: {exc}.",
            type="server_error",
            code="bad_upstream_response",
        )
        return RerankAnswer(502, dialect.body(error, 502))
    scores = list(answered.scores)
    if answered.raw and not plan.raw:
        scores = [sigmoid(x) for x in scores]
    elif plan.raw and not answered.raw:
        scores = [logit(p) for p in scores]
    order = sorted(range(plan.count), key=lambda i: -scores[i])  # stable: ties by position
    if plan.top_n is not None:
        order = order[: plan.top_n]
    texts = plan.documents
    ranked = [Ranked(i, scores[i], None if texts is None else texts[i]) for i in order]
    answer = write_answer(
        plan.reranker.dialect, ranked, model=plan.model, prompt_tokens=answered.prompt_tokens
    )
    return RerankAnswer(200, answer)


def _reranker(entries: tuple[RerankPolicy, ...], request: RerankRequest) -> RerankPolicy:
    if request.model is None:
        if len(entries) == 1:
            return entries[0]
        names = ", ".join(sorted(r.name for r in entries))
        raise invalid_request(
            f"Missing required parameter: 'model' (one of {names}).", param="model"
        )
    for entry in entries:
        if entry.name == request.model:
            return entry
    names = ", ".join(sorted(r.name for r in entries))
    raise ApiError(
        404,
        f"The model {request.model[:100]!r} does not exist; this endpoint serves: {names}.",
        type="invalid_request_error",
        param="model",
        code="model_not_found",
    )


def _longest_pair(
    request: RerankRequest,
    reranker: RerankPolicy,
    tokenizers: Mapping[str, ModelTokenizer],
    policy: GatewayPolicy,
    clock: Callable[[], float],
) -> int:
    limits = policy.limits
    budget = TokenizeBudget(limits.max_tokenize_bytes, limits.max_tokenize_ms / 1000, clock=clock)
    try:
        counts = tokenizers[reranker.key].pair_counts(request.query, request.documents, budget)
    except TokenizeBudgetError:
        raise ApiError(
            413,
            "The documents need more tokenization than the gateway does per request; send "
            "fewer or shorter documents.",
            type="invalid_request_error",
            param="documents",
            code="request_too_large",
        ) from None
    return max(counts)
