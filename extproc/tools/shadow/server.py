"""The comparator process (``extproc shadow-compare``): tap + peer gRPC, HTTP, timers.

One event loop runs: the gRPC server (Envoy's tap streams, the peer service,
gRPC health), the HTTP server (``/summary``, ``/metrics``, ``/healthz``), the
expiry timer of the pair store and, with ``dns:`` peers, the peer-list refresh.
On stop: health turns NOT_SERVING, the gRPC server drains for ``grace_s``, the
links to peers close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import grpc
import orjson
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from extproc.service.net import split_host_port
from extproc.tools.shadow.comparator import Comparator
from extproc.tools.shadow.compare import Tolerances
from extproc.tools.shadow.forwarder import MAX_MESSAGE_BYTES, ForwardLimits, HalfRouter
from extproc.tools.shadow.http_api import Handler, HttpReply, start_http
from extproc.tools.shadow.ownership import PeerSpec
from extproc.tools.shadow.peer import SERVICE as PEER_SERVICE
from extproc.tools.shadow.peer import peer_handler
from extproc.tools.shadow.services import PROCESSOR_SERVICE, PeerService, TapService
from extproc.tools.shadow.store import StoreLimits
from extproc.tools.shadow.tally import Tally
from extproc.tools.shadow.verdict import Thresholds

log = logging.getLogger("extproc.tools.shadow.server")

EXPIRY_PERIOD_S: Final = 1.0
PEER_TALLY_TIMEOUT_S: Final = 2.0


@dataclass(frozen=True)
class CompareOptions:
    listen: str = "127.0.0.1:50061"
    http: str | None = "127.0.0.1:9300"
    peers: PeerSpec = field(default_factory=PeerSpec)
    self_address: str | None = None
    limits: StoreLimits = field(default_factory=StoreLimits)
    tolerances: Tolerances = field(default_factory=Tolerances)
    thresholds: Thresholds = field(default_factory=Thresholds)
    expect_noise: bool = False
    keep_text: bool = False
    max_body_bytes: int = 64 * 1024 * 1024
    peer_refresh_s: float = 10.0
    forward: ForwardLimits = field(default_factory=ForwardLimits)
    grace_s: float = 5.0


def resolve_self(options: CompareOptions, bound_port: int) -> str:
    """The name this replica has in the peer list."""
    if options.self_address:
        return options.self_address
    if options.peers.static or options.peers.is_dns:
        raise ValueError("--self HOST:PORT is required with --peers")
    host, _ = split_host_port(options.listen)
    return f"{host}:{bound_port}"


async def resolve_dns(name: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(
        name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    addresses = sorted({str(info[4][0]) for info in infos})
    return [f"[{a}]:{port}" if ":" in a else f"{a}:{port}" for a in addresses]


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
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # Every Envoy worker multiplexes its tap streams on one connection, and
            # observability-mode streams stay open a few seconds after the response.
            ("grpc.max_concurrent_streams", 10_000),
            ("grpc.so_reuseport", 0),
        ]
    )
    port = server.add_insecure_port(options.listen)
    if port == 0:
        raise OSError(f"cannot listen on {options.listen}")
    router = HalfRouter(
        comparator, self_address=resolve_self(options, port), limits=options.forward
    )
    tap = TapService(router, max_body_bytes=options.max_body_bytes, keep_text=options.keep_text)
    peers = PeerService(router)
    health_servicer = health.aio.HealthServicer()
    server.add_generic_rpc_handlers((tap.handler(), peer_handler(peers.forward, peers.get_tally)))
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)

    await router.set_peers(options.peers.static)
    if options.peers.is_dns:
        await _refresh_dns(router, options.peers)

    http_server: asyncio.Server | None = None
    http_port: int | None = None
    if options.http:
        host, wanted = split_host_port(options.http)
        http_server = await start_http(host, wanted, _http_handler(router))
        http_port = int(http_server.sockets[0].getsockname()[1])

    await server.start()
    for service in ("", PROCESSOR_SERVICE, PEER_SERVICE):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "shadow comparator on gRPC port %d, HTTP port %s, as %s among %d replica(s)",
        port,
        http_port,
        router.self_address,
        len(router.peers),
    )
    timers = [asyncio.create_task(_expire_forever(comparator))]
    if options.peers.is_dns:
        timers.append(
            asyncio.create_task(_dns_forever(router, options.peers, options.peer_refresh_s))
        )
    if on_ready is not None:
        on_ready(port, http_port)
    try:
        await stop.wait()
    finally:
        log.info("stopping: health NOT_SERVING, draining tap streams for %.0f s", options.grace_s)
        await health_servicer.enter_graceful_shutdown()
        if http_server is not None:
            http_server.close()
        await server.stop(options.grace_s)
        for timer in timers:
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer
        await router.close()
        log.info("stopped")


async def _expire_forever(comparator: Comparator) -> None:
    while True:
        await asyncio.sleep(EXPIRY_PERIOD_S)
        comparator.expire(time.monotonic())


async def _dns_forever(router: HalfRouter, spec: PeerSpec, period_s: float) -> None:
    while True:
        await asyncio.sleep(period_s)
        await _refresh_dns(router, spec)


async def _refresh_dns(router: HalfRouter, spec: PeerSpec) -> None:
    assert spec.dns_name is not None
    try:
        async with asyncio.timeout(5):
            peers = await resolve_dns(spec.dns_name, spec.dns_port)
    except (OSError, TimeoutError) as exc:
        log.warning(
            "cannot resolve peers %s: %s (keeping %d)", spec.dns_name, exc, len(router.peers)
        )
        return
    await router.set_peers(peers)


def _http_handler(router: HalfRouter) -> Handler:
    comparator = router.comparator

    async def handle(path: str, query: dict[str, str]) -> HttpReply:
        if path == "/summary":
            summary = await cluster_summary(router, local=query.get("scope") == "local")
            return HttpReply(
                200, "application/json", orjson.dumps(summary, option=orjson.OPT_INDENT_2)
            )
        if path == "/metrics":
            return HttpReply(200, CONTENT_TYPE_LATEST, generate_latest(comparator.metrics.registry))
        if path == "/healthz":
            return HttpReply(200, "text/plain; charset=utf-8", b"ok\n")
        return HttpReply(404, "text/plain; charset=utf-8", b"not found\n")

    return handle


async def cluster_summary(router: HalfRouter, *, local: bool = False) -> dict[str, Any]:
    """This replica's summary merged with every peer's tally (or its own only)."""
    tallies: list[Tally] = []
    unreachable: list[str] = []
    if not local:
        documents, unreachable = await router.peer_tallies_json(PEER_TALLY_TIMEOUT_S)
        for document in documents:
            try:
                tallies.append(Tally.from_json(orjson.loads(document)))
            except (ValueError, KeyError, TypeError):
                unreachable.append("(unreadable tally)")
    summary = router.comparator.summary(tallies)
    summary["replicas"] = {
        "scope": "local" if local else "cluster",
        "self": router.self_address,
        "peers": list(router.peers),
        "merged": 1 + len(tallies),
        "unreachable": unreachable,
        "pending_here": router.comparator.store.pending,
    }
    return summary
