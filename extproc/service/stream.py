"""The per-stream ext_proc state machine: the messages Envoy sends about one HTTP
request on one gRPC stream, each answered with exactly one reply.

:data:`TRANSITIONS` is the whole machine, as h11's ``_state.py`` is: for each
(phase, message kind) a row, the handler that answers the message and, for each
:class:`Outcome` the handler may report, the one next phase (and what admission
control does then, :class:`Admission`). Handlers decide what happened; the table
alone decides where the stream goes, and an outcome its row does not list is a
:class:`TransitionError`. The stream changes only in a row's transition: the
handler reads what it needs of the message, its attributes and metadata included.
A message without a row is out of order or unknown: it gets the neutral reply of
its own kind, is counted as an anomaly and changes nothing. A confused Envoy must
not get a crashed stream, and a neutral reply to a response message can only
leave the upstream's own answer in place.

Envoy's messages reach a stream only while it awaits one (the three AWAIT phases):
PASS_THROUGH and DONE end the stream once their reply is sent. The servicer's own
events are kinds of the table too: its admission control refusing the request
(:data:`OVERLOADED`, a 503), a handler that raised (:data:`PROCESSOR_FAILURE`, a
500: fail closed), and each reply sent (:data:`REPLY_SENT`), after which the stream
stays open or ends by the rule of its :class:`Shape` (:data:`STAYS_OPEN`). So the
servicer only feeds events, sends replies and does what the row's admission step
says; it ends the RPC once the stream is DONE. Every reply is built in
extproc/service/envoy_messages.py; every request and answer is the endpoint's
(extproc/core/endpoint.py), chosen once from the request's path.

The Envoy behaviour each row relies on: docs/envoy-facts.md, "The ext_proc stream".
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from extproc.core.api_errors import ApiError, ServerError
from extproc.core.contract import Contract
from extproc.core.endpoint import ClientAnswer, Endpoint, Plan, needs_response_body
from extproc.core.request_coding import BodyCoding
from extproc.core.request_headers import (
    check_content_encoding,
    check_content_type,
    check_declared_length,
    check_has_body,
    check_method,
    declared_length,
    route_of,
    unknown_path,
)
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
    AWAIT_REQUEST_BODY = "await_request_body"  # its headers were accepted
    AWAIT_RESPONSE = "await_response"  # forwarded: a 2xx answer streams past
    AWAIT_ANSWER = "await_answer"  # forwarded, and the gateway reads the answer
    AWAIT_RESPONSE_BODY = "await_response_body"  # the response's body was asked for
    PASS_THROUGH = "pass_through"  # the response left as it is; the stream then ends
    DONE = "done"


class Shape(enum.Enum):
    """How the Envoy config spreads one HTTP exchange over ext_proc streams, as the
    stream's gRPC metadata says (the servicer reads it once per stream)."""

    # One filter (single-filter.yaml, the meshes; no mark), or a route whose stream
    # carries its exchange whole (standalone.yaml's rerank route): this stream sees
    # the whole exchange, the response headers included.
    WHOLE_EXCHANGE = "whole_exchange"
    # standalone.yaml's one-message streams (`x-embgw-one-message`): a response that
    # must change comes on a second stream, on the route where the response filter
    # runs. That second stream has this shape too.
    RESPONSE_ON_SECOND_STREAM = "response_on_second_stream"
    # standalone.yaml's one-stream route (`x-embgw-response-on-stream` as well): the
    # response body follows on this stream, its headers held by a Lua filter.
    RESPONSE_BODY_ON_THIS_STREAM = "response_body_on_this_stream"


