"""The comparator's gRPC face: Envoy's tap streams and the peer service.

Both are thin: the tap feeds each message to a :class:`TapStream` and hands the
finished half to the :class:`HalfRouter`; the peer service hands forwarded
halves to the local comparator and serves the local tally.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Final

import grpc
import orjson
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from extproc.tools.shadow.forwarder import HalfRouter
from extproc.tools.shadow.half import RawHalf, Role, extract_half
from extproc.tools.shadow.peer import Context
from extproc.tools.shadow.tap import ROLE_METADATA, TapStream
from extproc.tools.shadow.v1 import shadow_pb2 as pb
from extproc.tools.shadow.wire import BadHalfError, from_proto

log = logging.getLogger("extproc.tools.shadow.services")

PROCESSOR_SERVICE: Final = "envoy.service.ext_proc.v3.ExternalProcessor"
# Bodies above this are parsed in a worker thread, so that one big batch does not
# hold up every other stream on the event loop.
OFFLOAD_BYTES: Final = 256 * 1024


class TapService:
    def __init__(
        self,
        router: HalfRouter,
        *,
        max_body_bytes: int,
        keep_text: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.router = router
        self.max_body_bytes = max_body_bytes
        self.keep_text = keep_text
        self._clock = clock

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            PROCESSOR_SERVICE,
            {
                "Process": grpc.stream_stream_rpc_method_handler(
                    self.process,
                    request_deserializer=ep.ProcessingRequest.FromString,
                    response_serializer=ep.ProcessingResponse.SerializeToString,
                )
            },
        )

    async def process(
        self, requests: AsyncIterator[ep.ProcessingRequest], context: Context
    ) -> None:
        """One tap stream. Observability mode: read only, never answer."""
        comparator = self.router.comparator
        metadata = {key: value for key, value in (context.invocation_metadata() or ())}
        role_value = metadata.get(ROLE_METADATA)
        role = Role.parse(role_value) if isinstance(role_value, str) else None
        if role is None:
            comparator.tap_problem("no_role")
            return
        stream = TapStream(role, self.max_body_bytes)
        comparator.metrics.tap_streams.inc()
        try:
            async for message in requests:
                raw = stream.feed(message, self._clock())
                if raw is not None:
                    await self._deliver(raw)
                if stream.finished:
                    break
        finally:
            comparator.metrics.tap_streams.dec()
            if stream.problem:
                comparator.tap_problem(stream.problem)
            elif not stream.finished:
                comparator.tap_problem("incomplete")
        # Returning ends the RPC now instead of after Envoy's deferred close.

    async def _deliver(self, raw: RawHalf) -> None:
        try:
            if len(raw.request_body) + len(raw.response_body) > OFFLOAD_BYTES:
                half = await asyncio.to_thread(extract_half, raw, keep_text=self.keep_text)
            else:
                half = extract_half(raw, keep_text=self.keep_text)
            self.router.submit(half)
        except Exception as exc:
            # Type only: exception text may quote request content.
            log.error("internal error on a %s half: %s", raw.role.value, type(exc).__name__)
            self.router.comparator.tap_problem("internal_error")


class PeerService:
    def __init__(self, router: HalfRouter, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.router = router
        self._clock = clock

    async def forward(self, request: pb.ForwardRequest, context: Context) -> pb.ForwardReply:
        comparator = self.router.comparator
        accepted = 0
        for message in request.halves:
            try:
                half = from_proto(message)
            except BadHalfError:
                comparator.tap_problem("bad_forward")
                continue
            comparator.accept(half, self._clock(), source="peer")
            accepted += 1
        comparator.forwarding("received", accepted)
        return pb.ForwardReply(accepted=accepted)

    async def get_tally(self, request: pb.GetTallyRequest, context: Context) -> pb.GetTallyReply:
        return pb.GetTallyReply(tally_json=orjson.dumps(self.router.comparator.tally.to_json()))
