"""``extproc shadow``: the whole shadow set-up on one machine, one command.

Starts, in this process, the contract gateway's ext_proc server (with ``--workers N``
above 1, N worker processes instead: extproc/runtime/worker_pool.py) and a comparator;
renders the shipped shadow config (``envoy/shadow.yaml``, or
``envoy/shadow-reverse.yaml`` with ``--reverse``) for the given baseline and
candidate; starts Envoy; prints one line when everything is up. On SIGTERM or
Ctrl-C it stops Envoy first, then the comparator and the gateway server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from extproc.core.contract import Contract
from extproc.runtime.envoy_config import Upstream, load_template
from extproc.runtime.envoy_process import run_envoy
from extproc.runtime.extproc_servers import ExtprocServers, in_process_server, worker_processes
from extproc.runtime.gateway_launcher import run_to_exit_status
from extproc.runtime.worker_pool import WorkerSettings
from extproc.service.metrics import process_metrics
from extproc.service.net import free_port, split_host_port
from extproc.service.stop_signals import stop_on_signals
from extproc.tools.shadow.comparator_server import CompareOptions, serve_compare
from extproc.tools.shadow.envoy_render import ShadowEnvoySettings, render_shadow, template_path


@dataclass(frozen=True)
class ShadowRunOptions:
    baseline: Upstream
    candidate: Upstream
    listen: str = "127.0.0.1:8080"
    percent: float = 100.0
    reverse: bool = False
    noise: Upstream | None = None
    legacy: Upstream | None = None  # split migration: every other path goes here
    rerank_candidate: Upstream | None = None  # the policy's rerank paths shadowed too
    compare: CompareOptions = field(default_factory=lambda: CompareOptions(listen="127.0.0.1:0"))
    metrics_address: str | None = None  # the gateway server's Prometheus
    grace_seconds: float = 5.0
    envoy_log_level: str = "warning"
    envoy_concurrency: int | None = None
    upstream_timeout_s: float = 300.0
    template: Path | None = None  # default: the shipped shadow(-reverse).yaml
    gateway_template: Path | None = None  # another gateway config for the candidate side
    # ext_proc server processes of the gateway: 1 serves in this process; more run as
    # workers that load ``policy_file`` (with ``tokenizer_overrides``) themselves.
    workers: int = 1
    policy_file: Path | None = None
    tokenizer_overrides: Mapping[str, Path] = field(default_factory=dict)


def gateway_servers(
    contract: Contract, options: ShadowRunOptions
) -> contextlib.AbstractAsyncContextManager[ExtprocServers]:
    """The contract gateway's ext_proc server(s); the policy stays as started (no
    watch), as in this process."""
    if options.workers == 1:
        return in_process_server(
            contract,
            metrics=process_metrics(),
            metrics_address=options.metrics_address,
            grace_seconds=options.grace_seconds,
        )
    if options.policy_file is None:
        raise ValueError("workers load the policy from a file: policy_file is needed")
    settings = WorkerSettings(
        count=options.workers,
        config=options.policy_file,
        tokenizer_overrides=options.tokenizer_overrides,
        grace_seconds=options.grace_seconds,
        watch=False,
        log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower(),
    )
    return worker_processes(settings, options.metrics_address)


async def run_shadow(contract: Contract, options: ShadowRunOptions) -> int:
    stop = stop_on_signals()
    compare_ready: asyncio.Future[tuple[int, int | None]] = (
        asyncio.get_running_loop().create_future()
    )
    compare_stop = asyncio.Event()
    compare_options = replace(
        options.compare, expect_noise=options.noise is not None, routes=contract.routes
    )
    comparator = asyncio.create_task(
        serve_compare(
            compare_options,
            stop=compare_stop,
            on_ready=lambda grpc_port, http_port: compare_ready.set_result((grpc_port, http_port)),
        )
    )
    try:
        async with gateway_servers(contract, options) as gateway:
            waiting: set[asyncio.Future[Any]] = {comparator, compare_ready}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if not compare_ready.done():
                comparator.result()  # re-raises why it could not start
                return 1
            compare_port, http_port = compare_ready.result()
            listen_host, listen_port = split_host_port(options.listen)
            settings = ShadowEnvoySettings(
                listen_host=listen_host,
                listen_port=listen_port,
                admin_port=free_port(),
                shadow_port=free_port(),
                noise_port=free_port(),
                extproc_port=gateway.ports[0],
                compare=(("127.0.0.1", compare_port),),
                baseline=options.baseline,
                candidate=options.candidate,
                noise=options.noise,
                percent=options.percent,
                candidate_gateway_port=free_port() if options.reverse else 0,
                upstream_timeout_s=options.upstream_timeout_s,
                legacy=options.legacy,
                rerank_candidate=options.rerank_candidate,
            )
            template = options.template or template_path(reverse=options.reverse)
            gateway_config = (
                load_template(options.gateway_template) if options.gateway_template else None
            )
            config = render_shadow(
                load_template(template), settings, contract.policy, gateway=gateway_config
            )
            return await run_envoy(
                gateway.render_into(config),
                admin_port=settings.admin_port,
                log_level=options.envoy_log_level,
                concurrency=options.envoy_concurrency,
                ready_line=lambda pid: _ready_line(options, settings, pid, http_port),
                stop=stop,
                servers=(comparator, *gateway.watched),
            )
    finally:
        compare_stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await comparator


def _ready_line(
    options: ShadowRunOptions, settings: ShadowEnvoySettings, envoy_pid: int, http_port: int | None
) -> str:
    shown = "127.0.0.1" if settings.listen_host in ("0.0.0.0", "::") else settings.listen_host
    baseline = f"baseline {options.baseline.url}"
    candidate = f"candidate {options.candidate.url} through the gateway"
    primary, shadow = (candidate, baseline) if options.reverse else (baseline, candidate)
    noise = f" and noise {options.noise.url}" if options.noise else ""
    if options.rerank_candidate is not None:
        noise += f"; rerank paths too (candidate reranker {options.rerank_candidate.url})"
    http = f"http://127.0.0.1:{http_port}" if http_port else "(no HTTP)"
    return (
        f"extproc shadow ready: http://{shown}:{settings.listen_port}/v1/embeddings -> "
        f"{primary} (primary); {options.percent:g}% mirrored to {shadow}{noise}; "
        f"summary {http}/summary, metrics {http}/metrics "
        f"(envoy pid {envoy_pid}, admin 127.0.0.1:{settings.admin_port})"
    )


def main_shadow(contract: Contract, options: ShadowRunOptions) -> int:
    return run_to_exit_status(run_shadow(contract, options))
