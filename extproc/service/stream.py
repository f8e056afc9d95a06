"""The per-stream ext_proc state machine: the messages Envoy sends about one HTTP
request on one gRPC stream, each answered with exactly one reply.

:data:`TRANSITIONS` is the whole machine, as h11's ``_state.py`` is: for each
(phase, message kind) a row, the handler that answers the message and the phases it
may move the stream to. The handler picks the next phase among those only (any other
is a :class:`TransitionError`), and the stream changes only in a row's transition:
the handler reads what it needs of the message, its attributes and metadata
included. A message without a row is out of order or unknown: it gets the neutral
reply of its own kind, is counted as an anomaly and changes nothing. A confused Envoy
must not get a crashed stream, and a neutral reply to a response message can only
leave the upstream's own answer in place.

The servicer's own events are kinds of the table too, with a row in every phase: its
admission control refusing the request (:data:`OVERLOADED`, a 503), a handler that
raised (:data:`PROCESSOR_FAILURE`, a 500: fail closed), and each reply sent
(:data:`REPLY_SENT`: whether the stream ends there, by the rule of its
:class:`Shape`). So the servicer only feeds events and sends replies; it ends the RPC
once the stream is DONE. Every reply is built in extproc/service/envoy_messages.py.

The Envoy behaviour each row relies on: docs/envoy-facts.md, "The ext_proc stream".
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from extproc.core.contract import Contract
from extproc.core.error_envelope import SERVER_ERROR, ApiError, ErrorDialect
from extproc.core.plan import RequestStats, ResponsePlan
from extproc.core.request_coding import BodyCoding
from extproc.core.request_headers import (
    check_content_encoding,
    check_content_type,
    check_declared_length,
    check_has_body,
    check_method,
    declared_length,
    route_of,
    upstream_path,
)
from extproc.core.request_rewrite import rewrite_request
from extproc.core.rerank.dialects import MESH_RERANK_PATHS
from extproc.core.rerank.rerank_rewrite import (
    RerankPlan,
    rewrite_rerank_request,
    rewrite_rerank_response,
)
from extproc.core.rerank.rerank_upstreams import RERANK_UPSTREAMS
from extproc.core.response_rewrite import ClientAnswer, needs_response_body, rewrite_response
from extproc.core.status import is_success
from extproc.service.envoy_messages import (
    CODE_DETAILS_ATTR,
    CONTENT_TYPE_ATTR,
    REQUEST_ID_ATTR,
    RESPONSE_CODE_ATTR,
    Attributes,
    attribute,
    attributes_of,
    coding_from_metadata,
    error_answer,
    exchange_passed,
    header_map,
    immediate_response,
    neutral,
    plan_from_metadata,
    request_body_forwarded,
    request_headers_accepted,
    response_body_replaced,
    response_headers_buffered,
    status_of,
)
from extproc.service.stream_metrics import RewriteKind, StreamMetrics


class Phase(enum.Enum):
    AWAIT_REQUEST = "await_request"
    AWAIT_RESPONSE_HEADERS = "await_response_headers"
    AWAIT_RESPONSE_BODY = "await_response_body"
    PASS_THROUGH = "pass_through"  # response left as it is; a body may still come
    DONE = "done"


class Shape(enum.Enum):
    """How the Envoy config spreads one HTTP exchange over ext_proc streams, as the
    stream's gRPC metadata says (the servicer reads it once per stream)."""

    # One filter (single-filter.yaml, the meshes; no mark): this stream sees the
    # whole exchange, the response headers included.
    WHOLE_EXCHANGE = "whole_exchange"
    # standalone.yaml's one-message streams (`x-embgw-one-message`): a response that
    # must change comes on a second stream, on the route where the response filter
    # runs. That second stream has this shape too.
    RESPONSE_ON_SECOND_STREAM = "response_on_second_stream"
    # standalone.yaml's one-stream route (`x-embgw-response-on-stream` as well): the
    # response body follows on this stream, its headers held by a Lua filter.
    RESPONSE_BODY_ON_THIS_STREAM = "response_body_on_this_stream"


