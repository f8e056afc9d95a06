"""The comparator process (``extproc shadow-compare``): tap streams, HTTP, expiry.

One event loop owns the :class:`Comparator`: Envoy's tap streams (gRPC, the
observability-mode ext_proc service) and the pair store's expiry timer call into
it there. ``/metrics`` is prometheus_client's WSGI app; ``/summary`` (JSON) and
``/healthz`` sit next to it in the same WSGI app, served by the standard library's
threaded WSGI server on a thread of its own. A summary is computed on the event
loop (the HTTP thread only waits for it), so the comparator needs no locks.
On stop: gRPC health turns NOT_SERVING, the tap streams drain for ``grace_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

import grpc
import orjson
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import make_wsgi_app

from extproc.core.policy.model import GatewayPolicy
from extproc.core.routes import Routes, routes_of
from extproc.service.net import split_host_port
from extproc.tools.parity import Thresholds
from extproc.tools.shadow.comparator import Comparator
from extproc.tools.shadow.half import RawHalf, Role, extract_half
from extproc.tools.shadow.pair_comparison import ShadowTolerances
from extproc.tools.shadow.store import StoreLimits
from extproc.tools.shadow.tap import ROLE_METADATA, TapStream

log = logging.getLogger("extproc.tools.shadow.comparator_server")

PROCESSOR_SERVICE: Final = "envoy.service.ext_proc.v3.ExternalProcessor"
EXPIRY_PERIOD_S: Final = 1.0
SUMMARY_TIMEOUT_S: Final = 10.0
MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
# Bodies above this are parsed in a worker thread, so that one big batch does not
# hold up every other stream on the event loop.
OFFLOAD_BYTES: Final = 256 * 1024
# A comparator given no policy knows the embeddings endpoint's spellings, and reads a
# mesh's rerank paths in whichever dialect answers.
EMBEDDINGS_ROUTES: Final = routes_of(GatewayPolicy(models={}))

Context = grpc.aio.ServicerContext[ep.ProcessingRequest, ep.ProcessingResponse]


@dataclass(frozen=True)
class CompareOptions:
    listen: str = "127.0.0.1:50061"
    http: str | None = "127.0.0.1:9300"
    limits: StoreLimits = field(default_factory=StoreLimits)
    tolerances: ShadowTolerances = field(default_factory=ShadowTolerances)
    thresholds: Thresholds = field(default_factory=Thresholds)
    expect_noise: bool = False
    keep_text: bool = False
    max_body_bytes: int = 64 * 1024 * 1024
    grace_seconds: float = 5.0
    routes: Routes = EMBEDDINGS_ROUTES  # the policy's route table: which paths rerank


@dataclass(frozen=True)
class TapService:
    """Envoy's tap streams: each message goes to a :class:`TapStream`, each finished
    exchange becomes a half for the comparator. Observability mode: never answers."""

    comparator: Comparator
    max_body_bytes: int
    keep_text: bool
    routes: Routes = EMBEDDINGS_ROUTES
    clock: Callable[[], float] = time.monotonic

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
        comparator = self.comparator
        metadata = dict(context.invocation_metadata() or ())
        try:
            role = Role(str(metadata.get(ROLE_METADATA, "")).strip().lower())
        except ValueError:
            comparator.tap_problem("no_role")
            return
        stream = TapStream(role, self.max_body_bytes)
        comparator.metrics.tap_streams.inc()
        try:
            async for message in requests:
                raw = stream.feed(message, self.clock())
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
                half = await asyncio.to_thread(
                    extract_half, raw, self.routes, keep_text=self.keep_text
                )
            else:
                half = extract_half(raw, self.routes, keep_text=self.keep_text)
            self.comparator.accept(half, self.clock())
        except Exception as exc:
            # Type only: exception text may quote request content.
            log.error("internal error on a %s half: %s", raw.role.value, type(exc).__name__)
            self.comparator.tap_problem("internal_error")


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Prometheus scrapes every few seconds: no access log."""


def http_app(comparator: Comparator, loop: asyncio.AbstractEventLoop) -> WSGIApplication:
    """``/summary`` (JSON, computed on ``loop``), ``/healthz`` and prometheus_client's
    ``/metrics``."""
    metrics = make_wsgi_app(comparator.metrics.registry)

    async def summary() -> bytes:
        return orjson.dumps(comparator.summary(), option=orjson.OPT_INDENT_2)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            served: Iterable[bytes] = metrics(environ, start_response)
            return served
        if path == "/summary":
            future = asyncio.run_coroutine_threadsafe(summary(), loop)
            body, kind = future.result(SUMMARY_TIMEOUT_S), "application/json"
        elif path == "/healthz":
            body, kind = b"ok\n", "text/plain; charset=utf-8"
        else:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found\n"]
        start_response("200 OK", [("Content-Type", kind), ("Content-Length", str(len(body)))])
        return [body]

    return app


async def serve_compare(
    options: CompareOptions,
    *,
    stop: asyncio.Event,
    on_ready: Callable[[int, int | None], None] | None = None,
) -> None:
    """Serve until ``stop`` is set. ``on_ready`` gets the gRPC and HTTP ports."""
    comparator = Comparator(
        limits=options.limits,
        tolerances=options.tolerances,
        thresholds=options.thresholds,
        expect_noise=options.expect_noise,
    )
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            # Every Envoy worker multiplexes its tap streams on one connection, and
            # observability-mode streams stay open a few seconds after the response.
            ("grpc.max_concurrent_streams", 10_000),
            ("grpc.so_reuseport", 0),
        ]
    )
    port = server.add_insecure_port(options.listen)
    if port == 0:
        raise OSError(f"cannot listen on {options.listen}")
    tap = TapService(comparator, options.max_body_bytes, options.keep_text, options.routes)
    health_servicer = health.aio.HealthServicer()
    server.add_generic_rpc_handlers((tap.handler(),))
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)

    http_server: WSGIServer | None = None
    http_port: int | None = None
    if options.http:
        host, wanted = split_host_port(options.http)
        app = http_app(comparator, asyncio.get_running_loop())
        http_server = make_server(host, wanted, app, _ThreadingWSGIServer, _QuietHandler)
        http_port = int(http_server.server_address[1])
        threading.Thread(target=http_server.serve_forever, name="shadow-http", daemon=True).start()

    await server.start()
    for service in ("", PROCESSOR_SERVICE):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    log.info("shadow comparator on gRPC port %d, HTTP port %s", port, http_port)
    expiry = asyncio.create_task(_expire_forever(comparator))
    if on_ready is not None:
        on_ready(port, http_port)
    try:
        await stop.wait()
    finally:
        log.info(
            "stopping: health NOT_SERVING, draining tap streams for %.0f s", options.grace_seconds
        )
        await health_servicer.enter_graceful_shutdown()
        await server.stop(options.grace_seconds)
        expiry.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await expiry
        if http_server is not None:
            await asyncio.to_thread(http_server.shutdown)
            http_server.server_close()
        log.info("stopped")


async def _expire_forever(comparator: Comparator) -> None:
    while True:
        await asyncio.sleep(EXPIRY_PERIOD_S)
        comparator.expire(time.monotonic())
