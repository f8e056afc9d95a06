"""The per-stream ext_proc state machine: one HTTP request, one gRPC stream.

Rules (Envoy 1.40, verified live; the Envoy behaviour they rely on: docs/envoy-facts.md):

1. Envoy sends, in order, whichever of these the filter's processing mode asks
   for: request_headers, request_body, response_headers, response_body (trailers
   never, with our configs). Each message gets exactly one reply, of the same kind.
   Every body mode the configs name is BUFFERED, so each body comes as ONE message
   holding the whole body. Its ``end_of_stream`` is false when trailers follow the
   body (an HTTP/2 client's, an upstream's, the byte counts Envoy's decompressor
   adds after a body it decoded): Envoy sends the buffered body when the trailers
   arrive, before them. Such a body is still the whole body and goes through the
   contract like any other; the trailers then pass unchanged.
   One state machine serves both shipped shapes: envoy/single-filter.yaml (one
   stream sees the whole exchange) and envoy/standalone.yaml (the request body,
   after the request headers on its route for large or unsized bodies; then, when
   the response must change and Envoy's precheck saw it coming, the
   response body on the same stream with the status as an attribute; when the
   precheck missed it, the response on a second stream whose first message
   carries the plan as dynamic metadata, namespace ``embgw``).
2. Request headers, when sent, are checked first: a path that is not a spelling
   of the endpoint (404), another method (405), a compressed body (415), a
   bodyless POST, a non-JSON content type or a declared content-length over the
   limit is answered at once, before any body is buffered
   (extproc/core/request_headers.py). When they are skipped (standalone.yaml's
   other routes, which with its Lua filter take these decisions), content type
   and request id arrive as attributes of the body message.
   2b. The reply to accepted request headers tells the upstream what the one-filter
   shape has no other way to tell it: the canonical ``:path`` (no query string;
   Envoy lets ext_proc set ``:path``, and the route already chosen stays),
   ``accept-encoding: identity`` (the gateway may read the answer), no
   ``content-encoding`` (only ``identity`` got here) and, when the client sent
   none, the JSON content type the upstream needs.
3. On the request body the whole request is validated and rewritten (a body
   Envoy decoded, which standalone.yaml marks as dynamic metadata ``embgw.request``,
   is refused in words that name its coding when it does not decode to JSON or
   expands past the decoder's bound: extproc/core/request_coding.py). A client
   mistake is an ``immediate_response`` (4xx envelope) and the stream is DONE:
   nothing reaches the upstream. Otherwise the reply carries the new body (with
   its content-length) and the stream remembers the :class:`ResponsePlan`. If the
   response must change and will come on another stream (standalone.yaml, when its
   precheck missed the rewrite or did not run: its route for large bodies), the
   reply also writes the plan as dynamic metadata and clears the route cache, so
   Envoy re-routes to the rewrite route. When it comes on this stream (the one-filter
   shape, whose streams carry no one-message mark, or standalone.yaml's one-stream
   route, whose ``ExtProcPerRoute`` adds the gRPC
   metadata ``x-embgw-response-on-stream: 1``), neither is needed: the one-stream
   route's reply carries only ``embgw.respond``, the cue for the Lua filter that
   holds the response headers (rule 5b).
4. On the response headers the gateway decides whether it needs the body: for any
   non-2xx, or a 2xx whose vectors must change. If so, it sets ``mode_override``
   to BUFFERED (both body modes restated: Envoy takes them literally); if not, the
   response streams to the client untouched (PASS_THROUGH; a body that arrives
   anyway, under a config that always buffers, is answered neutrally). A bodyless
   error (Dynamo's empty 404) is answered with an ``immediate_response``.
   Envoy's own local replies (no ``via_upstream`` code details) are already
   enveloped by the Envoy config's local_reply_config and pass untouched.
5. On the response body the answer is rewritten, with ``:status``,
   content-type and content-length set in the same reply.
   5b. When the response headers were skipped (standalone.yaml: extproc.request
   on its one-stream route, or extproc.response; one message instead of two), the
   body message carries the status as the ``response.code`` attribute and rule
   4's decision is taken here. Envoy ignores header mutations in this reply, so the client's status
   also goes out as dynamic metadata (``embgw.status``) for the Lua filter that
   holds the headers. A body without that attribute is an anomaly (rule 6).
6. Anything out of order (a message after DONE, a second body message, a body
   before its headers where that cannot happen) is answered with a neutral reply
   of the same kind and counted, never raised: a confused Envoy must not get a
   crashed stream, and a neutral reply to a response-phase message can only leave
   the upstream's own answer in place.
7. Admission control (extproc/service/admission.py, applied by the servicer) may
   refuse a request instead of rule 2b or 3: a 503 ``overloaded`` envelope with
   ``Retry-After``, the stream DONE, nothing forwarded. When the request headers
   are sent (single-filter.yaml and the meshes; standalone.yaml's route for large
   or unsized bodies) it admits them before Envoy sends the body to the server,
   keeping room for their declared Content-Length (the body limit when none is
   declared) for as long as that body takes at the policy's floor upload rate.
   The body, when it comes, is admitted as work in flight, in every config.
"""