# The servicer's events, fed as message kinds of their own (no field of a
# ProcessingRequest bears these names, so no message of Envoy's takes their rows).
OVERLOADED: Final = "overloaded"  # admission control refused the request
PROCESSOR_FAILURE: Final = "processor_failure"  # handling the last message raised
REPLY_SENT: Final = "reply_sent"  # the reply to the last message has gone to Envoy


@dataclass(frozen=True, slots=True)
class Overloaded:
    """The event of admission control's refusal: the answer, and when to retry."""

    error: ApiError
    retry_after_s: int


# A handler's reply (None: nothing to send, for REPLY_SENT) and the next phase, one
# its row allows.
Step = tuple[ep.ProcessingResponse | None, Phase]


class TransitionError(RuntimeError):
    """A handler returned a phase its row does not allow: a bug of ours, never Envoy's."""


@dataclass
class ExtProcStream:
    """State of one stream. Feed each ProcessingRequest to :meth:`handle`, and the
    servicer's events to :meth:`refuse_overloaded`, :meth:`processor_failed` and
    :meth:`reply_sent`."""

    contract: Contract
    shape: Shape
    metrics: StreamMetrics
    phase: Phase = Phase.AWAIT_REQUEST
    plan: ResponsePlan | RerankPlan | None = None
    # A request to one of the policy's rerank paths (seen in its request headers):
    # the rerank contract, not the embeddings one.
    rerank_path: str | None = None
    request_id: str = "-"
    content_type: str | None = None
    body_coding: BodyCoding | None = None  # the body was decoded by Envoy (standalone.yaml)
    upstream_status: int = 0
    # Set by accepted request headers: a body follows, of this declared size (None:
    # unknown, chunked or HTTP/2 without Content-Length), for the servicer to admit.
    body_expected: bool = False
    declared_length: int | None = None
    started: float = field(default_factory=time.perf_counter)

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
        """The reply to one of Envoy's messages: its row's transition, or for a message
        without a row the neutral reply of its kind, counted as an anomaly."""
        kind = request.WhichOneof("request")
        row = TRANSITIONS.get((self.phase, kind))
        if row is None:
            return self._anomaly(kind)
        handler, next_phases = row
        reply, phase = handler(self, request)
        if phase not in next_phases:
            raise TransitionError(f"{handler.__name__}: {self.phase} -> {phase}")
        self.phase = phase
        return reply

    def refuse_overloaded(self, error: ApiError, retry_after_s: int) -> ep.ProcessingResponse:
        """The reply when the servicer's admission control refused the request."""
        return self._feed(OVERLOADED, Overloaded(error, retry_after_s))

    def processor_failed(self) -> ep.ProcessingResponse:
        """The reply when handling the last message raised (the servicer logs it)."""
        return self._feed(PROCESSOR_FAILURE, None)

    def reply_sent(self) -> bool:
        """The servicer sent the reply to the last message. True: the stream is DONE,
        nothing more on it is for the gateway, and the servicer ends it."""
        self._feed(REPLY_SENT, None)
        return self.phase is Phase.DONE

    def _feed(self, kind: str, event: object) -> ep.ProcessingResponse | None:
        handler, next_phases = TRANSITIONS[(self.phase, kind)]  # a row in every phase
        reply, phase = handler(self, event)
        if phase not in next_phases:
            raise TransitionError(f"{handler.__name__}: {self.phase} -> {phase}")
        self.phase = phase
        return reply

    # -- request phase ---------------------------------------------------------------

    def _check_request_headers(self, request: ep.ProcessingRequest) -> Step:
        """Everything the headers alone can refuse is refused here, before Envoy
        buffers a body (extproc/core/request_headers.py): another path than a
        spelling of the endpoint (404), another method (405), a compressed body
        (415), a POST without a body, a content type that is not JSON, a declared
        length over the limit."""
        headers = request.request_headers
        values = header_map(headers.headers)
        # The headers' own values, else the attributes' (a config may send both).
        self._take_attributes(attributes_of(request))
        self.content_type = values.get("content-type", self.content_type)
        self.request_id = values.get("x-request-id", self.request_id)
        path = values.get(":path")
        if path is not None and self._uncovered_rerank(path):
            return exchange_passed(), Phase.PASS_THROUGH
        try:
            target = None if path is None else self._upstream_path(path)
            check_method(values.get(":method", "POST"))
            check_content_encoding(values.get("content-encoding"))
            check_has_body(headers.end_of_stream)
            check_content_type(self.content_type)
            check_declared_length(values.get("content-length"), self.contract.policy.limits)
        except ApiError as error:
            return self._reject(error)
        self.body_expected = True
        self.declared_length = declared_length(values.get("content-length"))
        # What the upstream is told that the one-filter shape has no other way to
        # tell it: the canonical path (the route Envoy chose stays), an answer the
        # gateway can read, no content-encoding (only identity gets here) and, when
        # the client sent none, the JSON content type.
        reply = request_headers_accepted(
            path=target if target != path else None,
            drop_content_encoding="content-encoding" in values,
            add_json_content_type=self.content_type is None,
        )
        return reply, Phase.AWAIT_REQUEST

    def _uncovered_rerank(self, path: str) -> bool:
        """A rerank path a mesh's filter lets through that the policy does not cover:
        the legacy server's own traffic, left untouched."""
        route = route_of(path)
        return route in MESH_RERANK_PATHS and not self.contract.policy.rerankers_at(route)

    def _upstream_path(self, path: str) -> str:
        """The embeddings endpoint's canonical path, or the rerank upstream's path for
        a request to one of the policy's rerank paths (which the stream then keeps)."""
        route = route_of(path)
        rerankers = self.contract.policy.rerankers_at(route)
        if not rerankers:
            return upstream_path(path)
        self.rerank_path = route
        return RERANK_UPSTREAMS[rerankers[0].upstream_kind].path

    def _forward_request(self, request: ep.ProcessingRequest) -> Step:
        """The whole request through the contract: refused (the client's mistake, in
        the error envelope), or forwarded, rewritten or as sent, with the plan for
        its response. A body Envoy decoded is refused in words that name its coding."""
        # With the request headers skipped, their attributes come with the body.
        self._take_attributes(attributes_of(request))
        if request.HasField("metadata_context"):
            self.body_coding = coding_from_metadata(request) or self.body_coding
        if self.rerank_path is not None:
            return self._forward_rerank(request)
        started = time.perf_counter()
        try:
            check_content_type(self.content_type)
            forward = rewrite_request(
                request.request_body.body,
                self.contract.policy,
                self.contract.tokenizers,
                clock=time.monotonic,
                coding=self.body_coding,
            )
        except ApiError as error:
            self.metrics.phase_seconds("request", time.perf_counter() - started)
            return self._reject(error)
        self.metrics.forwarded(forward.stats, rewritten=forward.upstream_body is not None)
        self.plan = plan = forward.plan
        # Where the response will be processed must get the plan. On this stream it
        # is here already; the one-stream route's Lua filter needs its cue.
        second_stream = plan.needs_response and self.shape is Shape.RESPONSE_ON_SECOND_STREAM
        reply = request_body_forwarded(
            forward.upstream_body,
            plan_to_second_stream=plan if second_stream else None,
            cue_response_on_stream=(
                plan.needs_response and self.shape is Shape.RESPONSE_BODY_ON_THIS_STREAM
            ),
        )
        self.metrics.phase_seconds("request", time.perf_counter() - started)
        return reply, Phase.AWAIT_RESPONSE_HEADERS

    def _forward_rerank(self, request: ep.ProcessingRequest) -> Step:
        """A rerank request: always rewritten, and its answer always rewritten on this
        stream (a rerank route sends the whole exchange)."""
        assert self.rerank_path is not None
        started = time.perf_counter()
        try:
            check_content_type(self.content_type)
            forward = rewrite_rerank_request(
                request.request_body.body,
                self.contract.policy,
                self.rerank_path,
                self.contract.tokenizers,
                clock=time.monotonic,
            )
        except ApiError as error:
            self.metrics.phase_seconds("request", time.perf_counter() - started)
            return self._reject(error)
        self.plan = forward.plan
        self.metrics.forwarded(RequestStats(inputs=forward.plan.count), rewritten=True)
        reply = request_body_forwarded(forward.upstream_body)
        self.metrics.phase_seconds("request", time.perf_counter() - started)
        return reply, Phase.AWAIT_RESPONSE_HEADERS

    def _reject(self, error: ApiError) -> Step:
        self.metrics.rejected(error.status, error.param)
        return error_answer(error, self._errors()), Phase.DONE

    def _errors(self) -> ErrorDialect:
        """The error dialect of this request's endpoint: a rerank path's own, else the
        policy's."""
        policy = self.contract.policy
        if self.rerank_path is not None:
            entries = policy.rerankers_at(self.rerank_path)
            if entries and entries[0].errors is not None:
                return entries[0].errors
        return policy.errors

    # -- response phase --------------------------------------------------------------

    def _decide_on_response_headers(self, request: ep.ProcessingRequest) -> Step:
        attributes = attributes_of(request)
        self._take_attributes(attributes)
        self._take_plan(request)
        headers = request.response_headers
        status = status_of(header_map(headers.headers))
        if self._decide(status, attributes) is Phase.PASS_THROUGH:
            return neutral("response_headers"), Phase.PASS_THROUGH
        if headers.end_of_stream:
            # A bodyless answer to replace (Dynamo's empty 404): replaced at once.
            answer = self._client_answer(status, b"")
            if answer is None:
                return neutral("response_headers"), Phase.DONE
            self.metrics.response_rewritten("error_envelope", status=answer.status)
            return immediate_response(answer.status, answer.body), Phase.DONE
        # An error's body gets the envelope here, and only here.
        reply = response_headers_buffered(enveloped_here=not is_success(status))
        return reply, Phase.AWAIT_RESPONSE_BODY

    def _decide_and_rewrite_response(self, request: ep.ProcessingRequest) -> Step:
        """The response headers were skipped: the status is the ``response.code``
        attribute, and the decision the headers would have taken is taken here.
        Without a usable status nothing changes (an anomaly)."""
        attributes = attributes_of(request)
        code = attribute(attributes, RESPONSE_CODE_ATTR)
        # Three ASCII digits only: "²".isdigit() is true and int() refuses it, as it
        # refuses 4,301 digits.
        if code is None or not (code.isascii() and code.isdigit() and len(code) == 3):
            return self._anomaly("response_body"), self.phase
        self._take_attributes(attributes)
        self._take_plan(request)
        if self._decide(int(code), attributes) is Phase.PASS_THROUGH:
            return neutral("response_body"), Phase.PASS_THROUGH
        return self._respond(request.response_body.body, status_as_metadata=True)

    def _rewrite_response(self, request: ep.ProcessingRequest) -> Step:
        self._take_attributes(attributes_of(request))
        self._take_plan(request)
        return self._respond(request.response_body.body, status_as_metadata=False)

    def _decide(self, status: int, attributes: Attributes) -> Phase:
        """Whether the gateway must see the response body: AWAIT_RESPONSE_BODY for any
        error and for a 2xx whose vectors change or are checked, else PASS_THROUGH
        (the response streams to the client untouched)."""
        self.upstream_status = status
        details = attribute(attributes, CODE_DETAILS_ATTR)
        if details is not None and details != "via_upstream":
            # Envoy's own local reply (413, 503, 504...): the config's
            # local_reply_config has given it the envelope already.
            self.metrics.upstream_response(status, local=True)
            return Phase.PASS_THROUGH
        self.metrics.upstream_response(status, local=False)
        if isinstance(self.plan, RerankPlan) or needs_response_body(self.plan, status):
            return Phase.AWAIT_RESPONSE_BODY
        self.metrics.stream_seconds(time.perf_counter() - self.started)
        return Phase.PASS_THROUGH

    def _respond(self, body: bytes, *, status_as_metadata: bool) -> Step:
        """The client's answer from the upstream's body, its status and length set in
        the same reply."""
        started = time.perf_counter()
        answer = self._client_answer(self.upstream_status, body)
        now = time.perf_counter()
        self.metrics.phase_seconds("response", now - started)
        self.metrics.stream_seconds(now - self.started)
        if answer is None:
            return neutral("response_body"), Phase.DONE
        kind: RewriteKind = "vectors" if is_success(answer.status) else "error_envelope"
        self.metrics.response_rewritten(
            kind, status=answer.status, prompt_tokens=answer.prompt_tokens
        )
        # status_as_metadata: Envoy ignores header mutations in this reply (it never
        # had the headers); the status goes to the Lua filter that holds them.
        return response_body_replaced(answer, status_as_metadata=status_as_metadata), Phase.DONE

    def _client_answer(self, status: int, body: bytes) -> ClientAnswer | None:
        """What the client gets for the upstream's answer (None: that answer, unchanged)."""
        errors = self.contract.policy.errors
        if isinstance(self.plan, RerankPlan):
            rerank = rewrite_rerank_response(self.plan, status, body, errors)
            return ClientAnswer(rerank.status, rerank.body)
        return rewrite_response(self.plan, status, body, errors)

    # -- any phase -------------------------------------------------------------------

    def _leave_unchanged(self, request: ep.ProcessingRequest) -> Step:
        return neutral(request.WhichOneof("request")), self.phase

    def _anomaly(self, kind: str | None) -> ep.ProcessingResponse:
        self.metrics.anomaly(kind or "unknown_message")
        return neutral(kind)

    # -- the servicer's events ----------------------------------------------------------

    def _refuse_overloaded(self, event: Overloaded) -> Step:
        """A 503 with ``Retry-After``, and nothing is forwarded. Not a client mistake,
        so counted only by the servicer's admission metrics, not as a rejection."""
        self.plan = None
        errors = self._errors()
        return error_answer(event.error, errors, retry_after_s=event.retry_after_s), Phase.DONE

    def _fail(self, event: None) -> Step:
        """A bug of ours must still fail closed with a readable answer: a 500 in the
        envelope, never an empty "continue" that would forward an unrewritten
        request. Nothing after it is processed."""
        self.metrics.anomaly("internal_error")
        error = ApiError(
            500,
            "The gateway failed to process this request.",
            type=SERVER_ERROR,
            code="gateway_error",
        )
        return error_answer(error, self._errors()), Phase.DONE

    # The end of a stream, by its shape: a whole-exchange stream carries everything
    # until the response is decided; a one-message stream (standalone.yaml) ends after
    # its reply unless its request body, or the response it holds open for, is still
    # to come. A request stream whose response comes on a second stream stays open
    # until then: the graceful drain (server.py) counts on it.

    def _end_unless_body_follows(self, event: None) -> Step:
        if self.shape is Shape.WHOLE_EXCHANGE or self.body_expected:
            return None, self.phase
        return None, Phase.DONE

    def _end_unless_response_follows(self, event: None) -> Step:
        if self.shape is Shape.WHOLE_EXCHANGE or self.response_follows:
            return None, self.phase
        return None, Phase.DONE

    def _end_unless_whole_exchange(self, event: None) -> Step:
        if self.shape is Shape.WHOLE_EXCHANGE:
            return None, self.phase
        return None, Phase.DONE

    def _end(self, event: None) -> Step:
        """Decided: nothing later on this stream can change the answer."""
        return None, Phase.DONE

    # -- what a processed message tells the stream -------------------------------------
    # Called by the handlers only: a message without a row changes nothing.

    def _take_attributes(self, attributes: Attributes) -> None:
        """The content type and the request id the message's attributes carry."""
        if attributes is None:
            return
        content_type = attribute(attributes, CONTENT_TYPE_ATTR)
        if content_type is not None:
            self.content_type = content_type
        request_id = attribute(attributes, REQUEST_ID_ATTR)
        if request_id is not None:
            self.request_id = request_id

    def _take_plan(self, request: ep.ProcessingRequest) -> None:
        """The plan the request's stream wrote as metadata, when this stream saw no
        request body of its own (standalone.yaml's response stream)."""
        if self.plan is None and request.HasField("metadata_context"):
            self.plan = plan_from_metadata(request)