class Outcome(enum.Enum):
    """What a handler reports happened; the table turns it into the next phase."""

    ACCEPTED = "accepted"  # request headers accepted: the body follows
    FORWARDED = "forwarded"  # the request goes upstream; its answer streams past
    FORWARDED_FOR_ANSWER = "forwarded_for_answer"  # ... and the gateway reads its answer
    REFUSED = "refused"  # the gateway answered in the upstream's place
    LEFT_ALONE = "left_alone"  # the exchange, or its answer, is not the gateway's to change
    BODY_WANTED = "body_wanted"  # the response's body is asked for
    ANSWERED = "answered"  # the client's answer is decided: replaced, or kept as it is
    UNCHANGED = "unchanged"  # nothing for the gateway in this message
    STAYS = "stays"  # (a reply sent) more of the exchange is to come on this stream
    ENDS = "ends"  # (a reply sent) nothing more on this stream is the gateway's


class Admission(enum.Enum):
    """What the servicer's admission control does as a transition is taken."""

    NONE = "none"
    RESERVE_BODY = "reserve_body"  # room for the declared body, before Envoy sends it
    RESERVE_ANSWER = "reserve_answer"  # room for the answer the gateway will rewrite
    RELEASE = "release"  # the stream is over: its room goes back


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


# A handler's reply (None: nothing to send, for REPLY_SENT) and what happened.
Step = tuple[ep.ProcessingResponse | None, Outcome]


class TransitionError(RuntimeError):
    """A handler reported an outcome its row does not list: a bug of ours."""


