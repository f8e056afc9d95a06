"""Upstream answer + :class:`ResponsePlan` -> what the client receives (sans-I/O).

Success: vectors are cut (and re-normalised, unless the policy says the legacy
server did not) for Matryoshka emulation and re-encoded to the client's encoding;
everything else in the body is kept. Errors: what the upstream's answer becomes for
the client is its adapter's (:meth:`UpstreamAdapter.client_error`: 4xx kept, a 404 for
a served model a 503, 5xx kept), written in the policy's error dialect. A 2xx body
that is not a valid embeddings answer for this request (wrong count, wrong size, NaN,
``index`` values that are not each input once) is a 502: never a 200 with bad vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from extproc.core.embeddings_body import EmbeddingsBody
from extproc.core.error_envelope import OPENAI_ERRORS, ApiError, ErrorDialect
from extproc.core.plan import Encoding, ResponsePlan
from extproc.core.status import is_success
from extproc.core.upstream_errors import parse_upstream_error
from extproc.core.upstreams import adapter_for
from extproc.core.upstreams.adapter import client_error
from extproc.core.vectors import BadVectorsError, encode_base64, truncate, truncate_renormalise


@dataclass(frozen=True)
class ClientAnswer:
    status: int
    body: bytes
    prompt_tokens: int | None = None  # the upstream's usage, where its answer was read


def needs_response_body(plan: ResponsePlan | None, status: int) -> bool:
    """Decided on the response headers: must the gateway see (and buffer) the body?"""
    if not is_success(status):
        return True
    return plan is not None and plan.needs_response


def rewrite_response(
    plan: ResponsePlan | None, status: int, body: bytes, errors: ErrorDialect = OPENAI_ERRORS
) -> ClientAnswer | None:
    """The client's answer; ``None`` means pass the upstream's answer on unchanged.
    Errors are written in ``errors``' shape (their status is the upstream's)."""
    if not is_success(status):
        return _answer(_error_answer(plan, status, body), errors)
    if plan is None or not plan.needs_response:
        return None
    try:
        if not plan.rewrites_vectors:  # check_only: a good answer passes unchanged
            _checked_rows(plan, body)
            return None
        return _rewrite_vectors(plan, status, body)
    except BadVectorsError as exc:
        return _answer(
            ApiError(
                502,
                f"The upstream returned an invalid embeddings response: {exc}.",
                type="server_error",
                code="bad_upstream_response",
            ),
            errors,
        )


def _rewrite_vectors(plan: ResponsePlan, status: int, body: bytes) -> ClientAnswer:
    answer = _checked_rows(plan, body)
    doc, items, matrix = answer.doc, answer.items, answer.vectors
    if plan.dimensions is not None:
        cut = truncate_renormalise if plan.renormalise else truncate
        matrix = cut(matrix, plan.dimensions)
    for item, row in zip(items, matrix, strict=True):
        if plan.client_encoding is Encoding.BASE64:
            item["embedding"] = encode_base64(row)
        else:
            item["embedding"] = row  # orjson writes float32 in shortest round-trip form
    doc["data"] = items
    doc["model"] = plan.model
    try:
        written = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:
        # orjson reads 1,024 nested levels but writes only 254: an extra field nested
        # deeper cannot be re-encoded, and that is the upstream's answer being unusable.
        raise BadVectorsError("it nests arrays or objects too deeply to re-encode") from None
    return ClientAnswer(status, written, answer.prompt_tokens)


def _checked_rows(plan: ResponsePlan, body: bytes) -> EmbeddingsBody:
    """The answer, checked against what the plan asked the upstream for."""
    return adapter_for(plan.upstream_kind).parse_success(
        body, input_count=plan.input_count, dimensions=plan.native_dimensions
    )


def _error_answer(plan: ResponsePlan | None, status: int, body: bytes) -> ApiError:
    # Without a plan the gateway never matched the request to a model, so which
    # upstream kind answered is unknown: the tolerant parser reads every kind's shape.
    if plan is None:
        return client_error(status, parse_upstream_error(body), None)
    return adapter_for(plan.upstream_kind).client_error(status, body, plan.model)


def _answer(error: ApiError, errors: ErrorDialect) -> ClientAnswer:
    # The upstream's status stays: only the gateway's own refusals take the dialect's.
    return ClientAnswer(error.status, errors.body(error, error.status))
