"""Envoy's ext_proc messages as the state machine reads and answers them: the
attributes and metadata it takes from a ProcessingRequest, and every reply it sends
back, built whole here from what extproc/service/stream.py decided (no decisions
here). An :class:`ApiError` becomes a reply in one place, :func:`error_answer`. The
Envoy behaviour each piece relies on: docs/envoy-facts.md.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import struct_pb2

from extproc.core.api_errors import ApiError
from extproc.core.endpoint import ClientAnswer
from extproc.core.error_dialect import ErrorDialect
from extproc.core.plan import ResponsePlan
from extproc.core.request_coding import METADATA_NAMESPACE, BodyCoding

ATTRIBUTES_KEY = "envoy.filters.http.ext_proc"
PLAN_NAMESPACE = "embgw"  # dynamic metadata namespace shared by the two filters
UPSTREAM_TIME_HEADER = "x-envoy-upstream-service-time"
CONTENT_TYPE_ATTR = "request.headers['content-type']"
REQUEST_ID_ATTR = "request.id"
CODE_DETAILS_ATTR = "response.code_details"
RESPONSE_CODE_ATTR = "response.code"
LOCAL_REPLY_DETAILS = "extproc_gateway_answer"  # marks our immediate responses

_BUFFERED = processing_mode_pb2.ProcessingMode.BUFFERED
# The fields of a message's attribute Struct (a protobuf map of name -> Value), or None.
Attributes = Any

# -- reading ---------------------------------------------------------------------------


def attributes_of(request: ep.ProcessingRequest) -> Attributes:
    """The message's ext_proc attributes, or None when it has none."""
    if not request.attributes:
        return None
    struct = request.attributes.get(ATTRIBUTES_KEY)
    return None if struct is None else struct.fields


def attribute(attributes: Attributes, name: str) -> str | None:
    """A string or whole-number attribute as text; None when absent or of another kind."""
    if attributes is None or name not in attributes:
        return None
    value: Any = attributes[name]
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return str(value.string_value)
    if kind == "number_value" and math.isfinite(value.number_value):
        return str(int(value.number_value))
    return None


def plan_from_metadata(request: ep.ProcessingRequest) -> ResponsePlan | None:
    """The plan the request's stream wrote as ``embgw.plan`` (standalone.yaml's
    response stream), or None."""
    struct = request.metadata_context.filter_metadata.get(PLAN_NAMESPACE)
    if struct is None or "plan" not in struct.fields:
        return None
    value = struct.fields["plan"]
    if value.WhichOneof("kind") != "string_value":
        return None
    return ResponsePlan.from_json(value.string_value)


def coding_from_metadata(request: ep.ProcessingRequest) -> BodyCoding | None:
    """How a body Envoy decoded was sent (standalone.yaml's ``embgw.request``), or None."""
    struct = request.metadata_context.filter_metadata.get(METADATA_NAMESPACE)
    if struct is None:
        return None
    fields = {
        key: value.string_value
        for key, value in struct.fields.items()
        if value.WhichOneof("kind") == "string_value"
    }
    return BodyCoding.from_metadata(fields)


def header_map(headers: base_pb2.HeaderMap) -> dict[str, str]:
    return {
        h.key.lower(): (h.raw_value.decode("latin-1") if h.raw_value else h.value)
        for h in headers.headers
    }


def status_of(headers: dict[str, str]) -> int:
    """The response's ``:status``; 0 when it is not a number."""
    try:
        return int(headers.get(":status", "0"))
    except ValueError:
        return 0


# -- answering -------------------------------------------------------------------------


def neutral(kind: str | None) -> ep.ProcessingResponse:
    """The reply of the message's own kind that changes nothing (no kind for a
    message of none)."""
    reply = ep.ProcessingResponse()
    if kind is not None:
        getattr(reply, kind).SetInParent()  # an empty reply must still name its kind
    return reply


def exchange_passed() -> ep.ProcessingResponse:
    """The reply to request headers the gateway leaves alone, whole: nothing more of
    this exchange is sent to it (its body, the response), so it streams untouched."""
    reply = ep.ProcessingResponse()
    reply.request_headers.SetInParent()
    mode = reply.mode_override
    mode.request_body_mode = processing_mode_pb2.ProcessingMode.NONE
    mode.response_header_mode = processing_mode_pb2.ProcessingMode.SKIP
    mode.response_body_mode = processing_mode_pb2.ProcessingMode.NONE
    return reply


def error_answer(
    error: ApiError, dialect: ErrorDialect, *, retry_after_s: int | None = None
) -> ep.ProcessingResponse:
    """The gateway's own answer for ``error``, in the policy's error dialect, in place
    of the upstream's; ``Retry-After`` when given. The one place an ApiError becomes a
    reply."""
    reply = immediate_response(*dialect.answer(error))
    if retry_after_s is not None:
        _set_header(reply.immediate_response.headers, "retry-after", str(retry_after_s))
    return reply


def immediate_response(status: int, body: bytes) -> ep.ProcessingResponse:
    """The gateway's own answer to the client, in place of the upstream's."""
    reply = ep.ProcessingResponse()
    response = reply.immediate_response
    response.status.code = status
    response.body = body
    response.details = LOCAL_REPLY_DETAILS
    _set_header(response.headers, "content-type", "application/json")
    return reply