@dataclass
class ExtProcStream:
    """State of one stream. Feed each ProcessingRequest to :meth:`handle`, and the
    servicer's events to :meth:`refuse_overloaded`, :meth:`processor_failed` and
    :meth:`reply_sent`; after each, :attr:`admission` says what admission control does."""

    contract: Contract
    shape: Shape
    metrics: StreamMetrics
    phase: Phase = Phase.AWAIT_REQUEST
    # The endpoint the request's path names, chosen at its headers; a stream that
    # sees no request headers answers as the embeddings endpoint.
    endpoint: Endpoint[Any] | None = None
    plan: Plan | None = None
    admission: Admission = Admission.NONE  # the step of the last transition taken
    request_id: str = "-"
    content_type: str | None = None
    body_coding: BodyCoding | None = None  # the body was decoded by Envoy (standalone.yaml)
    upstream_status: int = 0
    # The body size the accepted request headers declared (None: unknown, chunked
    # or HTTP/2 without Content-Length), for admission control's reservation.
    declared_length: int | None = None
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if self.endpoint is None:
            self.endpoint = self.contract.routes.embeddings

    @property
    def decided(self) -> bool:
        """Nothing later on this stream can change the answer (DONE, or the response
        left as the upstream sent it)."""
        return self.phase in (Phase.DONE, Phase.PASS_THROUGH)

    def handle(self, request: ep.ProcessingRequest) -> ep.ProcessingResponse:
        """The reply to one of Envoy's messages: its row's transition, or for a message
        without a row the neutral reply of its kind, counted as an anomaly."""
        kind = request.WhichOneof("request")
        if (self.phase, kind) not in TRANSITIONS:
            self.admission = Admission.NONE
            return self._anomaly(kind)
        reply = self._step(kind, request)
        assert reply is not None
        return reply

    def refuse_overloaded(self, error: ApiError, retry_after_s: int) -> ep.ProcessingResponse:
        """The reply when the servicer's admission control refused the request."""
        reply = self._step(OVERLOADED, Overloaded(error, retry_after_s))
        assert reply is not None
        return reply

    def processor_failed(self) -> ep.ProcessingResponse:
        """The reply when handling the last message raised (the servicer logs it)."""
        reply = self._step(PROCESSOR_FAILURE, None)
        assert reply is not None
        return reply

    def reply_sent(self) -> bool:
        """The servicer sent the reply to the last message. True: the stream is DONE,
        nothing more on it is for the gateway, and the servicer ends it."""
        self._step(REPLY_SENT, None)
        return self.phase is Phase.DONE

    def _step(self, kind: str | None, message: object) -> ep.ProcessingResponse | None:
        handler, targets = TRANSITIONS[(self.phase, kind)]
        reply, outcome = handler(self, message)
        target = targets.get(outcome)
        if target is None:
            raise TransitionError(f"{handler.__name__}: {self.phase} {kind} -> {outcome}")
        self.phase, self.admission = target
        return reply

    # -- request phase ---------------------------------------------------------------

    def _check_request_headers(self, request: ep.ProcessingRequest) -> Step:
        """Everything the headers alone can refuse is refused here, before Envoy
        buffers a body (extproc/core/request_headers.py): a path no endpoint serves
        (404), another method (405), a compressed body (415), a POST without a body,
        a content type that is not JSON, a declared length over the limit. A path a
        mesh lets through that no policy entry covers is left alone."""
        headers = request.request_headers
        values = header_map(headers.headers)
        # The headers' own values, else the attributes' (a config may send both).
        self._take_attributes(attributes_of(request))
        self.content_type = values.get("content-type", self.content_type)
        self.request_id = values.get("x-request-id", self.request_id)
        path = values.get(":path")
        routes = self.contract.routes
        route = None if path is None else route_of(path)
        if route is not None and routes.left_alone(route):
            return exchange_passed(), Outcome.LEFT_ALONE
        try:
            if route is not None:
                endpoint = routes.at(route)
                if endpoint is None:
                    raise unknown_path()
                self.endpoint = endpoint
            check_method(values.get(":method", "POST"))
            check_content_encoding(values.get("content-encoding"))
            check_has_body(headers.end_of_stream)
            check_content_type(self.content_type)
            check_declared_length(values.get("content-length"), self.contract.policy.limits)
        except ApiError as error:
            return self._reject(error)
        self.declared_length = declared_length(values.get("content-length"))
        # What the upstream is told that the one-filter shape has no other way to
        # tell it: the endpoint's upstream path (the route Envoy chose stays), an
        # answer the gateway can read, no content-encoding (only identity gets here)
        # and, when the client sent none, the JSON content type.
        target = self._endpoint.upstream_path
        reply = request_headers_accepted(
            path=target if path is not None and target != path else None,
            drop_content_encoding="content-encoding" in values,
            add_json_content_type=self.content_type is None,
        )
        return reply, Outcome.ACCEPTED

    def _forward_request(self, request: ep.ProcessingRequest) -> Step:
        """The whole request through its endpoint: refused (the client's mistake, in
        the endpoint's error dialect), or forwarded, rewritten or as sent, with the
        plan for its answer. A body Envoy decoded is refused in words that name its
        coding."""
        # With the request headers skipped, their attributes come with the body.
        self._take_attributes(attributes_of(request))
        if request.HasField("metadata_context"):
            self.body_coding = coding_from_metadata(request) or self.body_coding
        started = time.perf_counter()
        try:
            check_content_type(self.content_type)
            forward = self._endpoint.forward(
                request.request_body.body,
                self.contract,
                clock=time.monotonic,
                coding=self.body_coding,
            )
        except ApiError as error:
            self.metrics.phase_seconds("request", time.perf_counter() - started)
            return self._reject(error)
        if isinstance(forward, ClientAnswer):  # the dialect answered: nothing goes upstream
            self.metrics.phase_seconds("request", time.perf_counter() - started)
            return immediate_response(forward.status, forward.body), Outcome.REFUSED
        self.metrics.forwarded(forward.stats, rewritten=forward.upstream_body is not None)
        self.plan = plan = forward.plan
        # Where the response will be processed must get the plan. On this stream it
        # is here already; the one-stream route's Lua filter needs its cue.
        plan_text = None
        if plan.needs_response and self.shape is Shape.RESPONSE_ON_SECOND_STREAM:
            plan_text = plan.to_json()
            if plan_text is None:
                # Such an endpoint's routes carry the whole exchange: a config that
                # sends it here must not let its answer pass unread.
                raise TransitionError("this endpoint's answer cannot be read on a second stream")
        reply = request_body_forwarded(
            forward.upstream_body,
            plan_to_second_stream=plan_text,
            cue_response_on_stream=(
                plan.needs_response and self.shape is Shape.RESPONSE_BODY_ON_THIS_STREAM
            ),
        )
        self.metrics.phase_seconds("request", time.perf_counter() - started)
        outcome = Outcome.FORWARDED_FOR_ANSWER if plan.needs_response else Outcome.FORWARDED
        return reply, outcome

    def _reject(self, error: ApiError) -> Step:
        self.metrics.rejected(error.status, error.param)
        return error_answer(error, self._endpoint.errors), Outcome.REFUSED

    @property
    def _endpoint(self) -> Endpoint[Any]:
        assert self.endpoint is not None  # set at construction
        return self.endpoint

    # -- response phase --------------------------------------------------------------

    def _decide_on_response_headers(self, request: ep.ProcessingRequest) -> Step:
        attributes = attributes_of(request)
        self._take_attributes(attributes)
        self._take_plan(request)
        headers = request.response_headers
        status = status_of(header_map(headers.headers))
        if not self._body_wanted(status, attributes):
            return neutral("response_headers"), Outcome.LEFT_ALONE
        if headers.end_of_stream:
            # A bodyless answer to replace (Dynamo's empty 404): replaced at once.
            answer = self._client_answer(status, b"")
            if answer is None:
                return neutral("response_headers"), Outcome.ANSWERED
            self.metrics.response_rewritten("error_envelope", status=answer.status)
            return immediate_response(answer.status, answer.body), Outcome.ANSWERED
        # An error's body gets the envelope here, and only here.
        reply = response_headers_buffered(enveloped_here=not is_success(status))
        return reply, Outcome.BODY_WANTED

    def _decide_and_rewrite_response(self, request: ep.ProcessingRequest) -> Step:
        """The response headers were skipped: the status is the ``response.code``
        attribute, and the decision the headers would have taken is taken here.
        Without a usable status nothing changes (an anomaly)."""
        attributes = attributes_of(request)
        code = attribute(attributes, RESPONSE_CODE_ATTR)
        # Three ASCII digits only: "²".isdigit() is true and int() refuses it, as it
        # refuses 4,301 digits.
        if code is None or not (code.isascii() and code.isdigit() and len(code) == 3):
            return self._anomaly("response_body"), Outcome.UNCHANGED
        self._take_attributes(attributes)
        self._take_plan(request)
        if not self._body_wanted(int(code), attributes):
            return neutral("response_body"), Outcome.LEFT_ALONE
        return self._respond(request.response_body.body, status_as_metadata=True)

    def _rewrite_response(self, request: ep.ProcessingRequest) -> Step:
        self._take_attributes(attributes_of(request))
        self._take_plan(request)
        return self._respond(request.response_body.body, status_as_metadata=False)

    def _body_wanted(self, status: int, attributes: Attributes) -> bool:
        """Whether the gateway must see the response body: for any error and for a
        2xx the plan reads (vectors that change or are checked, a rerank answer);
        else the response streams to the client untouched."""
        self.upstream_status = status
        details = attribute(attributes, CODE_DETAILS_ATTR)
        if details is not None and details != "via_upstream":
            # Envoy's own local reply (413, 503, 504...): the config's
            # local_reply_config has given it the envelope already.
            self.metrics.upstream_response(status, local=True)
            return False
        self.metrics.upstream_response(status, local=False)
        if needs_response_body(self.plan, status):
            return True
        self.metrics.stream_seconds(time.perf_counter() - self.started)
        return False

    def _respond(self, body: bytes, *, status_as_metadata: bool) -> Step:
        """The client's answer from the upstream's body, its status and length set in
        the same reply."""
        started = time.perf_counter()
        answer = self._client_answer(self.upstream_status, body)
        now = time.perf_counter()
        self.metrics.phase_seconds("response", now - started)
        self.metrics.stream_seconds(now - self.started)
        if answer is None:
            return neutral("response_body"), Outcome.ANSWERED
        kind: RewriteKind = "vectors" if is_success(answer.status) else "error_envelope"
        self.metrics.response_rewritten(
            kind, status=answer.status, prompt_tokens=answer.prompt_tokens
        )
        # status_as_metadata: Envoy ignores header mutations in this reply (it never
        # had the headers); the status goes to the Lua filter that holds them.
        reply = response_body_replaced(answer, status_as_metadata=status_as_metadata)
        return reply, Outcome.ANSWERED

    def _client_answer(self, status: int, body: bytes) -> ClientAnswer | None:
        """What the client gets for the upstream's answer (None: that answer, unchanged)."""
        return self._endpoint.answer(self.plan, status, body, clock=time.monotonic)

    # -- any awaiting phase ------------------------------------------------------------

    def _leave_unchanged(self, request: ep.ProcessingRequest) -> Step:
        return neutral(request.WhichOneof("request")), Outcome.UNCHANGED

    def _anomaly(self, kind: str | None) -> ep.ProcessingResponse:
        self.metrics.anomaly(kind or "unknown_message")
        return neutral(kind)

    # -- the servicer's events ----------------------------------------------------------

    def _refuse_overloaded(self, event: Overloaded) -> Step:
        """A 503 with ``Retry-After``, and nothing is forwarded. Not a client mistake,
        so counted only by the servicer's admission metrics, not as a rejection."""
        self.plan = None
        reply = error_answer(event.error, self._endpoint.errors, retry_after_s=event.retry_after_s)
        return reply, Outcome.REFUSED

    def _fail(self, event: None) -> Step:
        """A bug of ours must still fail closed with a readable answer: a 500 in the
        envelope, never an empty "continue" that would forward an unrewritten
        request. Nothing after it is processed."""
        self.metrics.anomaly("internal_error")
        error = ServerError(
            500, "The gateway failed to process this request.", code="gateway_error"
        )
        return error_answer(error, self._endpoint.errors), Outcome.REFUSED

    def _after_reply(self, event: None) -> Step:
        """Whether the stream stays open for more of the exchange (:data:`STAYS_OPEN`)."""
        stays = (self.phase, self.shape) in STAYS_OPEN
        return None, Outcome.STAYS if stays else Outcome.ENDS

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
# servicer event's data), it returns the reply and the outcome.
Handler = Callable[[ExtProcStream, Any], Step]


