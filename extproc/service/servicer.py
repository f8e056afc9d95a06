"""The gRPC face of the gateway: Envoy's ExternalProcessor service on grpc.aio.

A thin shell: it owns one :class:`ExtProcStream` per gRPC stream, of the
:class:`Shape` the stream's gRPC metadata names, feeds it Envoy's messages and its
own events (admission control's refusal, an exception, each reply sent), sends the
replies the stream gives back and ends the RPC once the stream is DONE. It applies
admission control and reports to the :class:`StreamMetrics` it is given. An
unexpected exception is logged without request content, then fed to the stream,
which fails closed (extproc/service/stream.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from extproc.core.policy import Limits
from extproc.service.admission import (
    AdmissionGate,
    Budget,
    Ticket,
    overloaded_error,
    request_work_bytes,
    response_work_bytes,
)
from extproc.service.memory import TRIM_AFTER_BYTES, IdleTrim, release_after, trim_heap
from extproc.service.reload import ContractHolder
from extproc.service.stream import Admission, ExtProcStream, Shape
from extproc.service.stream_metrics import AdmissionStage, StreamMetrics
from extproc.service.stream_tracer import (
    NotingStreamMetrics,
    StreamFacts,
    StreamTracer,
    with_plan,
)

log = logging.getLogger("extproc.service.servicer")

# gRPC metadata a filter sets when each of its streams carries exactly one message
# (envoy/standalone.yaml's), besides the request headers that precede the body on
# its route for large or unsized bodies.
ONE_MESSAGE_METADATA = "x-embgw-one-message"
# gRPC metadata a route adds when the response body comes on the same stream as the
# request body (standalone.yaml's one-stream route).
RESPONSE_ON_STREAM_METADATA = "x-embgw-response-on-stream"
# gRPC metadata a route adds when its stream carries the whole exchange although the
# filter's own metadata says one message (standalone.yaml's rerank route).
WHOLE_EXCHANGE_METADATA = "x-embgw-whole-exchange"

# Bodies above this are processed in a worker thread so that one huge request
# (parse + tokenize) does not stall every other stream on the event loop.
OFFLOAD_BODY_BYTES = 256 * 1024


class ExternalProcessor(ep_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(
        self,
        contracts: ContractHolder,
        metrics: StreamMetrics,
        *,
        budget_share: int = 1,
        tracer: StreamTracer | None = None,
    ) -> None:
        self._contracts = contracts
        self._metrics = metrics
        self._tracer = tracer  # None: tracing off, and nothing below notes anything
        self.active_streams = 0  # read by the server's drain (extproc/service/server.py)
        # The policy's budget is the host's: the processes that share it (the workers
        # of `extproc run`) each admit an equal part, so the host admits the budget.
        self._budget_share = budget_share
        limits = contracts.current.policy.limits
        self._admission = AdmissionGate(Budget(self._capacity(limits)), *_gate_settings(limits))
        self._admission_limits = limits
        self._idle_trim = IdleTrim()

    async def Process(  # noqa: N802 - the proto's method name
        self,
        request_iterator: AsyncIterator[ep.ProcessingRequest],
        context: grpc.aio.ServicerContext[ep.ProcessingRequest, ep.ProcessingResponse],
    ) -> AsyncIterator[ep.ProcessingResponse]:
        # Taken once: a policy reloaded while this stream runs applies to later ones.
        contract = self._contracts.current
        if contract.policy.limits is not self._admission_limits:
            self._follow_admission_limits(contract.policy.limits)
        metrics = self._metrics
        metadata = context.invocation_metadata() or ()
        shape = stream_shape(metadata)
        noted: NotingStreamMetrics | None = None
        if self._tracer is not None:
            started_ns = time.time_ns()
            metrics = noted = NotingStreamMetrics(metrics)
        stream = ExtProcStream(contract, shape, metrics)
        # The request's share of the admission budget, held until this stream ends:
        # with standalone.yaml the request stream of a rewrite stays open until the
        # response's stream is done, so the answer's work is covered too.
        ticket = Ticket()
        largest_body = 0
        metrics.stream_opened()
        self.active_streams += 1
        try:
            requests = aiter(request_iterator)
            async for request in requests:
                kind = request.WhichOneof("request")
                size = _body_size(request, kind)
                if kind == "request_body":
                    reply = await self._admit_and_handle(stream, request, size, ticket)
                elif kind == "request_headers":
                    reply = await self._admit_headers(stream, request, ticket)
                else:
                    reply = await self._handle(stream, request, size)
                if stream.admission is Admission.RELEASE:
                    self._release(ticket, metrics)  # decided: its room goes back with the reply
                yield reply
                del reply, request  # sent: let a huge body and its answer go (trim below)
                largest_body = max(largest_body, size)
                if stream.reply_sent():
                    # Nothing more will come that the gateway needs: end the RPC with OK
                    # ourselves, since a status sent on a call Envoy cancelled leaks
                    # native memory in grpc.aio.
                    await _close(requests)
                    break
        finally:
            self._release(ticket, metrics)
            # After a very large body, or once idle after a burst (memory.py). Once the
            # ticket is back (the collection holds the interpreter lock), and not
            # awaited: this generator may be closing.
            idle_again = self._idle_trim.due(self._admission.in_flight)
            loop = asyncio.get_running_loop()
            if largest_body >= TRIM_AFTER_BYTES:
                loop.run_in_executor(None, release_after, largest_body)
            elif idle_again:
                loop.run_in_executor(None, trim_heap)
            metrics.stream_closed()
            self.active_streams -= 1
            if noted is not None:
                self._trace(metadata, started_ns, with_plan(noted.facts, stream.plan))

    def _release(self, ticket: Ticket, metrics: StreamMetrics) -> None:
        """The request's room back to the budget (again: nothing more to give), and
        the gauge set before the reply leaves, so a client that has its answer reads
        a budget without it."""
        self._idle_trim.note(ticket.cost)
        self._admission.release(ticket)
        metrics.admission_in_flight(self._admission.in_flight)

    def _trace(
        self, metadata: Iterable[tuple[str, Any]], started_ns: int, facts: StreamFacts
    ) -> None:
        """The stream's span; a tracer's failure costs the span, never the stream."""
        assert self._tracer is not None
        try:
            self._tracer.record(metadata, started_ns, time.time_ns(), facts)
        except Exception as exc:
            log.warning("tracing: the stream's span was not recorded: %s", type(exc).__name__)

    def _follow_admission_limits(self, limits: Limits) -> None:
        """A reloaded policy's admission settings apply to the requests that come
        after it; what running requests hold stays theirs."""
        self._admission_limits = limits
        gate = self._admission
        settings = (self._capacity(limits), *_gate_settings(limits))
        if settings != (gate.capacity, gate.wait_s, gate.upload_rate):
            log.info(
                "admission: budget %d bytes (1/%d of the host's), wait %d ms, "
                "upload floor %d bytes/s",
                settings[0],
                self._budget_share,
                limits.admission_wait_ms,
                limits.admission_upload_bytes_per_s,
            )
            gate.configure(*settings)

    def _capacity(self, limits: Limits) -> int:
        return max(1, limits.max_inflight_bytes // self._budget_share)

    async def _admit_headers(
        self, stream: ExtProcStream, request: ep.ProcessingRequest, ticket: Ticket
    ) -> ep.ProcessingResponse:
        """Admission control at the request headers, before Envoy sends the body
        (admission.py, rule 2): room for the work of the declared Content-Length, or
        of the body limit when none is declared (nothing larger can come: Envoy's
        buffer and the gateway's own check refuse it), reserved for as long as the
        body takes to arrive at the policy's floor rate, within one bounded wait.
        Refused: a 503 ``overloaded`` instead, so the body never reaches this
        process."""
        reply = await self._handle(stream, request, 0)
        if stream.admission is not Admission.RESERVE_BODY:  # answered (404, 405, 415...)
            return reply
        declared = stream.declared_length
        if declared is None:
            declared = stream.contract.policy.limits.max_request_bytes
        work = request_work_bytes(declared)
        gate = self._admission
        if gate.headers_must_wait(ticket, work):
            self._metrics.admission_waited()
        if not await gate.admit_headers(ticket, work, declared):
            return self._overloaded(stream, "headers")
        return reply

    async def _admit_and_handle(
        self, stream: ExtProcStream, request: ep.ProcessingRequest, size: int, ticket: Ticket
    ) -> ep.ProcessingResponse:
        """Admission control around the request body: its work in flight before it is
        processed (a reservation made at the headers gives way to it), and the
        answer's estimated bytes once the plan says the answer will be rewritten
        (both within one bounded wait). Refused: a 503 ``overloaded`` instead."""
        gate = self._admission
        loop = asyncio.get_running_loop()
        deadline = loop.time() + gate.wait_s
        # A body over the size limit is answered 413 before it is parsed: no work.
        over_limit = size > stream.contract.policy.limits.max_request_bytes
        work = 0 if over_limit else request_work_bytes(size)
        metrics = self._metrics
        if gate.arrived(ticket, work):
            metrics.admission_in_flight(gate.in_flight)
        else:
            metrics.admission_waited()
            admitted = await gate.admit(ticket, work)
            metrics.admission_in_flight(gate.in_flight)
            if not admitted:
                return self._overloaded(stream, "request")
        reply = await self._handle(stream, request, size)
        if stream.admission is Admission.RESERVE_ANSWER and stream.plan is not None:
            extra = response_work_bytes(stream.plan)
            if not await self._admit(ticket, extra, max(deadline - loop.time(), 0.0)):
                return self._overloaded(stream, "response")
        return reply

    async def _admit(self, ticket: Ticket, extra: int, wait_s: float) -> bool:
        if self._admission.must_wait(ticket, extra):
            self._metrics.admission_waited()
        admitted = await self._admission.admit(ticket, extra, wait_s=wait_s)
        self._metrics.admission_in_flight(self._admission.in_flight)
        return admitted

    def _overloaded(self, stream: ExtProcStream, stage: AdmissionStage) -> ep.ProcessingResponse:
        stream.metrics.admission_refused(stage)  # the stream's: its span notes it too
        retry_after_s = self._contracts.current.policy.limits.retry_after_s
        return stream.refuse_overloaded(overloaded_error(retry_after_s), retry_after_s)

    async def _handle(
        self, stream: ExtProcStream, request: ep.ProcessingRequest, size: int
    ) -> ep.ProcessingResponse:
        try:
            if size > OFFLOAD_BODY_BYTES:
                return await asyncio.to_thread(stream.handle, request)
            return stream.handle(request)
        except Exception as exc:
            # Type and place only: exception text may quote request content. So no
            # exc_info even at debug (it prints the message): the frames alone.
            log.error(
                "internal error on %s for request %s: %s%s",
                request.WhichOneof("request"),
                loggable_id(stream.request_id),
                type(exc).__name__,
                _frames(exc) if log.isEnabledFor(logging.DEBUG) else "",
            )
            return stream.processor_failed()


def _gate_settings(limits: Limits) -> tuple[float, float]:
    """The admission gate's wait (seconds) and floor upload rate from a policy."""
    return limits.admission_wait_ms / 1000, float(limits.admission_upload_bytes_per_s)


def loggable_id(request_id: str) -> str:
    """A request id fit for a log line. Envoy's own are UUIDs, but a config that keeps
    the client's x-request-id (preserve_external_request_id, internal clients) passes
    whatever the client sent: at most 64 characters, nothing outside [A-Za-z0-9._:-]."""
    return "".join(
        c if c.isascii() and (c.isalnum() or c in "._:-") else "?" for c in request_id[:64]
    )


def _frames(exc: BaseException) -> str:
    """Where it happened (file, line, code), without the exception's message."""
    return "\n" + "".join(traceback.format_tb(exc.__traceback__)).rstrip()


def stream_shape(metadata: Iterable[tuple[str, Any]]) -> Shape:
    """The stream's shape from its gRPC metadata. envoy/standalone.yaml's filters send
    one message per stream and say so; its one-stream route also says that the
    response body follows on the same stream. Other configs (single-filter.yaml, the
    meshes) send the whole exchange on one stream and set neither."""
    one_message = response_on_stream = whole = False
    for key, value in metadata:
        if value == "1":
            if key == ONE_MESSAGE_METADATA:
                one_message = True
            elif key == RESPONSE_ON_STREAM_METADATA:
                response_on_stream = True
            elif key == WHOLE_EXCHANGE_METADATA:
                whole = True
    if whole or not one_message:
        return Shape.WHOLE_EXCHANGE
    if response_on_stream:
        return Shape.RESPONSE_BODY_ON_THIS_STREAM
    return Shape.RESPONSE_ON_SECOND_STREAM


async def _close(requests: AsyncIterator[ep.ProcessingRequest]) -> None:
    """Close grpc.aio's request generator (what its iterator hands out) when leaving
    it before its end. Left suspended, asyncio's async-generator finalizer would close
    it: a thread-safe callback (a self-pipe write) and a task, per stream."""
    aclose = getattr(requests, "aclose", None)
    if aclose is not None:
        await aclose()


def _body_size(request: ep.ProcessingRequest, kind: str | None) -> int:
    if kind == "request_body":
        return len(request.request_body.body)
    if kind == "response_body":
        return len(request.response_body.body)
    return 0
