"""The ext_proc server(s) a launcher points Envoy at: one in this process, or worker
processes (extproc/runtime/worker_pool.py), each serving on its own loopback port until
the block that holds them ends, then drained; and the contract the launcher itself
keeps for them (:func:`launcher_contract`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from extproc.core.contract import Contract
from extproc.runtime.envoy_config import with_extproc_workers
from extproc.runtime.worker_pool import WorkerHooks, WorkerPool, WorkerSettings
from extproc.service.memory import fix_mmap_threshold, trim_heap
from extproc.service.net import free_port
from extproc.service.reload import ReloadSettings
from extproc.service.tls import TlsSettings

if TYPE_CHECKING:
    from extproc.service.server import ServerMetrics
    from extproc.service.stream_tracer import StreamTracer


def launcher_contract(load: Callable[[], Contract | None], workers: int) -> Contract | None:
    """What a launcher (`extproc run`, `extproc shadow`) starts from: the contract
    ``load`` gives (None when it gives None, having said why). The whole contract is
    loaded, tokenizers included (a prompt's length needs them), so that a policy that
    cannot be served stops the launcher once rather than once per worker. Worker
    processes load their own tokenizers: with them the launcher keeps the policy alone
    and gives the tokenizers' memory back."""
    fix_mmap_threshold()  # before the tokenizers load (extproc/service/memory.py)
    contract = load()
    if contract is None or workers == 1:
        return contract
    policy = contract.policy
    del contract
    gc.collect()
    trim_heap()
    return Contract(policy=policy, tokenizers={})


def otlp_stream_tracer() -> StreamTracer:
    """The OpenTelemetry stream tracer: OpenTelemetry is imported only when tracing
    is on (extproc/service/tracing.py)."""
    from extproc.service.tracing import OtlpStreamTracer

    return OtlpStreamTracer()


async def start_server(
    contract: Contract,
    *,
    metrics: ServerMetrics,
    metrics_address: str | None,
    grace_seconds: float,
    stop: asyncio.Event,
    tls: TlsSettings | None = None,
    reload: ReloadSettings | None = None,
    tracer: StreamTracer | None = None,
) -> tuple[asyncio.Task[None], int]:
    """The ext_proc server on a free loopback port, as a task serving until ``stop``
    is set, and that port, once it listens. Raises why it could not start."""
    # Imported here: a launcher of workers never serves, and stays without grpc.
    from extproc.service.server import serve

    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(
        serve(
            contract,
            address="127.0.0.1:0",
            metrics_address=metrics_address,
            grace_seconds=grace_seconds,
            stop=stop,
            metrics=metrics,
            on_ready=ready.set_result,
            tls=tls,
            reload=reload,
            tracer=tracer,
        )
    )
    waiting: set[asyncio.Future[Any]] = {server, ready}
    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        server.result()  # re-raises why the server could not start
        raise RuntimeError("the ext_proc server stopped before it listened")
    return server, ready.result()


@dataclass(frozen=True)
class ExtprocServers:
    """The ext_proc server(s) Envoy is pointed at while they serve."""

    ports: tuple[int, ...]
    watched: tuple[asyncio.Future[Any], ...]  # one ending means the server is gone

    def render_into(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` (rendered for the first port) pointed at every worker."""
        return config if len(self.ports) == 1 else with_extproc_workers(config, self.ports)

    def note(self, tls: TlsSettings | None) -> str:
        """How the ready line names them."""
        addresses = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        workers = "" if len(self.ports) == 1 else f" ({len(self.ports)} workers)"
        return f"ext_proc {addresses}{_tls_note(tls)}{workers}"


@contextlib.asynccontextmanager
async def in_process_server(
    contract: Contract,
    *,
    metrics: ServerMetrics,
    metrics_address: str | None,
    grace_seconds: float,
    tls: TlsSettings | None = None,
    reload: ReloadSettings | None = None,
    tracer: StreamTracer | None = None,
) -> AsyncIterator[ExtprocServers]:
    """The ext_proc server in this process until the block ends, then drained."""
    server_stop = asyncio.Event()
    server, port = await start_server(
        contract,
        metrics=metrics,
        metrics_address=metrics_address,
        grace_seconds=grace_seconds,
        stop=server_stop,
        tls=tls,
        reload=reload,
        tracer=tracer,
    )
    try:
        yield ExtprocServers((port,), (server,))
    finally:
        server_stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await server


@contextlib.asynccontextmanager
async def worker_processes(
    settings: WorkerSettings, metrics_address: str | None
) -> AsyncIterator[ExtprocServers]:
    """``settings.count`` worker processes, each serving, kept running (restarted when
    one exits) until the block ends; then every one is drained (SIGTERM), SIGHUP is
    passed to each meanwhile, and ``metrics_address`` serves all their metrics."""
    from extproc.runtime.worker_metrics import WorkerMetrics

    metrics = WorkerMetrics(metrics_address) if metrics_address else None
    hooks = WorkerHooks()
    if metrics is not None:
        settings = dataclasses.replace(settings, metrics_dir=metrics.directory)
        hooks = WorkerHooks(metrics.worker_exited, metrics.restarts.inc, metrics.serving.set)
    pool = WorkerPool(settings, [free_port() for _ in range(settings.count)], hooks)
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGHUP, pool.hangup)
        await pool.start()
        supervising = asyncio.create_task(pool.supervise())
        try:
            yield ExtprocServers(tuple(pool.ports), (supervising,))
        finally:
            await pool.stop()
            supervising.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervising
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        if metrics is not None:
            metrics.close()


def _tls_note(tls: TlsSettings | None) -> str:
    return "" if tls is None else " mTLS" if tls.mutual else " TLS"