class Target(NamedTuple):
    phase: Phase
    admission: Admission = Admission.NONE


class Transition(NamedTuple):
    handler: Handler
    targets: Mapping[Outcome, Target]  # the outcomes the handler may report


_S = ExtProcStream
_DONE = Target(Phase.DONE, Admission.RELEASE)
_AWAITING = (
    Phase.AWAIT_REQUEST,
    Phase.AWAIT_REQUEST_BODY,
    Phase.AWAIT_RESPONSE,
    Phase.AWAIT_ANSWER,
    Phase.AWAIT_RESPONSE_BODY,
)
# Where a response may come: Envoy's own reply can come before any request body.
_BEFORE_RESPONSE_BODY = _AWAITING[:-1]
_REQUEST_BODY_DUE = (Phase.AWAIT_REQUEST, Phase.AWAIT_REQUEST_BODY)

# After a reply, the (phase, shape) pairs in which the stream stays open; in any
# other it ends. A whole-exchange stream carries everything until the response is
# decided; a one-message stream (standalone.yaml) ends after its reply unless its
# request body, or the answer it holds open for, is still to come. A request stream
# whose answer comes on a second stream stays open until then: the graceful drain
# (server.py) counts on it.
STAYS_OPEN: Final[frozenset[tuple[Phase, Shape]]] = frozenset(
    {(phase, Shape.WHOLE_EXCHANGE) for phase in _AWAITING}
    | {
        (phase, shape)
        for phase in (Phase.AWAIT_REQUEST_BODY, Phase.AWAIT_ANSWER)
        for shape in Shape
    }
)


