"""A do-nothing ext_proc processor: the floor under any Python ext_proc server here.

It speaks the same grpc.aio service as ``extproc serve`` (same server options) but
does no work: every message gets an empty reply of its kind. Two things mimic the
shipped server's *message pattern* without its work, so that the shipped Envoy
config sends exactly the messages it sends for the real gateway:

- a request body containing ``"dimensions"`` (a byte search, no parsing) is answered
  as for a request whose vectors change: on standalone.yaml's one-stream route (F:
  its precheck picked that route, and the stream's gRPC metadata says the response
  comes on it) with the ``embgw.respond`` cue alone, and the response body then comes
  on the same stream; elsewhere (U: S without its precheck) with the plan metadata
  and a route-cache clear, so Envoy re-routes the request to the rewrite route and
  opens the response stream;
- a response body is answered with ``embgw.status = "200"`` for the Lua filter;
- each stream ends where the shipped server ends it (extproc/service/servicer.py):
  after the response body, after the response headers of a request whose answer
  passes, or after a one-message stream's request body when no response follows on
  it. (A floor that left every end to Envoy cost Envoy ~0.15 ms more per plain
  request at c=16, more than the server's own work.)

The benchmark runs the shipped and the naive Envoy configs against this processor too
(cases F and Z): what remains is the cost of the gRPC streams and messages alone, the
bound that no amount of work saved inside the gateway can go below.

On ``--listen-native`` (optional, same process) it answers as the shipped server does
for a model whose upstream cuts ``dimensions`` itself: ``"dimensions"`` marks nothing,
every request body gets an empty reply (case F-n, the floor of S-n).

On ``--listen-library`` (optional, same process) it keeps the same message pattern
but also does the contract's body work with the libraries alone
(``bench/library_floor.py``) and sends the new bodies back (case L: the least any
Python server doing that work costs).

    python -m bench.floor_processor --listen 127.0.0.1:50061 [--listen-native HOST:PORT]
        [--listen-library HOST:PORT]     (from the checkout: it imports bench.library_floor)
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from bench.library_floor import request_work, response_work

_MAX_MESSAGE = 64 * 1024 * 1024
_REWRITE_MARK = b'"dimensions"'
# The gRPC metadata standalone.yaml sets (extproc/service/servicer.py).
ONE_MESSAGE = "x-embgw-one-message"
RESPONSE_ON_STREAM = "x-embgw-response-on-stream"


def floor_reply(
    request: ep.ProcessingRequest, *, rewrite: bool = False, response_on_stream: bool = False
) -> ep.ProcessingResponse:
    """The empty reply of the message's kind; for the request body of a ``rewrite``,
    what the shipped server adds on standalone.yaml (``response_on_stream``: the
    one-stream route's cue; else the plan and a route-cache clear)."""
    kind = request.WhichOneof("request")
    reply = ep.ProcessingResponse()
    if kind == "request_body":
        reply.request_body.SetInParent()  # an empty reply must still name its kind
        common = reply.request_body.response
        if rewrite and response_on_stream:
            reply.dynamic_metadata.update({"embgw": {"respond": "rewrite"}})
        elif rewrite:
            reply.dynamic_metadata.update({"embgw": {"respond": "rewrite", "plan": "{}"}})
            common.clear_route_cache = True
            # Envoy honours clear_route_cache only in a reply that mutates headers.
            common.header_mutation.set_headers.add(
                header=base_pb2.HeaderValue(key="content-type", raw_value=b"application/json")
            )
    elif kind == "response_body":
        reply.response_body.SetInParent()
        reply.dynamic_metadata.update({"embgw": {"status": "200"}})
    elif kind == "request_headers":
        reply.request_headers.SetInParent()
    elif kind == "response_headers":
        reply.response_headers.SetInParent()
    elif kind == "request_trailers":
        reply.request_trailers.SetInParent()
    elif kind == "response_trailers":
        reply.response_trailers.SetInParent()
    return reply


class FloorProcessor(ep_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, *, marks_rewrites: bool = True, library_work: bool = False) -> None:
        self.marks_rewrites = marks_rewrites
        self.library_work = library_work

    async def Process(  # noqa: N802 - the proto's method name
        self, request_iterator: AsyncIterator[ep.ProcessingRequest], context: Any
    ) -> AsyncIterator[ep.ProcessingResponse]:
        metadata = tuple(context.invocation_metadata() or ())
        one_message = (ONE_MESSAGE, "1") in metadata
        on_stream = (RESPONSE_ON_STREAM, "1") in metadata
        saw_headers = rewrite = False
        requests = aiter(request_iterator)
        async for request in requests:
            kind = request.WhichOneof("request")
            saw_headers = saw_headers or kind == "request_headers"
            if kind == "request_body":
                rewrite = self.marks_rewrites and _REWRITE_MARK in request.request_body.body
            # The one-filter shape gets its response on this stream: no metadata.
            marked = rewrite and kind == "request_body" and not saw_headers
            reply = floor_reply(request, rewrite=marked, response_on_stream=on_stream)
            if self.library_work:
                _add_library_work(request, reply, rewrite)
            yield reply
            # End the stream where the shipped server ends it (servicer.py): once the
            # response is decided (its headers when nothing is rewritten, else its
            # body), or after a one-message stream's request body whose response is
            # not processed. Left to Envoy, the end would cost both sides more.
            if (
                kind == "response_body"
                or (kind == "response_headers" and not rewrite)
                or (one_message and kind == "request_body" and not rewrite)
            ):
                aclose = getattr(requests, "aclose", None)
                if aclose is not None:
                    await aclose()
                break


def _add_library_work(
    request: ep.ProcessingRequest, reply: ep.ProcessingResponse, rewrite: bool
) -> None:
    """The library floor's new bodies (bench/library_floor.py) on the floor's reply."""
    kind = request.WhichOneof("request")
    if kind == "request_body":
        body = request_work(request.request_body.body, rewrite)
        if body is not None:
            reply.request_body.response.body_mutation.body = body
    elif kind == "response_body" and rewrite:
        reply.response_body.response.body_mutation.body = response_work(request.response_body.body)


async def _start(address: str, processor: FloorProcessor) -> grpc.aio.Server:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            ("grpc.max_concurrent_streams", 10_000),
            ("grpc.so_reuseport", 0),
        ]
    )
    ep_grpc.add_ExternalProcessorServicer_to_server(processor, server)
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen on {address}")
    await server.start()
    return server


async def serve(
    address: str, native_address: str | None = None, library_address: str | None = None
) -> None:
    servers = [await _start(address, FloorProcessor())]
    if native_address:
        servers.append(await _start(native_address, FloorProcessor(marks_rewrites=False)))
    if library_address:
        servers.append(await _start(library_address, FloorProcessor(library_work=True)))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        await server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT")
    parser.add_argument("--listen-native", help="HOST:PORT of the F-n floor (optional)")
    parser.add_argument("--listen-library", help="HOST:PORT of the library floor L (optional)")
    args = parser.parse_args()
    asyncio.run(serve(args.listen, args.listen_native, args.listen_library))


if __name__ == "__main__":
    main()