def request_headers_accepted(
    *, path: str | None, drop_content_encoding: bool, add_json_content_type: bool
) -> ep.ProcessingResponse:
    """The reply to accepted request headers: ``path`` in place of the client's (None:
    left as sent), an answer the gateway can read (``accept-encoding: identity``), the
    client's ``content-encoding`` dropped and the JSON content type added when asked."""
    reply = ep.ProcessingResponse()
    mutation = reply.request_headers.response.header_mutation
    if path is not None:
        _set_header(mutation, ":path", path)
    _set_header(mutation, "accept-encoding", "identity")
    if drop_content_encoding:
        mutation.remove_headers.append("content-encoding")
    if add_json_content_type:
        _set_header(mutation, "content-type", "application/json")
    return reply


def request_body_forwarded(
    upstream_body: bytes | None,
    *,
    plan_to_second_stream: str | None = None,
    cue_response_on_stream: bool = False,
) -> ep.ProcessingResponse:
    """The reply to a forwarded request body: ``upstream_body`` in place of the client's,
    with its length (None: the body goes as sent); the plan (as text) handed to the
    response's own stream, or the cue that the response body follows on this one."""
    reply = ep.ProcessingResponse()
    reply.request_body.SetInParent()  # an empty reply must still name its kind
    if upstream_body is not None:
        common = reply.request_body.response
        common.body_mutation.body = upstream_body
        mutation = common.header_mutation
        _set_header(mutation, "content-length", str(len(upstream_body)))
        mutation.set_headers.append(_JSON_CONTENT_TYPE)
    if plan_to_second_stream is not None:
        _route_to_response_filter(
            reply, plan_to_second_stream, body_replaced=upstream_body is not None
        )
    elif cue_response_on_stream:
        # embgw.respond: the cue for standalone.yaml's Lua filter that holds the
        # response headers until the body is rewritten on this stream.
        reply.dynamic_metadata.CopyFrom(_RESPOND_ON_STREAM)
    return reply


def response_headers_buffered(*, enveloped_here: bool) -> ep.ProcessingResponse:
    """The reply to response headers whose body the gateway must see: Envoy is asked
    for the whole body (both body modes stated: Envoy takes them literally). An error
    the gateway envelopes itself loses the upstream's router header (see
    :func:`_drop_upstream_mark`)."""
    reply = ep.ProcessingResponse()
    reply.mode_override.request_body_mode = _BUFFERED
    reply.mode_override.response_body_mode = _BUFFERED
    reply.response_headers.SetInParent()
    if enveloped_here:
        _drop_upstream_mark(reply.response_headers.response.header_mutation)
    return reply


def response_body_replaced(
    answer: ClientAnswer, *, status_as_metadata: bool
) -> ep.ProcessingResponse:
    """The client's answer in place of the upstream's body, with its status and length.
    ``status_as_metadata``: the response headers were never sent on this stream, so
    Envoy ignores header mutations here; the status also goes as ``embgw.status`` to
    standalone.yaml's Lua filter that holds the headers."""
    reply = ep.ProcessingResponse()
    common = reply.response_body.response
    common.body_mutation.body = answer.body  # in place: no body copies
    mutation = common.header_mutation
    _set_header(mutation, ":status", str(answer.status))
    mutation.set_headers.append(_JSON_CONTENT_TYPE)
    _set_header(mutation, "content-length", str(len(answer.body)))
    if answer.status >= 400:
        _drop_upstream_mark(mutation)
    if status_as_metadata:
        reply.dynamic_metadata.CopyFrom(status_metadata(answer.status))
    return reply


def _set_header(mutation: ep.HeaderMutation, key: str, value: str) -> None:
    # raw_value, not value: Envoy sends an empty header for `value` alone.
    option = mutation.set_headers.add(append_action=_OVERWRITE)
    option.header.key = key
    option.header.raw_value = value.encode("latin-1")


def _route_to_response_filter(
    reply: ep.ProcessingResponse, plan: str, *, body_replaced: bool
) -> None:
    """Hand the plan to the second stream as metadata, and have Envoy re-route the
    request to where that stream's filter runs (standalone.yaml, step 3)."""
    reply.dynamic_metadata.update({PLAN_NAMESPACE: {"respond": "rewrite", "plan": plan}})
    common = reply.request_body.response
    common.clear_route_cache = True
    if not body_replaced:
        # Envoy honours clear_route_cache only in a reply that mutates headers; a
        # body passed unchanged has none of its own, so state the content type.
        common.header_mutation.set_headers.append(_JSON_CONTENT_TYPE)


def _drop_upstream_mark(mutation: ep.HeaderMutation) -> None:
    """This error is enveloped already: keep standalone.yaml's custom_response from
    enveloping it again (it acts only on answers that carry this router header)."""
    mutation.remove_headers.append(UPSTREAM_TIME_HEADER)


@functools.cache
def status_metadata(status: int) -> struct_pb2.Struct:
    """``embgw.status``: the client's status for standalone.yaml's Lua filter, which
    holds the headers when Envoy ignores header mutations in the body reply. One per
    HTTP status (a bounded set)."""
    struct = struct_pb2.Struct()
    struct.update({PLAN_NAMESPACE: {"status": str(status)}})
    return struct


# Built once and copied in (protobuf copies on append and CopyFrom).
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_JSON_CONTENT_TYPE = base_pb2.HeaderValueOption(
    header=base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"),
    append_action=_OVERWRITE,
)
_RESPOND_ON_STREAM = struct_pb2.Struct()
_RESPOND_ON_STREAM.update({PLAN_NAMESPACE: {"respond": "rewrite"}})