def _after_reply_targets(phase: Phase) -> Mapping[Outcome, Target]:
    """A reply's row lists STAYS where some shape stays open in ``phase``, ENDS where
    some shape ends: exactly what can happen."""
    shapes = {shape: (phase, shape) in STAYS_OPEN for shape in Shape}
    targets: dict[Outcome, Target] = {}
    if any(shapes.values()):
        targets[Outcome.STAYS] = Target(phase)
    if not all(shapes.values()):
        targets[Outcome.ENDS] = _DONE
    return targets


# The whole state machine: (phase, message kind) -> the handler, and for each outcome
# it may report the next phase and admission step. A message without a row changes
# nothing.
TRANSITIONS: Final[Mapping[tuple[Phase, str | None], Transition]] = {
    # Checked before Envoy buffers a body: accepted (the body follows, room is
    # reserved for it), refused, or not the gateway's at all.
    (Phase.AWAIT_REQUEST, "request_headers"): Transition(
        _S._check_request_headers,
        {
            Outcome.ACCEPTED: Target(Phase.AWAIT_REQUEST_BODY, Admission.RESERVE_BODY),
            Outcome.REFUSED: _DONE,
            Outcome.LEFT_ALONE: Target(Phase.PASS_THROUGH),
        },
    ),
    # The whole body in one message, whatever its end_of_stream says (trailers may
    # follow it): a second one has no row. Forwarded (room reserved for an answer
    # the gateway will read), or refused. standalone.yaml skips the request headers
    # on some routes: the body then comes first.
    **{
        (phase, "request_body"): Transition(
            _S._forward_request,
            {
                Outcome.FORWARDED: Target(Phase.AWAIT_RESPONSE),
                Outcome.FORWARDED_FOR_ANSWER: Target(Phase.AWAIT_ANSWER, Admission.RESERVE_ANSWER),
                Outcome.REFUSED: _DONE,
            },
        )
        for phase in _REQUEST_BODY_DUE
    },
    # The body to see, the response left as it is, or a bodyless answer replaced.
    # Before any request body (Envoy's own reply to a request it refused) there is no
    # plan.
    **{
        (phase, "response_headers"): Transition(
            _S._decide_on_response_headers,
            {
                Outcome.BODY_WANTED: Target(Phase.AWAIT_RESPONSE_BODY),
                Outcome.LEFT_ALONE: Target(Phase.PASS_THROUGH),
                Outcome.ANSWERED: _DONE,
            },
        )
        for phase in _BEFORE_RESPONSE_BODY
    },
    # Response headers skipped (standalone.yaml): the status is an attribute of the
    # body. Rewritten, left as it is, or without a usable status unchanged (an anomaly).
    **{
        (phase, "response_body"): Transition(
            _S._decide_and_rewrite_response,
            {
                Outcome.ANSWERED: _DONE,
                Outcome.LEFT_ALONE: Target(Phase.PASS_THROUGH),
                Outcome.UNCHANGED: Target(phase),
            },
        )
        for phase in _BEFORE_RESPONSE_BODY
    },
    (Phase.AWAIT_RESPONSE_BODY, "response_body"): Transition(
        _S._rewrite_response, {Outcome.ANSWERED: _DONE}
    ),
    # Trailers pass unchanged (the shipped configs never send them).
    **{
        (phase, kind): Transition(_S._leave_unchanged, {Outcome.UNCHANGED: Target(phase)})
        for phase in _AWAITING
        for kind in ("request_trailers", "response_trailers")
    },
    # -- the servicer's events ----------------------------------------------------------
    # Admission control refuses at the request headers or the request body (before
    # it is handled, or once its answer's room is not found); handling any message
    # may raise. The gateway's own answer, and the stream is over.
    **{
        (phase, OVERLOADED): Transition(_S._refuse_overloaded, {Outcome.REFUSED: _DONE})
        for phase in (*_REQUEST_BODY_DUE, Phase.AWAIT_ANSWER)
    },
    **{
        (phase, PROCESSOR_FAILURE): Transition(_S._fail, {Outcome.REFUSED: _DONE})
        for phase in _AWAITING
    },
    # A reply has gone: the stream stays for more, or ends, by its shape (STAYS_OPEN).
    **{
        (phase, REPLY_SENT): Transition(_S._after_reply, _after_reply_targets(phase))
        for phase in Phase
    },
}
