"""The gRPC face of the gateway: Envoy's ExternalProcessor service on grpc.aio.

A thin shell: it owns one :class:`ExtProcStream` per gRPC stream and moves
messages between Envoy and it. A bug in our own code must still fail closed with
a readable answer, so an unexpected exception becomes a 500 envelope (logged
without request content), never an empty "continue" that would forward an
unrewritten request.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from extproc.core.errors import ApiError
from extproc.service import metrics
from extproc.service.admission import (
    AdmissionGate,
    Budget,
    Ticket,
    overloaded_error,
    response_work_bytes,
)
from extproc.service.memory import TRIM_AFTER_BYTES, IdleTrim, release_after
from extproc.service.reload import ContractHolder
from extproc.service.stream import ExtProcStream, immediate_response

log = logging.getLogger("extproc.service.servicer")

# gRPC metadata a filter sets when each of its streams carries exactly one message.
ONE_MESSAGE_METADATA = "x-embgw-one-message"
# gRPC metadata a route adds when the response body comes on the same stream as the
# request body (standalone.yaml's one-stream route; stream.py, rule 3).
RESPONSE_ON_STREAM_METADATA = "x-embgw-response-on-stream"

# Bodies above this are processed in a worker thread so that one huge request
# (parse + tokenize) does not stall every other stream on the event loop.
OFFLOAD_BODY_BYTES = 256 * 1024


class ExternalProcessor(ep_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, contracts: ContractHolder) -> None:
        self._contracts = contracts
        self.active_streams = 0  # read by the server's drain (extproc/service/server.py)
        # The budget is the starting policy's: a reload changes what new streams are
        # checked against, not how much work this process holds at once.
        limits = contracts.current.policy.limits
        self._admission = AdmissionGate(
            Budget(limits.max_inflight_bytes), limits.admission_wait_ms / 1000
        )
        self._idle_trim = IdleTrim()

    async def Process(  # noqa: N802 - the proto's method name
        self,
        request_iterator: AsyncIterator[ep.ProcessingRequest],
        context: grpc.aio.ServicerContext[ep.ProcessingRequest, ep.ProcessingResponse],
    ) -> AsyncIterator[ep.ProcessingResponse]:
        # Taken once: a policy reloaded while this stream runs applies to later ones.
        stream = ExtProcStream(self._contracts.current)
        one_message, stream.response_on_stream = _stream_marks(context)
        # The request's share of the admission budget, held until this stream ends:
        # with standalone.yaml the request stream of a rewrite stays open until the
        # response's stream is done, so the answer's work is covered too.
        ticket = Ticket()
        metrics.ACTIVE_STREAMS.inc()
        self.active_streams += 1
        try:
            requests = aiter(request_iterator)
            async for request in requests:
                size = _body_size(request)
                if request.WhichOneof("request") == "request_body":
                    reply = await self._admit_and_handle(stream, request, size, ticket)
                else:
                    reply = await self._handle(stream, request, size)
                yield reply
                del reply, request  # sent: let a huge body and its answer go before trimming
                if size >= TRIM_AFTER_BYTES:
                    await asyncio.to_thread(release_after, size)
                if stream.decided or (one_message and not stream.response_follows):
                    # Nothing more will come: end the RPC here, with an OK status. Left
                    # to Envoy, it ends with a half-close plus a reset, and grpc.aio leaks
                    # native memory for every RPC whose status it sends on a cancelled
                    # call (grpc/grpc#43360): measured ~90 bytes per stream, the slow
                    # RSS growth of the soak. Envoy takes a server close as "done".
                    # A request stream whose response stream is still to come stays
                    # open: the graceful drain (server.py) counts on it. Decided streams
                    # end in every config: with single-filter.yaml a response left as it
                    # is then streams past the closed processor, as Envoy does after a
                    # server close.
                    await _close(requests)
                    break
        finally:
            self._idle_trim.note(ticket.cost)
            self._admission.release(ticket)
            metrics.ADMISSION_IN_FLIGHT_BYTES.set(self._admission.in_flight)
            if self._idle_trim.due(self._admission.in_flight):
                # Not awaited: this generator may be closing (a cancelled stream).
                asyncio.get_running_loop().run_in_executor(None, release_after, TRIM_AFTER_BYTES)
            metrics.ACTIVE_STREAMS.dec()
            self.active_streams -= 1

    async def _admit_and_handle(
        self, stream: ExtProcStream, request: ep.ProcessingRequest, size: int, ticket: Ticket
    ) -> ep.ProcessingResponse:
        """Admission control around the request body: its bytes before the work, and
        the answer's estimated bytes once the plan says the answer will be rewritten
        (both within one bounded wait). Refused: a 503 ``overloaded`` instead."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._admission.wait_s
        if not await self._admit(ticket, size, self._admission.wait_s):
            return self._overloaded(stream, "request")
        reply = await self._handle(stream, request, size)
        if stream.response_follows and stream.plan is not None:
            extra = response_work_bytes(stream.plan)
            if not await self._admit(ticket, extra, max(deadline - loop.time(), 0.0)):
                return self._overloaded(stream, "response")
        return reply

    async def _admit(self, ticket: Ticket, extra: int, wait_s: float) -> bool:
        if self._admission.must_wait(ticket, extra):
            metrics.ADMISSION_WAITED.inc()
        admitted = await self._admission.admit(ticket, extra, wait_s=wait_s)
        metrics.ADMISSION_IN_FLIGHT_BYTES.set(self._admission.in_flight)
        return admitted

    def _overloaded(self, stream: ExtProcStream, stage: str) -> ep.ProcessingResponse:
        metrics.ADMISSION_REJECTED.labels(stage).inc()
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
            metrics.count_anomaly("internal_error")
            error = ApiError(
                500,
                "The gateway failed to process this request.",
                type="server_error",
                code="gateway_error",
            )
            return ep.ProcessingResponse(
                immediate_response=immediate_response(error.status, error.envelope())
            )


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


def _stream_marks(context: grpc.aio.ServicerContext[Any, Any]) -> tuple[bool, bool]:
    """(one message, response on this stream) from the stream's gRPC metadata.

    envoy/standalone.yaml's filters send one message per stream and say so; its
    one-stream route says that the response body follows on the same stream (the
    one message plus, when the response must change, the response's). Other configs
    (single-filter.yaml) send several messages and set neither."""
    one_message = response_on_stream = False
    for key, value in context.invocation_metadata() or ():
        if value == "1":
            if key == ONE_MESSAGE_METADATA:
                one_message = True
            elif key == RESPONSE_ON_STREAM_METADATA:
                response_on_stream = True
    return one_message, response_on_stream


async def _close(requests: AsyncIterator[ep.ProcessingRequest]) -> None:
    """Close grpc.aio's request generator (what its iterator hands out) when leaving
    it before its end. Left suspended, asyncio's async-generator finalizer would close
    it: a thread-safe callback (a self-pipe write) and a task, per stream."""
    aclose = getattr(requests, "aclose", None)
    if aclose is not None:
        await aclose()


def _body_size(request: ep.ProcessingRequest) -> int:
    kind = request.WhichOneof("request")
    if kind == "request_body":
        return len(request.request_body.body)
    if kind == "response_body":
        return len(request.response_body.body)
    return 0
