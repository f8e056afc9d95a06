"""Upstream answer + :class:`ResponsePlan` -> what the client receives (sans-I/O).

Success: vectors are cut and re-normalised (Matryoshka emulation) and re-encoded
to the client's encoding; everything else in the body is kept. Errors: every
non-2xx gets the OpenAI envelope. Status rules, for a request the gateway
validated (a ``plan`` exists):

- upstream 4xx keep their status, except 404: the gateway already knows the
  model, so a 404 means the upstream lost it (Dynamo answers an empty 404 once its
  worker is gone) - a fault, answered 503;
- upstream 5xx stay 5xx with ``type: server_error``: never relabelled 400, since
  the gateway answers every client mistake itself before the upstream sees it;
- a 2xx body that is not a valid embeddings answer for this request (wrong count,
  wrong size, NaN, ``index`` values that are not each input once) is a 502:
  never a 200 with bad vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from extproc.core.embeddings_body import EmbeddingsBody
from extproc.core.error_envelope import (
    OPENAI_ERRORS,
    UPSTREAM_CODE,
    ApiError,
    ErrorDialect,
    type_for_status,
)
from extproc.core.plan import Encoding, ResponsePlan
from extproc.core.status import is_success
from extproc.core.upstream_errors import parse_upstream_error
from extproc.core.upstreams import adapter_for
from extproc.core.vectors import BadVectorsError, encode_base64, truncate, truncate_renormalise


@dataclass(frozen=True)
class ClientAnswer:
    status: int
    body: bytes


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
        return ClientAnswer(status, _rewrite_vectors(plan, body))
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


def _rewrite_vectors(plan: ResponsePlan, body: bytes) -> bytes:
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
        return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:
        # orjson reads 1,024 nested levels but writes only 254: an extra field nested
        # deeper cannot be re-encoded, and that is the upstream's answer being unusable.
        raise BadVectorsError("it nests arrays or objects too deeply to re-encode") from None


def _checked_rows(plan: ResponsePlan, body: bytes) -> EmbeddingsBody:
    """The answer, checked against what the plan asked the upstream for."""
    return adapter_for(plan.upstream_kind).parse_success(
        body, input_count=plan.input_count, dimensions=plan.native_dimensions
    )


def _error_answer(plan: ResponsePlan | None, status: int, body: bytes) -> ApiError:
    # Without a plan the gateway never matched the request to a model, so which
    # upstream kind answered is unknown: the tolerant parser reads every kind's shape.
    if plan is None:
        upstream = parse_upstream_error(body)
    else:
        upstream = adapter_for(plan.upstream_kind).parse_error(status, body)
    detail = upstream.message or "no details given"
    if plan is not None and status == 404:
        error = ApiError(
            503,
            f"The upstream does not serve model {plan.model!r} right now "
            f"(it answered 404: {detail}).",
            type="server_error",
            code="model_unavailable",
        )
    elif 500 <= status < 600:
        error = ApiError(
            status,
            f"The upstream failed to process the request (HTTP {status}: {detail}).",
            type="server_error",
            code=UPSTREAM_CODE,
        )
    elif 400 <= status < 500:
        error = ApiError(
            status,
            upstream.message or f"The upstream rejected the request with HTTP {status}.",
            type=type_for_status(status),
            param=upstream.param,
            code=UPSTREAM_CODE,
        )
    else:
        # 1xx/3xx on an embeddings call: nothing a client can use. So is a status HTTP
        # does not have (>= 600, or garbage read as 0), which must never reach the
        # client as its status (Envoy's status is an int32; 10**300 is not).
        error = ApiError(
            502,
            f"The upstream answered HTTP {status}, not an embeddings response.",
            type="server_error",
            code="bad_upstream_response",
        )
    return error


def _answer(error: ApiError, errors: ErrorDialect) -> ClientAnswer:
    # The upstream's status stays: only the gateway's own refusals take the dialect's.
    return ClientAnswer(error.status, errors.body(error, error.status))
