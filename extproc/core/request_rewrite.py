"""Client request -> upstream request plus a :class:`ResponsePlan` (sans-I/O).

The rewrite decision: once :func:`read_request` has checked the body against the
model's policy (every client mistake is its 4xx), the legacy contract becomes what
the upstream is asked for (an :class:`UpstreamAsk`), which the model's upstream
adapter writes in its own body:

- ``input_type`` / ``instruction`` become the model's prompt prefix (stripped);
- inputs over ``max_tokens`` are cut with the model's tokenizer as the policy says
  and then sent as token ids, or refused (:mod:`extproc.core.truncation`);
- ``dimensions`` below native is forwarded to an upstream the policy says cuts
  itself (``upstream.native.dimensions``), else stripped and emulated on the response;
- the answer's encoding is the client's, unless the gateway rewrites the vectors:
  then the adapter's ``vectors_encoding``.

When nothing changes, ``upstream_body`` is ``None``: the body is forwarded as sent.
In both profiles a top-level ``null`` means the field is absent: it is never
forwarded (vLLM refuses ``"encoding_format": null``, and an absent field is every
upstream's default); nor is a legacy spelling (``"256"``, ``256.0``): the upstream
gets the value read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from extproc.core.api_errors import InvalidFieldError
from extproc.core.endpoint import Forward
from extproc.core.plan import OPENAI_DIALECT, Encoding, RequestStats, ResponsePlan
from extproc.core.policy.model import GatewayPolicy
from extproc.core.preprocess import preprocess
from extproc.core.prompts import prompt_prefix
from extproc.core.request_coding import BodyCoding
from extproc.core.request_json import EmbeddingsRequest, read_request
from extproc.core.tokens import ModelTokenizer
from extproc.core.truncation import fit_inputs
from extproc.core.upstreams import UpstreamAsk, adapter_for


def rewrite_request(
    body: bytes,
    policy: GatewayPolicy,
    tokenizers: Mapping[str, ModelTokenizer],
    *,
    clock: Callable[[], float],
    coding: BodyCoding | None = None,
) -> Forward[ResponsePlan]:
    """Validate and rewrite one OpenAI ``POST /v1/embeddings`` body (``coding`` as for
    :func:`read_request`; ``clock``, seconds on a monotonic clock, times the
    tokenizing); raise ApiError for the client."""
    request = read_request(body, policy, tokenizers, coding=coding)
    return plan_request(request, policy, tokenizers, clock=clock)


def plan_request(
    request: EmbeddingsRequest,
    policy: GatewayPolicy,
    tokenizers: Mapping[str, ModelTokenizer],
    *,
    clock: Callable[[], float],
    dialect: str | None = None,
) -> Forward[ResponsePlan]:
    """What the upstream is asked for a checked request, and the plan for its answer
    (``clock`` as for :func:`rewrite_request`; ``dialect``: the client's, where its writer
    answers in a shape of its own; None: OpenAI's shape)."""
    model = request.model
    adapter = adapter_for(model.upstream.kind)
    if request.raw_vectors and not adapter.raw_vectors:
        raise InvalidFieldError(
            f"Vectors before their normalisation are not available for {model.name!r} "
            "here: ask for normalised ones.",
            param="normalize",
        )
    prefix = prompt_prefix(model.prompts, request.input_type, request.instruction)
    texts = preprocess(model.preprocess, request.texts)
    fitted = fit_inputs(
        texts,
        request.token_ids,
        prefix=prefix,
        max_tokens=min(model.max_tokens, request.token_limit or model.max_tokens),
        tokenizer=tokenizers[model.name],
        limits=policy.limits,
        single=request.single_text,
        clock=clock,
        truncation=request.truncation or model.truncation,
    )

    dimensions = request.dimensions
    below_native = dimensions is not None and dimensions != model.native_dimensions
    # An upstream that cuts itself gets `dimensions` forwarded and answers the vectors
    # the client asked for, in the client's encoding: no response rewrite. (A size
    # below native passed read_request only for a Matryoshka model.)
    # A dialect of its own reads the vectors to write them in its shape.
    own_shape = dialect is not None
    emulate = below_native and (model.emulates_dimensions or request.raw_vectors)
    forwarded = dimensions if below_native and not emulate else None
    read = emulate or own_shape
    upstream_encoding = Encoding(adapter.vectors_encoding) if read else request.encoding
    plan = ResponsePlan(
        model=model.name,
        input_count=request.input_count,
        # The width the upstream answers: what a checked response is read against.
        native_dimensions=model.native_dimensions if forwarded is None else forwarded,
        upstream_kind=model.upstream.kind,
        client_encoding=request.encoding,
        upstream_encoding=upstream_encoding,
        dimensions=dimensions if emulate else None,
        check_only=model.check_responses,
        renormalise=not request.raw_vectors
        and (model.matryoshka is None or model.matryoshka.renormalise),
        reshape=model.answer is not None or own_shape,
        dialect=dialect or OPENAI_DIALECT,
        answer=request.answer,
        started=clock() if own_shape else 0.0,
    )
    kept = () if forwarded is None else ("dimensions",)
    # The fields that become the prompt prefix are the gateway's alone, never forwarded.
    prompt_fields = (model.prompts.role_field, "instruction")
    legacy_only = ("dimensions", *prompt_fields)
    stripped = [f for f in legacy_only if f in request.fields and f not in kept]
    stats = RequestStats(
        inputs=request.input_count,
        prompted=bool(prefix),
        truncated_inputs=fitted.truncated,
        tokens_cut=fitted.tokens_cut,
        dimensions_emulated=emulate,
        dimensions_forwarded=forwarded is not None,
        fields_stripped=len(stripped),
    )

    ask = UpstreamAsk(
        model=model.upstream_model,
        input=fitted.input
        if fitted.input is not None
        else (texts if texts != request.texts else request.converted_input),
        encoding=upstream_encoding.value,
        dimensions=forwarded,
        truncate_prompt_tokens=request.truncate_prompt_tokens,
        raw=request.raw_vectors,
    )
    # null means absent: never forwarded (an absent field is every upstream's default).
    sent = {k: v for k, v in request.fields.items() if v is not None and k not in prompt_fields}
    upstream_body = adapter.write_request(
        ask, sent, force=request.bom or len(sent) < len(request.fields)
    )
    return Forward(upstream_body=upstream_body, plan=plan, stats=stats)
