"""`extproc run --workers N`: N `extproc serve` processes behind the one Envoy, kept running.

One Python process serves ext_proc streams on one core at most (the interpreter lock);
N worker processes, each on its own loopback port, let a host use N. Envoy's ext_proc
cluster lists every worker's port (``envoy_config.with_extproc_workers``): it balances
streams, not connections, so each worker takes a share. (SO_REUSEPORT on one port would
spread nothing: Envoy keeps one long-lived HTTP/2 connection per Envoy worker thread.)

Rules (docs/operations.md, "Workers"):

1. Each worker is ``extproc serve`` (extproc/runtime/worker_process.py) with the
   launcher's policy file, tokenizers, TLS files, --grace and --no-watch. It loads the
   policy itself, so a worker restarted later serves the file as it is then.
2. Start: every worker must be ready before Envoy starts; one that exits first stops
   the command (its own error is in the log). Ready is read from outside, whatever TLS
   the port speaks: the worker catches SIGHUP (``/proc/PID/status``), which `extproc
   serve` arranges right after its health service says SERVING (until then the worker
   ignores SIGHUP).
3. A worker that exits while the launcher runs is restarted on the same port: at once
   after a worker that ran ``STABLE_S``, else after a delay that doubles up to
   ``MAX_RESTART_DELAY_S``. Each restart is logged and counted
   (``extproc_worker_restarts_total`` on the launcher's /metrics). Meanwhile Envoy
   sends that worker's share to the others (its streams in flight fail closed: 503).
4. SIGHUP is passed to every worker (each reloads its policy); one that is starting
   gets it once it serves.
5. Stop: SIGTERM to every worker at once, each drains for up to its --grace, then
   SIGKILL for one still running ``STOP_MARGIN_S`` later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from extproc.service.tls import TlsSettings

log = logging.getLogger("extproc.runtime.worker_pool")

READY_TIMEOUT_S = 120.0  # a worker loads its tokenizers before it listens
READY_POLL_S = 0.1
STABLE_S = 30.0  # a worker that ran this long is restarted at once
FIRST_RESTART_DELAY_S = 0.1
MAX_RESTART_DELAY_S = 10.0
STOP_MARGIN_S = 5.0
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
# The worker's command line, by module name (a worker is a process of its own): the
# runtime's entry point that serves as `extproc serve` does.
WORKER_MODULE = "extproc.runtime.worker_process"
# What a worker (extproc/runtime/worker_process.py) reads from its environment.
WORKER_INDEX_ENV = "EXTPROC_WORKER_INDEX"  # its number in the logs
# How many workers share the host: each admits its share of the policy's budget.
WORKER_COUNT_ENV = "EXTPROC_WORKER_COUNT"
LAUNCHER_PID_ENV = "EXTPROC_WORKER_LAUNCHER_PID"  # whom to die with
LOG_LEVEL_ENV = "EXTPROC_LOG_LEVEL"
# The precheck markers the launcher rendered into Envoy, comma-separated (possibly
# empty): each worker's reloader names a policy that needs others (reload.py).
PRECHECK_MARKERS_ENV = "EXTPROC_WORKER_PRECHECK_MARKERS"
# Read by `extproc serve` for its defaults: a worker must not serve /metrics itself
# (the launcher serves every worker's) nor listen where the launcher was told to.
_LAUNCHER_ONLY_ENV = ("EXTPROC_METRICS", "EXTPROC_LISTEN")


class WorkerStartError(RuntimeError):
    """A worker exited, or did not serve in time, while the command was starting."""


@dataclass(frozen=True)
class WorkerSettings:
    """What every worker is started with."""

    count: int
    config: Path
    tokenizer_overrides: Mapping[str, Path] = field(default_factory=dict)
    grace_seconds: float = 30.0
    watch: bool = True
    tls: TlsSettings | None = None  # the ext_proc port's TLS (the workers' side)
    log_level: str = "info"
    metrics_dir: Path | None = None  # prometheus_client's multiprocess directory
    precheck_markers: tuple[str, ...] | None = None  # what Envoy's precheck searches for
    tracing: bool = False  # each worker records its streams' spans (--tracing)


def worker_argv(settings: WorkerSettings, port: int) -> list[str]:
    """The command line of the worker listening on 127.0.0.1:``port``."""
    argv = [sys.executable, "-m", WORKER_MODULE]
    argv += ["--listen", f"127.0.0.1:{port}", "--config", str(settings.config)]
    for name, directory in settings.tokenizer_overrides.items():
        argv += ["--tokenizer", f"{name}={directory}"]
    argv += ["--grace", f"{settings.grace_seconds:g}"]
    if settings.tracing:
        argv.append("--tracing")
    if not settings.watch:
        argv.append("--no-watch")
    if settings.tls is not None:
        argv += ["--tls-cert", str(settings.tls.cert_file), "--tls-key", str(settings.tls.key_file)]
        if settings.tls.client_ca_file is not None:
            argv += ["--tls-client-ca", str(settings.tls.client_ca_file)]
    return argv


def worker_env(
    settings: WorkerSettings, index: int, base: Mapping[str, str], launcher_pid: int
) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in _LAUNCHER_ONLY_ENV}
    env.pop(METRICS_DIR_ENV, None)
    env.pop(PRECHECK_MARKERS_ENV, None)
    if settings.precheck_markers is not None:
        env[PRECHECK_MARKERS_ENV] = ",".join(settings.precheck_markers)
    if settings.metrics_dir is not None:
        env[METRICS_DIR_ENV] = str(settings.metrics_dir)
    env[WORKER_INDEX_ENV] = str(index)
    env[WORKER_COUNT_ENV] = str(settings.count)
    env[LAUNCHER_PID_ENV] = str(launcher_pid)
    env[LOG_LEVEL_ENV] = settings.log_level
    return env


def restart_delay(previous_s: float | None, ran_s: float) -> float:
    """Seconds to wait before restarting a worker that ran ``ran_s``: the first delay
    after a stable run, else double the previous one, at most MAX_RESTART_DELAY_S."""
    if previous_s is None or ran_s >= STABLE_S:
        return FIRST_RESTART_DELAY_S
    return min(previous_s * 2, MAX_RESTART_DELAY_S)


@dataclass
class Worker:
    index: int  # 1..N, as the logs name it
    port: int
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    serving: bool = False
    hangup_pending: bool = False
    restarts: int = 0
    delay_s: float | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid


def _nothing(*_: object) -> None:
    pass


@dataclass(frozen=True)
class WorkerHooks:
    """What the pool reports as it goes (the launcher's metrics)."""

    exited: Callable[[int], None] = _nothing  # a worker's PID, once it has exited
    restarted: Callable[[], None] = _nothing  # a worker is being restarted
    serving: Callable[[int], None] = _nothing  # how many workers serve now


class WorkerPool:
    """The worker processes of one `extproc run`, started, kept and stopped here."""

    def __init__(
        self, settings: WorkerSettings, ports: list[int], hooks: WorkerHooks | None = None
    ) -> None:
        if settings.count != len(ports) or settings.count < 1:
            raise ValueError("one port per worker, at least one worker")
        self.settings = settings
        self.workers = [Worker(i + 1, port) for i, port in enumerate(ports)]
        self._hooks = hooks or WorkerHooks()
        self._stopping = False

    @property
    def ports(self) -> list[int]:
        return [w.port for w in self.workers]

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers if w.pid is not None]

    async def start(self) -> None:
        """Start every worker and wait until each serves; raises WorkerStartError."""
        for worker in self.workers:
            await self._spawn(worker)
        waits = [self._wait_serving(w, READY_TIMEOUT_S) for w in self.workers]
        results = await asyncio.gather(*waits, return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.stop()
            raise WorkerStartError("; ".join(str(f) for f in failures))

    async def supervise(self) -> None:
        """Restart workers as they exit, until ``stop`` (runs forever otherwise)."""
        await asyncio.gather(*(self._keep(w) for w in self.workers))

    def hangup(self) -> None:
        """SIGHUP to every serving worker; the starting ones get it once they serve."""
        for worker in self.workers:
            if worker.serving and worker.process is not None:
                _signal(worker.process, signal.SIGHUP)
            else:
                worker.hangup_pending = True

    async def stop(self) -> None:
        """SIGTERM to every worker, then wait for them (SIGKILL after the grace)."""
        self._stopping = True
        running = [w.process for w in self.workers if w.process and w.process.returncode is None]
        for process in running:
            _signal(process, signal.SIGTERM)
        allowed = self.settings.grace_seconds + STOP_MARGIN_S
        deadline = time.monotonic() + allowed
        for process in running:
            try:
                await asyncio.wait_for(process.wait(), max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                log.warning(
                    "worker pid %d still running after %.0f s: killed", process.pid, allowed
                )
                _signal(process, signal.SIGKILL)
                await process.wait()
        for worker in self.workers:
            worker.serving = False
            if worker.pid is not None:
                self._hooks.exited(worker.pid)
        self._hooks.serving(0)

    # -- one worker's life --------------------------------------------------------------

    async def _spawn(self, worker: Worker) -> None:
        env = worker_env(self.settings, worker.index, os.environ, os.getpid())
        # Its own session: a terminal's Ctrl-C reaches the launcher only, which then
        # stops the workers in order (rather than every process at once).
        worker.process = await asyncio.create_subprocess_exec(
            *worker_argv(self.settings, worker.port),
            stdin=asyncio.subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        worker.started_at = time.monotonic()
        worker.serving = False
        log.info("worker %d started (pid %d, %s)", worker.index, worker.pid, worker.address)

    async def _wait_serving(self, worker: Worker, timeout_s: float) -> None:
        assert worker.process is not None
        process = worker.process
        deadline = time.monotonic() + timeout_s
        while not catches_sighup(_status(process.pid)):
            if process.returncode is not None:
                raise WorkerStartError(
                    f"worker {worker.index} exited with status {process.returncode} "
                    "before it served"
                )
            if time.monotonic() > deadline:
                raise WorkerStartError(f"worker {worker.index} did not serve in {timeout_s:.0f} s")
            await asyncio.sleep(READY_POLL_S)
        worker.serving = True
        self._report_serving()
        if worker.hangup_pending:
            worker.hangup_pending = False
            _signal(process, signal.SIGHUP)

    async def _keep(self, worker: Worker) -> None:
        while not self._stopping:
            assert worker.process is not None
            code = await worker.process.wait()
            ran_s = time.monotonic() - worker.started_at
            worker.serving = False
            if worker.pid is not None:
                self._hooks.exited(worker.pid)
            if self._stopping:
                return
            self._report_serving()
            worker.delay_s = restart_delay(worker.delay_s, ran_s)
            worker.restarts += 1
            log.warning(
                "worker %d (pid %s) exited with status %s after %.1f s; restarting it on "
                "%s in %.1f s (restart %d)",
                worker.index,
                worker.pid,
                code,
                ran_s,
                worker.address,
                worker.delay_s,
                worker.restarts,
            )
            self._hooks.restarted()
            await asyncio.sleep(worker.delay_s)
            if self._stopping:
                return
            await self._spawn(worker)
            if self._stopping:  # stop() began while it was being started: not seen there
                assert worker.process is not None
                _signal(worker.process, signal.SIGTERM)
                await worker.process.wait()
                return
            try:
                await self._wait_serving(worker, READY_TIMEOUT_S)
            except WorkerStartError as exc:
                log.warning("%s", exc)
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()
                continue
            log.info(
                "worker %d serving again (pid %d) %.1f s after it was restarted",
                worker.index,
                worker.pid,
                time.monotonic() - worker.started_at,
            )

    def _report_serving(self) -> None:
        self._hooks.serving(sum(w.serving for w in self.workers))


def catches_sighup(status: str) -> bool:
    """Whether a process's ``/proc/PID/status`` text lists SIGHUP among the signals it
    catches (``SigCgt``, a hexadecimal mask whose bit N-1 is signal N)."""
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGHUP - 1) & 1)
    return False


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text(encoding="ascii", errors="replace")
    except OSError:  # gone: the caller sees its exit status
        return ""


def _signal(process: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(sig)
