"""Client request -> upstream request plus a :class:`ResponsePlan` (sans-I/O).

The rewrite decision: once :func:`read_request` has checked the body against the
model's policy (every client mistake is its 4xx), the legacy contract becomes what
Dynamo and vLLM understand:

- ``input_type`` / ``instruction`` become the model's prompt prefix (stripped);
- inputs over ``max_tokens`` are cut with the model's tokenizer and then sent as
  token ids (:mod:`extproc.core.truncation`);
- ``dimensions`` below native is forwarded to an upstream the policy says cuts
  itself (``upstream.native.dimensions``), else stripped and emulated on the response;
- ``encoding_format`` is set to what makes the response work cheapest.

When nothing changes, ``upstream_body`` is ``None``: the body is forwarded as sent.
In both profiles a top-level ``null`` means the field is absent: it is never
forwarded (vLLM refuses ``"encoding_format": null``, and an absent field is every
upstream's default); nor is a legacy spelling (``"256"``, ``256.0``): the upstream
gets the value read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from extproc.core.plan import Encoding, RequestStats, ResponsePlan
from extproc.core.policy.model import GatewayPolicy
from extproc.core.prompts import prompt_prefix
from extproc.core.request_coding import BodyCoding
from extproc.core.request_json import LEGACY_ONLY_FIELDS, read_request
from extproc.core.tokens import ModelTokenizer
from extproc.core.truncation import fit_inputs
from extproc.core.upstreams import adapter_for


@dataclass(frozen=True)
class Forward:
    """Send the request upstream (rewritten when ``upstream_body`` is set)."""

    upstream_body: bytes | None
    plan: ResponsePlan
    stats: RequestStats


def rewrite_request(
    body: bytes,
    policy: GatewayPolicy,
    tokenizers: Mapping[str, ModelTokenizer],
    *,
    coding: BodyCoding | None = None,
) -> Forward:
    """Validate and rewrite one ``POST /v1/embeddings`` body; raise ApiError for the client.

    ``coding``: how the body was sent, when Envoy decoded it (its errors say so)."""
    request = read_request(body, policy, tokenizers, coding=coding)
    model = request.model
    prefix = prompt_prefix(model.prompts, request.input_type, request.instruction)
    fitted = fit_inputs(
        request.texts,
        request.token_ids,
        prefix=prefix,
        max_tokens=model.max_tokens,
        tokenizer=tokenizers[model.name],
        limits=policy.limits,
        single=request.single_text,
    )

    dimensions = request.dimensions
    below_native = dimensions is not None and dimensions != model.native_dimensions
    # An upstream that cuts itself gets `dimensions` forwarded and answers the vectors
    # the client asked for, in the client's encoding: no response rewrite. (A size
    # below native passed read_request only for a Matryoshka model.)
    emulate = below_native and model.emulates_dimensions
    forwarded = dimensions if below_native and not emulate else None
    adapter = adapter_for(model.upstream.kind)
    upstream_encoding = Encoding(adapter.vectors_encoding) if emulate else request.encoding
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
    )
    kept = () if forwarded is None else ("dimensions",)
    stripped = [f for f in LEGACY_ONLY_FIELDS if f in request.fields and f not in kept]
    stats = RequestStats(
        inputs=request.input_count,
        prompted=bool(prefix),
        truncated_inputs=fitted.truncated,
        tokens_cut=fitted.tokens_cut,
        dimensions_emulated=emulate,
        fields_stripped=len(stripped),
    )

    requested_encoding = request.fields.get("encoding_format")
    sent_encoding = requested_encoding if requested_encoding is not None else Encoding.FLOAT.value
    nulls = any(value is None for value in request.fields.values())
    converted: dict[str, Any] = {}
    if request.converted_input is not None:
        converted["input"] = request.converted_input
    truncate = request.fields.get("truncate_prompt_tokens")
    if request.truncate_prompt_tokens is not None and type(truncate) is not int:
        converted["truncate_prompt_tokens"] = request.truncate_prompt_tokens
    changed = (
        request.bom
        or nulls
        or bool(converted)
        or bool(stripped)
        # A forwarded size the client spelled leniently ("256", 256.0) goes up as an int.
        or (forwarded is not None and type(request.fields.get("dimensions")) is not int)
        or fitted.input is not None
        or model.upstream_model != model.name
        or sent_encoding != upstream_encoding.value
    )
    if not changed:
        return Forward(upstream_body=None, plan=plan, stats=stats)

    # null means absent: never forwarded (an absent field is every upstream's default).
    upstream = {k: v for k, v in request.fields.items() if k not in stripped and v is not None}
    upstream.update(converted)
    if forwarded is not None:
        upstream["dimensions"] = forwarded  # the validated integer, never the client's spelling
    upstream["model"] = model.upstream_model
    if fitted.input is not None:
        upstream["input"] = fitted.input
    if upstream_encoding is Encoding.FLOAT:
        upstream.pop("encoding_format", None)  # float is every upstream's default
    else:
        upstream["encoding_format"] = upstream_encoding.value
    upstream_body = orjson.dumps(upstream)
    return Forward(upstream_body=upstream_body, plan=plan, stats=stats)
