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
  wrong size, NaN) is a 502: never a 200 with bad vectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from extproc.errors import ApiError, type_for_status
from extproc.plan import Encoding, ResponsePlan
from extproc.upstream_errors import parse_upstream_error
from extproc.vectors import BadVectorsError, decode_rows, encode_base64, truncate_renormalise


@dataclass(frozen=True)
class ClientAnswer:
    status: int
    body: bytes


def is_success(status: int) -> bool:
    return 200 <= status < 300


def needs_response_body(plan: ResponsePlan | None, status: int) -> bool:
    """Decided on the response headers: must the gateway see (and buffer) the body?"""
    if not is_success(status):
        return True
    return plan is not None and plan.rewrites_vectors


def rewrite_response(plan: ResponsePlan | None, status: int, body: bytes) -> ClientAnswer | None:
    """The client's answer; ``None`` means pass the upstream's answer on unchanged."""
    if not is_success(status):
        return _error_answer(plan, status, body)
    if plan is None or not plan.rewrites_vectors:
        return None
    try:
        return ClientAnswer(status, _rewrite_vectors(plan, body))
    except BadVectorsError as exc:
        return _answer(
            ApiError(
                502,
                f"The upstream returned an invalid embeddings response: {exc}.",
                type="server_error",
                code="bad_upstream_response",
            )
        )


def _rewrite_vectors(plan: ResponsePlan, body: bytes) -> bytes:
    try:
        doc: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadVectorsError("the body is not JSON") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise BadVectorsError("it has no 'data' array")
    if len(data) != plan.input_count:
        raise BadVectorsError(f"{len(data)} embeddings for {plan.input_count} inputs")
    if not all(isinstance(item, dict) for item in data):
        raise BadVectorsError("an item of 'data' is not an object")
    # The upstream may answer out of order; 'index' says which input each row is.
    items = sorted(
        data, key=lambda item: item.get("index", 0) if isinstance(item.get("index"), int) else 0
    )
    matrix = decode_rows([item.get("embedding") for item in items], plan.native_dimensions)
    if plan.dimensions is not None:
        matrix = truncate_renormalise(matrix, plan.dimensions)
    for item, row in zip(items, matrix, strict=True):
        if plan.client_encoding is Encoding.BASE64:
            item["embedding"] = encode_base64(row)
        else:
            item["embedding"] = row  # orjson writes float32 in shortest round-trip form
    doc["data"] = items
    doc["model"] = plan.model
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def _error_answer(plan: ResponsePlan | None, status: int, body: bytes) -> ClientAnswer:
    upstream = parse_upstream_error(body)
    detail = upstream.message or "no details given"
    if plan is not None and status == 404:
        error = ApiError(
            503,
            f"The upstream does not serve model {plan.model!r} right now "
            f"(it answered 404: {detail}).",
            type="server_error",
            code="model_unavailable",
        )
    elif status >= 500:
        error = ApiError(
            status,
            f"The upstream failed to process the request (HTTP {status}: {detail}).",
            type="server_error",
            code="upstream_error",
        )
    elif status >= 400:
        error = ApiError(
            status,
            upstream.message or f"The upstream rejected the request with HTTP {status}.",
            type=type_for_status(status),
            param=upstream.param,
            code="upstream_error",
        )
    else:  # 1xx/3xx on an embeddings call: nothing a client can use
        error = ApiError(
            502,
            f"The upstream answered HTTP {status}, not an embeddings response.",
            type="server_error",
            code="bad_upstream_response",
        )
    return _answer(error)


def _answer(error: ApiError) -> ClientAnswer:
    return ClientAnswer(error.status, error.envelope())