from __future__ import annotations

import enum
import functools
import math
import time
from dataclasses import dataclass, field
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from extproc.core.contract import Contract
from extproc.core.error_envelope import ApiError
from extproc.core.plan import ResponsePlan
from extproc.core.request_coding import METADATA_NAMESPACE, BodyCoding
from extproc.core.request_headers import (
    check_content_encoding,
    check_content_type,
    check_declared_length,
    check_has_body,
    check_method,
    declared_length,
    upstream_path,
)
from extproc.core.request_rewrite import rewrite_request
from extproc.core.response_rewrite import ClientAnswer, needs_response_body, rewrite_response
from extproc.core.status import is_success
from extproc.service import metrics

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
_Attributes = Any


class Phase(enum.Enum):
    AWAIT_REQUEST = "await_request"
    AWAIT_RESPONSE_HEADERS = "await_response_headers"
    AWAIT_RESPONSE_BODY = "await_response_body"
    PASS_THROUGH = "pass_through"  # response left as it is; a body may still come
    DONE = "done"


@dataclass
class ExtProcStream:
    """State of one stream. Feed each ProcessingRequest to :meth:`handle`."""

    contract: Contract
    phase: Phase = Phase.AWAIT_REQUEST
    plan: ResponsePlan | None = None
    request_id: str = "-"
    content_type: str | None = None
    body_coding: BodyCoding | None = None  # the body was decoded by Envoy (standalone.yaml)
    upstream_status: int = 0
    # Set by accepted request headers (rule 2): a body follows, of this declared size
    # (None: unknown, chunked or HTTP/2 without Content-Length). Rule 7 admits it.
    body_expected: bool = False
    declared_length: int | None = None
    started: float = field(default_factory=time.perf_counter)
    # Rule 3, set by the servicer from the stream's gRPC metadata. whole_exchange: the
    # filter sends this stream the whole exchange (single-filter.yaml, whose streams
    # carry no one-message mark), so a rewritten response comes on it and needs
    # neither plan metadata nor re-route nor cue. response_on_stream: standalone.yaml's
    # one-stream route, where the response comes on this stream too and the reply
    # carries only the cue for the Lua filter that holds the response headers. Neither
    # (standalone.yaml's other routes, its route for large bodies, which sends the
    # request headers, included): the plan goes as metadata, with a re-route.
    whole_exchange: bool = False
    response_on_stream: bool = False

    @property
    def decided(self) -> bool:
        """Nothing later on this stream can change the answer (DONE, or the response
        left as the upstream sent it)."""
        return self.phase in (Phase.DONE, Phase.PASS_THROUGH)

    @property
    def awaits_request_body(self) -> bool:
        """The request headers were accepted and their body has not come yet."""
        return self.body_expected and self.phase is Phase.AWAIT_REQUEST

    @property
    def response_follows(self) -> bool:
        """The request is forwarded and its response will be processed (on this stream
        or, with standalone.yaml, on a second one)."""
        return (
            self.phase is Phase.AWAIT_RESPONSE_HEADERS
            and self.plan is not None
            and self.plan.needs_response
        )

    def handle(self, request: ep.ProcessingRequest) -> ep.ProcessingResponse:
        kind = request.WhichOneof("request")
        attributes = self._read_attributes(request)
        if kind == "request_body":
            return self._on_request_body(request.request_body)
        if kind == "response_body":
            return self._on_response_body(request.response_body, attributes)
        if kind == "request_headers":
            return self._on_request_headers(request.request_headers)
        if kind == "response_headers":
            return self._on_response_headers(request.response_headers, attributes)
        if kind == "request_trailers":
            return ep.ProcessingResponse(request_trailers=ep.TrailersResponse())
        if kind == "response_trailers":
            return ep.ProcessingResponse(response_trailers=ep.TrailersResponse())
        metrics.count_anomaly("unknown_message")
        return ep.ProcessingResponse()

    # -- request phase ---------------------------------------------------------

    def _on_request_headers(self, headers: ep.HttpHeaders) -> ep.ProcessingResponse:
        if self.phase is not Phase.AWAIT_REQUEST:
            return self._anomaly(
                "request_headers", ep.ProcessingResponse(request_headers=ep.HeadersResponse())
            )
        values = _header_map(headers.headers)
        self.content_type = values.get("content-type", self.content_type)
        self.request_id = values.get("x-request-id", self.request_id)
        path = values.get(":path")
        try:
            target = None if path is None else upstream_path(path)
            check_method(values.get(":method", "POST"))
            check_content_encoding(values.get("content-encoding"))
            check_has_body(headers.end_of_stream)
            check_content_type(self.content_type)
            check_declared_length(values.get("content-length"), self.contract.policy.limits)
        except ApiError as error:
            return self._reject(error)
        self.body_expected = True
        self.declared_length = declared_length(values.get("content-length"))
        reply = ep.ProcessingResponse(request_headers=ep.HeadersResponse())
        # What the upstream is told (rule 2b); the route stays the one Envoy chose.
        mutation = reply.request_headers.response.header_mutation
        if target is not None and target != path:
            _set(mutation, ":path", target)
        _set(mutation, "accept-encoding", "identity")
        if "content-encoding" in values:
            mutation.remove_headers.append("content-encoding")
        if self.content_type is None:
            _set(mutation, "content-type", "application/json")
        return reply

    def _on_request_body(self, body: ep.HttpBody) -> ep.ProcessingResponse:
        if self.phase is not Phase.AWAIT_REQUEST:
            # A BUFFERED body is one message (rule 1), whatever its end_of_stream
            # says: a second one is out of order.
            return self._anomaly(
                "request_body", ep.ProcessingResponse(request_body=ep.BodyResponse())
            )
        started = time.perf_counter()
        try:
            check_content_type(self.content_type)
            forward = rewrite_request(
                body.body,
                self.contract.policy,
                self.contract.tokenizers,
                coding=self.body_coding,
            )
        except ApiError as error:
            metrics.observe_phase("request", started)
            return self._reject(error)
        metrics.record_forward(forward.stats, rewritten=forward.upstream_body is not None)
        self.plan = forward.plan
        self.phase = Phase.AWAIT_RESPONSE_HEADERS
        reply = ep.ProcessingResponse()
        reply.request_body.SetInParent()  # an empty reply must still name its kind
        common = reply.request_body.response  # a reference: protobuf copies on construction
        if forward.upstream_body is not None:
            common.body_mutation.body = forward.upstream_body
            mutation = common.header_mutation
            _set(mutation, "content-length", str(len(forward.upstream_body)))
            mutation.set_headers.append(_JSON_CONTENT_TYPE)
        if forward.plan.needs_response and not self.whole_exchange:
            if self.response_on_stream:
                reply.dynamic_metadata.CopyFrom(_RESPOND_ON_STREAM)
            else:
                # Route the request to where the response filter runs, and hand it the
                # plan (envoy/standalone.yaml, step 3).
                reply.dynamic_metadata.update(
                    {PLAN_NAMESPACE: {"respond": "rewrite", "plan": forward.plan.to_json()}}
                )
                common.clear_route_cache = True
                if forward.upstream_body is None:
                    # Envoy (route_cache_action DEFAULT) honours clear_route_cache only
                    # in a reply that mutates headers: a body checked but not changed
                    # (check_responses) has none of its own, so state the content type.
                    common.header_mutation.set_headers.append(_JSON_CONTENT_TYPE)
        metrics.observe_phase("request", started)
        return reply

    def _reject(self, error: ApiError) -> ep.ProcessingResponse:
        metrics.record_rejection(error.status, error.param)
        self.phase = Phase.DONE
        return ep.ProcessingResponse(
            immediate_response=immediate_response(error.status, error.envelope())
        )

    def refuse_overloaded(self, error: ApiError, retry_after_s: int) -> ep.ProcessingResponse:
        """Rule 7: the process is at capacity. Not a client mistake, so counted only by
        the admission metrics (the servicer's), not as a rejection."""
        self.phase = Phase.DONE
        self.plan = None
        reply = ep.ProcessingResponse(
            immediate_response=immediate_response(error.status, error.envelope())
        )
        _set(reply.immediate_response.headers, "retry-after", str(retry_after_s))
        return reply

    # -- response phase --------------------------------------------------------

    def _on_response_headers(
        self, headers: ep.HttpHeaders, attributes: _Attributes
    ) -> ep.ProcessingResponse:
        neutral = ep.ProcessingResponse(response_headers=ep.HeadersResponse())
        if self.phase not in (Phase.AWAIT_RESPONSE_HEADERS, Phase.AWAIT_REQUEST):
            return self._anomaly("response_headers", neutral)
        values = _header_map(headers.headers)
        try:
            status = int(values.get(":status", "0"))
        except ValueError:
            status = 0
        if self._decide(status, attributes) is Phase.PASS_THROUGH:
            return neutral
        if headers.end_of_stream:
            answer = rewrite_response(self.plan, status, b"")
            self.phase = Phase.DONE
            if answer is None:
                return neutral
            metrics.count_response_rewritten("error_envelope")
            return ep.ProcessingResponse(
                immediate_response=immediate_response(answer.status, answer.body)
            )
        self.phase = Phase.AWAIT_RESPONSE_BODY
        neutral.mode_override.request_body_mode = _BUFFERED
        neutral.mode_override.response_body_mode = _BUFFERED
        if not is_success(status):
            # This error gets the envelope here; standalone.yaml's custom_response
            # must not envelope it again (it acts only on answers with this header).
            mutation = neutral.response_headers.response.header_mutation
            mutation.remove_headers.append(UPSTREAM_TIME_HEADER)
        return neutral

    def _on_response_body(
        self, body: ep.HttpBody, attributes: _Attributes
    ) -> ep.ProcessingResponse:
        neutral = ep.ProcessingResponse()
        neutral.response_body.SetInParent()
        if self.phase is Phase.PASS_THROUGH:
            # Configs that always buffer the response (the benchmark's naive one)
            # send it even though the headers decided nothing changes.
            return neutral
        headers_skipped = self.phase in (Phase.AWAIT_REQUEST, Phase.AWAIT_RESPONSE_HEADERS)
        if headers_skipped:
            # Rule 5b: the response headers were skipped (standalone.yaml); the status
            # came as an attribute of this message.
            decided = self._take_status_attribute(attributes)
            if decided is None:
                return self._anomaly("response_body", neutral)
            if decided is Phase.PASS_THROUGH:
                return neutral
        if self.phase is not Phase.AWAIT_RESPONSE_BODY:
            return self._anomaly("response_body", neutral)
        started = time.perf_counter()
        self.phase = Phase.DONE
        answer = rewrite_response(self.plan, self.upstream_status, body.body)
        metrics.observe_phase("response", started)
        metrics.observe_total(self.started)
        if answer is None:
            return neutral
        kind = "vectors" if is_success(answer.status) else "error_envelope"
        metrics.count_response_rewritten(kind)
        reply = ep.ProcessingResponse()
        _replace_body(reply.response_body.response, answer)  # in place: no body copies
        if headers_skipped:
            # Envoy ignores header mutations here (it never had the headers): the
            # status travels as metadata to standalone.yaml's Lua filter, which holds
            # the headers until this body is rewritten and then applies it.
            reply.dynamic_metadata.CopyFrom(_status_metadata(answer.status))
        return reply

    def _take_status_attribute(self, attributes: _Attributes) -> Phase | None:
        """Rule 4's decision from the ``response.code`` attribute (headers skipped):
        the new phase (AWAIT_RESPONSE_BODY: rewrite it; PASS_THROUGH: leave it), or
        None when the attribute is missing or unusable."""
        code = _attribute(attributes, RESPONSE_CODE_ATTR)
        # Three ASCII digits only: "²".isdigit() is true and int() refuses it, as it
        # refuses 4,301 digits.
        if code is None or not (code.isascii() and code.isdigit() and len(code) == 3):
            return None
        return self._decide(int(code), attributes)

    def _decide(self, status: int, attributes: _Attributes) -> Phase:
        """Rule 4, from the response headers or the status attribute: PASS_THROUGH
        (leave the response as it is) or AWAIT_RESPONSE_BODY (it must be seen)."""
        self.upstream_status = status
        details = _attribute(attributes, CODE_DETAILS_ATTR)
        if details is not None and details != "via_upstream":
            # Envoy's own local reply (413, 503, 504...): local_reply_config already
            # gave it the envelope.
            metrics.count_upstream_response("local")
            self.phase = Phase.PASS_THROUGH
        else:
            metrics.count_upstream_response(_status_class(status))
            if needs_response_body(self.plan, status):
                self.phase = Phase.AWAIT_RESPONSE_BODY
            else:
                self.phase = Phase.PASS_THROUGH
                metrics.observe_total(self.started)
        return self.phase

    # -- helpers ---------------------------------------------------------------

    def _anomaly(self, kind: str, reply: ep.ProcessingResponse) -> ep.ProcessingResponse:
        metrics.count_anomaly(kind)
        return reply

    def _read_attributes(self, request: ep.ProcessingRequest) -> _Attributes:
        """The message's ext_proc attributes (None: it has none), after taking the
        content type, the request id, the plan and how the body was coded from them
        and from the metadata."""
        if request.HasField("metadata_context"):
            if self.plan is None:
                self.plan = _plan_from_metadata(request)
            self.body_coding = _coding_from_metadata(request) or self.body_coding
        if not request.attributes:
            return None
        struct = request.attributes.get(ATTRIBUTES_KEY)
        if struct is None:
            return None
        attributes = struct.fields
        content_type = _attribute(attributes, CONTENT_TYPE_ATTR)
        if content_type is not None:
            self.content_type = content_type
        request_id = _attribute(attributes, REQUEST_ID_ATTR)
        if request_id is not None:
            self.request_id = request_id
        return attributes


