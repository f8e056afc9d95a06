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

from collections.abc import Callable
from typing import Any

import orjson

from extproc.core.answer_layout import AnswerLayout, lay_out
from extproc.core.api_errors import ApiError, ServerError
from extproc.core.embeddings_body import EmbeddingsBody
from extproc.core.endpoint import ClientAnswer
from extproc.core.error_dialect import OPENAI_ERRORS, ErrorDialect
from extproc.core.plan import Encoding, ResponsePlan
from extproc.core.status import is_success
from extproc.core.upstreams import adapter_for
from extproc.core.vectors import (
    BadVectorsError,
    FloatMatrix,
    encode_base64,
    truncate,
    truncate_renormalise,
)

# Writes the client's 2xx body: the plan, the upstream's checked answer, the vectors
# the client gets (cut where the plan says) and the legacy server's layout, if any.
AnswerWriter = Callable[[ResponsePlan, EmbeddingsBody, FloatMatrix, AnswerLayout | None], bytes]


def rewrite_response(
    plan: ResponsePlan,
    status: int,
    body: bytes,
    errors: ErrorDialect = OPENAI_ERRORS,
    *,
    write: AnswerWriter | None = None,
    layout: AnswerLayout | None = None,
) -> ClientAnswer | None:
    """The client's answer; ``None`` means pass the upstream's answer on unchanged.
    Errors are written in ``errors``' shape (their status is the upstream's); a 2xx
    by ``write`` (default: OpenAI's shape, the upstream's own)."""
    if not is_success(status):
        error = adapter_for(plan.upstream_kind).client_error(status, body, plan.model)
        return _answer(error, errors)
    if not plan.needs_response:
        return None
    try:
        answer = _checked_rows(plan, body)
        if not (plan.rewrites_vectors or plan.reshape):  # checked: a good one passes
            return None
        matrix = answer.vectors
        if plan.dimensions is not None:
            cut = truncate_renormalise if plan.renormalise else truncate
            matrix = cut(matrix, plan.dimensions)
        written = (write or write_openai_answer)(plan, answer, matrix, layout)
    except BadVectorsError as exc:
        fault = ServerError(
            502,
            f"The upstream returned an invalid embeddings response: {exc}.",
            code="bad_upstream_response",
        )
        return _answer(fault, errors)
    return ClientAnswer(status, written, answer.prompt_tokens)


def write_openai_answer(
    plan: ResponsePlan, answer: EmbeddingsBody, matrix: FloatMatrix, layout: AnswerLayout | None
) -> bytes:
    """OpenAI's body: the upstream's own, its vectors replaced (cut, re-encoded) and
    ``model`` the client's name, every other field kept; or, in the legacy server's
    ``layout``, the same vectors and usage."""
    # orjson writes float32 in shortest round-trip form
    base64 = plan.client_encoding is Encoding.BASE64
    embeddings = [encode_base64(row) if base64 else row for row in matrix]
    return openai_body(plan, answer, embeddings, layout)


def openai_body(
    plan: ResponsePlan, answer: EmbeddingsBody, embeddings: list[Any], layout: AnswerLayout | None
) -> bytes:
    """The upstream's OpenAI-shaped body (or the legacy ``layout``) carrying
    ``embeddings``, one value an input, whatever each is (a vector, a base64 string,
    an object by type)."""
    doc: Any
    if layout is not None:
        doc = lay_out(
            layout,
            model=plan.model,
            embeddings=embeddings,
            upstream=answer.doc,
            prompt_tokens=answer.prompt_tokens,
        )
    else:
        doc, items = answer.doc, answer.items
        for item, embedding in zip(items, embeddings, strict=True):
            item["embedding"] = embedding
        doc["data"] = items
        doc["model"] = plan.model
    return dump(doc)


def dump(doc: Any) -> bytes:
    """A 2xx body as bytes (numpy vectors included)."""
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


def _answer(error: ApiError, errors: ErrorDialect) -> ClientAnswer:
    # The upstream's status stays: only the gateway's own refusals take the dialect's.
    return ClientAnswer(error.status, errors.write(error, error.status))
