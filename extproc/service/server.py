"""The ext_proc gRPC server process: processor + health + metrics, graceful stop.

Follows grpc's aio graceful-shutdown example: on SIGTERM/SIGINT the health
service turns NOT_SERVING (so Envoy and Kubernetes stop sending new streams),
then ``server.stop(grace)`` refuses new RPCs and lets in-flight streams finish.

The server reports to the :class:`ServerMetrics` it is given (Prometheus's:
extproc/service/metrics.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable
from typing import Protocol

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from extproc.core.contract import Contract
from extproc.service.memory import trim_heap
from extproc.service.net import split_host_port
from extproc.service.reload import (
    ContractHolder,
    FixedAtStart,
    PolicyReloader,
    PolicyReloadMetrics,
    ReloadSettings,
)
from extproc.service.servicer import ExternalProcessor
from extproc.service.stream_metrics import StreamMetrics
from extproc.service.stream_tracer import StreamTracer
from extproc.service.tls import TlsReloadMetrics, TlsSettings
from extproc.service.tls_credentials import server_credentials

log = logging.getLogger("extproc.service.server")

PROCESSOR_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"


class ServerMetrics(Protocol):
    """What one ext_proc server reports, and how it shows it."""

    @property
    def streams(self) -> StreamMetrics:
        """Its streams' and its servicer's events."""

    @property
    def policy_reloads(self) -> PolicyReloadMetrics:
        """Its policy reloader's, when it reloads."""

    @property
    def tls_reloads(self) -> TlsReloadMetrics:
        """Its certificate reloader's, when it serves TLS."""

    def publish(self, host: str, port: int) -> None:
        """Serve them over HTTP (``/metrics``) on ``host:port`` from now until the
        process ends; raises OSError if the port cannot be had."""


async def serve(
    contract: Contract,
    *,
    address: str,
    metrics_address: str | None,
    grace_seconds: float,
    stop: asyncio.Event,
    metrics: ServerMetrics,
    on_ready: Callable[[int], None] | None = None,
    tls: TlsSettings | None = None,
    reload: ReloadSettings | None = None,
    budget_share: int = 1,
    tracer: StreamTracer | None = None,
) -> None:
    """Serve until ``stop`` is set, reporting to ``metrics`` (published on
    ``metrics_address``, if any). ``on_ready`` gets the bound gRPC port.

    With ``tls``, the port speaks TLS (mTLS when it names a client CA) and picks up
    new certificate files on new connections (extproc/service/tls.py); raises TlsError if
    the files are unusable. With ``reload``, a changed policy file (when watched) and
    SIGHUP load a new contract for new streams (extproc/service/reload.py).
    ``budget_share``: how many processes split the policy's admission budget (the
    workers of one host); this one admits that fraction of it.
    ``tracer``: one span per stream (extproc/service/stream_tracer.py); None: off.
    """
    limit = contract.policy.max_message_bytes()
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            # One Envoy worker multiplexes every stream on one connection.
            ("grpc.max_concurrent_streams", 10_000),
            ("grpc.so_reuseport", 0),
        ]
    )
    contracts = ContractHolder(contract)
    processor = ExternalProcessor(
        contracts, metrics.streams, budget_share=budget_share, tracer=tracer
    )
    ep_grpc.add_ExternalProcessorServicer_to_server(processor, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if tls is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, server_credentials(tls, metrics.tls_reloads))
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    if metrics_address:
        metrics_host, metrics_port = split_host_port(metrics_address)
        metrics.publish(metrics_host, metrics_port)

    await server.start()
    # Everything loaded so far (modules, the policy, tokenizers' wrappers, gRPC's and
    # prometheus' objects) lives as long as the process: moved out of the cyclic
    # collector's reach, it is not scanned again by each full collection.
    gc.freeze()
    # Parsing a tokenizer.json leaves ~100 MB of freed heap (the JSON's own objects)
    # mapped; given back once, it is not part of every worker's idle footprint.
    trim_heap()
    for service in ("", PROCESSOR_SERVICE):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "ext_proc serving on port %d%s (models: %s)",
        port,
        "" if tls is None else " with mTLS" if tls.mutual else " with TLS",
        ", ".join(contract.policy.models),
    )
    if on_ready is not None:
        on_ready(port)

    loop = asyncio.get_running_loop()
    reloading: asyncio.Task[None] | None = None
    if reload is not None:
        # Envoy's limits, this server's gRPC limit and (`extproc run`) the precheck's
        # markers were set from this policy.
        fixed = FixedAtStart.for_policy(contract.policy, reload.precheck_markers)
        reloader = PolicyReloader(reload, contracts, fixed, metrics.policy_reloads)
        reloader.mark_loaded(reload.started_from)
        loop.add_signal_handler(signal.SIGHUP, reloader.hangup.set)
        reloading = asyncio.create_task(reloader.run(stop))
    try:
        await stop.wait()
    finally:
        if reloading is not None:
            loop.remove_signal_handler(signal.SIGHUP)
            reloading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reloading
        log.info("stopping: health NOT_SERVING, draining streams for up to %.0f s", grace_seconds)
        await health_servicer.enter_graceful_shutdown()
        deadline = loop.time() + grace_seconds
        # Keep accepting streams while any is open: with envoy/standalone.yaml a
        # request whose vectors change opens a second stream when the upstream
        # answers, and refusing it would fail that in-flight request with a 503.
        # Its first stream stays open until then, so "none open" means drained.
        while processor.active_streams and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await server.stop(max(deadline - loop.time(), 0.0))
        if tracer is not None:
            await asyncio.to_thread(tracer.close)  # sends the spans still batched
        log.info("stopped")