def _attribute(attributes: _Attributes, name: str) -> str | None:
    if attributes is None or name not in attributes:
        return None
    value: Any = attributes[name]
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return str(value.string_value)
    if kind == "number_value" and math.isfinite(value.number_value):
        return str(int(value.number_value))
    return None


def _plan_from_metadata(request: ep.ProcessingRequest) -> ResponsePlan | None:
    struct = request.metadata_context.filter_metadata.get(PLAN_NAMESPACE)
    if struct is None or "plan" not in struct.fields:
        return None
    value = struct.fields["plan"]
    if value.WhichOneof("kind") != "string_value":
        return None
    return ResponsePlan.from_json(value.string_value)


def _coding_from_metadata(request: ep.ProcessingRequest) -> BodyCoding | None:
    struct = request.metadata_context.filter_metadata.get(METADATA_NAMESPACE)
    if struct is None:
        return None
    fields = {
        key: value.string_value
        for key, value in struct.fields.items()
        if value.WhichOneof("kind") == "string_value"
    }
    return BodyCoding.from_metadata(fields)


def _header_map(headers: base_pb2.HeaderMap) -> dict[str, str]:
    return {
        h.key.lower(): (h.raw_value.decode("latin-1") if h.raw_value else h.value)
        for h in headers.headers
    }


