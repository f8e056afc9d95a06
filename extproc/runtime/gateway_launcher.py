"""`extproc run`: the ext_proc server plus a real Envoy wired to it, one command.

Starts the gRPC server (in this process; with ``--workers N`` above 1, as N worker
processes: extproc_servers.py), renders the shipped Envoy config for the given
upstream and listen address (envoy_config.py), starts Envoy (envoy_process.py), waits
until Envoy reports LIVE, prints one line, and on SIGTERM/Ctrl-C stops Envoy first (no
new requests) and then drains the server (every worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extproc.core.contract import Contract
from extproc.runtime.envoy_config import (
    DEFAULT_TEMPLATE,
    EnvoySettings,
    ExtProcTls,
    Upstream,
    load_template,
    render,
    rendered_precheck_markers,
    with_extproc_tls,
)
from extproc.runtime.envoy_process import run_envoy
from extproc.runtime.envoy_tracing import collector, with_tracing
from extproc.runtime.extproc_servers import (
    ExtprocServers,
    in_process_server,
    otlp_stream_tracer,
    worker_processes,
)
from extproc.runtime.worker_pool import WorkerSettings, WorkerStartError
from extproc.service.metrics import process_metrics
from extproc.service.net import free_port, split_host_port
from extproc.service.reload import ReloadSettings
from extproc.service.stop_signals import stop_on_signals
from extproc.service.tls import TlsSettings

log = logging.getLogger("extproc.runtime.gateway_launcher")


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
    # Where the policy's rerank paths go (envoy_config.render_rerank); None: upstream.
    rerank_upstream: Upstream | None = None
    # TLS on the Envoy -> ext_proc hop: the server's side and Envoy's side.
    server_tls: TlsSettings | None = None
    envoy_tls: ExtProcTls | None = None
    reload: ReloadSettings | None = None  # live policy reload (None: the policy is fixed)
    # Called in a worker thread with the gateway's base URL once Envoy is ready (the
    # default upstream's demonstration request); the gateway serves on meanwhile.
    on_ready: Callable[[str], None] | None = None
    # ext_proc server processes: 1 serves in this process, more run as workers
    # (extproc/runtime/worker_pool.py) that load the policy from ``reload``'s file.
    workers: int = 1
    # One span per ext_proc stream (OTLP, the OTEL_* environment), and Envoy's own
    # OpenTelemetry tracer sending to the same collector (envoy_tracing.py).
    tracing: bool = False


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
        tracing=options.tracing,
    )


def gateway_servers(
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
        tracer=otlp_stream_tracer() if options.tracing else None,
    )


async def run(contract: Contract, options: RunOptions) -> int:
    stop = stop_on_signals()
    template = load_template(options.envoy_template)
    async with gateway_servers(contract, options, template) as servers:
        listen_host, listen_port = split_host_port(options.listen)
        settings = EnvoySettings(
            listen_host=listen_host,
            listen_port=listen_port,
            admin_port=free_port(),
            extproc_port=servers.ports[0],
            upstream=options.upstream,
            upstream_timeout_s=options.upstream_timeout_s,
            legacy=options.legacy,
            rerank_upstream=options.rerank_upstream,
        )
        config = render(template, settings, contract.policy)
        config = servers.render_into(config)
        if options.envoy_tls is not None:
            config = with_extproc_tls(config, options.envoy_tls)
        if options.tracing:
            config = with_tracing(config, collector())
        shown_host = "127.0.0.1" if listen_host in ("0.0.0.0", "::") else listen_host

        def ready_line(envoy_pid: int) -> str:
            return (
                f"extproc ready: http://{shown_host}:{listen_port}/v1/embeddings -> "
                f"{options.upstream.url}{_legacy_note(options.legacy)} (envoy pid {envoy_pid}, "
                f"{servers.note(options.server_tls)}, "
                f"admin 127.0.0.1:{settings.admin_port}, "
                f"models: {', '.join(contract.policy.models)}{_rerank_note(contract, options)})"
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


def _rerank_note(contract: Contract, options: RunOptions) -> str:
    paths = sorted(contract.policy.rerank_paths())
    if not paths:
        return ""
    target = options.rerank_upstream or options.upstream
    return f"; rerank {', '.join(paths)} -> {target.url}"


def _legacy_note(legacy: Upstream | None) -> str:
    return "" if legacy is None else f", every other path -> {legacy.url}"


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