# A row's handler: called with the stream and the message (a ProcessingRequest, or a
# servicer event's data), it returns the reply and the next phase.
Handler = Callable[[ExtProcStream, Any], Step]


class Row(NamedTuple):
    handler: Handler
    next_phases: frozenset[Phase]  # the phases the handler may return


def _row(handler: Handler, *next_phases: Phase) -> Row:
    return Row(handler, frozenset(next_phases))


_S = ExtProcStream
# The whole state machine: (phase, message kind) -> the handler and the phases it may
# move the stream to. A message without a row changes nothing.
TRANSITIONS: Final[Mapping[tuple[Phase, str | None], Row]] = {
    # Checked before Envoy buffers a body: accepted (the body follows) or refused.
    (Phase.AWAIT_REQUEST, "request_headers"): _row(
        _S._check_request_headers, Phase.AWAIT_REQUEST, Phase.DONE, Phase.PASS_THROUGH
    ),
    # The whole body in one message, whatever its end_of_stream says (trailers may
    # follow it): a second one has no row. Forwarded, or refused.
    (Phase.AWAIT_REQUEST, "request_body"): _row(
        _S._forward_request, Phase.AWAIT_RESPONSE_HEADERS, Phase.DONE
    ),
    # The body to see, the response left as it is, or a bodyless answer replaced.
    # Before any request body (Envoy's own reply to a request it refused) there is no
    # plan.
    **{
        (phase, "response_headers"): _row(
            _S._decide_on_response_headers,
            Phase.AWAIT_RESPONSE_BODY,
            Phase.PASS_THROUGH,
            Phase.DONE,
        )
        for phase in (Phase.AWAIT_REQUEST, Phase.AWAIT_RESPONSE_HEADERS)
    },
    # Response headers skipped (standalone.yaml): the status is an attribute of the
    # body. Rewritten, left as it is, or without a usable status unchanged (an anomaly).
    **{
        (phase, "response_body"): _row(
            _S._decide_and_rewrite_response, phase, Phase.PASS_THROUGH, Phase.DONE
        )
        for phase in (Phase.AWAIT_REQUEST, Phase.AWAIT_RESPONSE_HEADERS)
    },
    (Phase.AWAIT_RESPONSE_BODY, "response_body"): _row(_S._rewrite_response, Phase.DONE),
    # A config that always buffers the response sends it although nothing changes.
    (Phase.PASS_THROUGH, "response_body"): _row(_S._leave_unchanged, Phase.PASS_THROUGH),
    # Trailers pass unchanged in any phase (the shipped configs never send them).
    **{
        (phase, kind): _row(_S._leave_unchanged, phase)
        for phase in Phase
        for kind in ("request_trailers", "response_trailers")
    },
    # -- the servicer's events ----------------------------------------------------------
    # Admission control refused the request, or handling a message raised: the
    # gateway's own answer, and the stream is over.
    **{(phase, OVERLOADED): _row(_S._refuse_overloaded, Phase.DONE) for phase in Phase},
    **{(phase, PROCESSOR_FAILURE): _row(_S._fail, Phase.DONE) for phase in Phase},
    # A reply has gone: whether the stream ends here, by its shape.
    (Phase.AWAIT_REQUEST, REPLY_SENT): _row(
        _S._end_unless_body_follows, Phase.AWAIT_REQUEST, Phase.DONE
    ),
    (Phase.AWAIT_RESPONSE_HEADERS, REPLY_SENT): _row(
        _S._end_unless_response_follows, Phase.AWAIT_RESPONSE_HEADERS, Phase.DONE
    ),
    (Phase.AWAIT_RESPONSE_BODY, REPLY_SENT): _row(
        _S._end_unless_whole_exchange, Phase.AWAIT_RESPONSE_BODY, Phase.DONE
    ),
    (Phase.PASS_THROUGH, REPLY_SENT): _row(_S._end, Phase.DONE),
    (Phase.DONE, REPLY_SENT): _row(_S._end, Phase.DONE),
}