def _set(mutation: ep.HeaderMutation, key: str, value: str) -> None:
    # raw_value, not value: Envoy 1.40 sends an empty header for `value` alone.
    option = mutation.set_headers.add(append_action=_OVERWRITE)
    option.header.key = key
    option.header.raw_value = value.encode("latin-1")


# Replies built once and copied in (protobuf copies on append and CopyFrom): faster
# than building them per request.
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_JSON_CONTENT_TYPE = base_pb2.HeaderValueOption(
    header=base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"),
    append_action=_OVERWRITE,
)
_RESPOND_ON_STREAM = struct_pb2.Struct()
_RESPOND_ON_STREAM.update({PLAN_NAMESPACE: {"respond": "rewrite"}})


@functools.cache
def _status_metadata(status: int) -> struct_pb2.Struct:
    """``embgw.status`` for standalone.yaml's Lua filter (rule 5b): built once per
    HTTP status (at most a few hundred values)."""
    struct = struct_pb2.Struct()
    struct.update({PLAN_NAMESPACE: {"status": str(status)}})
    return struct


def immediate_response(status: int, body: bytes) -> ep.ImmediateResponse:
    response = ep.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),
        body=body,
        details=LOCAL_REPLY_DETAILS,
    )
    _set(response.headers, "content-type", "application/json")
    return response


def _replace_body(common: ep.CommonResponse, answer: ClientAnswer) -> None:
    common.body_mutation.body = answer.body
    mutation = common.header_mutation
    _set(mutation, ":status", str(answer.status))
    mutation.set_headers.append(_JSON_CONTENT_TYPE)
    _set(mutation, "content-length", str(len(answer.body)))
    if answer.status >= 400:
        # Already enveloped: keep standalone.yaml's custom_response from enveloping
        # it again (it only acts on answers that carry this router header).
        mutation.remove_headers.append(UPSTREAM_TIME_HEADER)


def _status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "invalid"
