"""The one way a test or a bench tool runs a child process: started from an argv (with
an environment and a working directory), its output in a log file, ready when a
predicate says so within a timeout, stopped by its own PID (SIGTERM, then SIGKILL),
and judged by its exit status and its log.

Every wait is bounded; a process that exits while it is waited for ends the wait at
once, with its log."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from extproc.service.net import free_port

__all__ = [
    "Process",
    "ProcessExitedError",
    "die_with_parent",
    "free_port",
    "log_file",
    "memory_kb",
    "port_open",
    "rss_mb",
    "wait_until",
]

_PR_SET_PDEATHSIG = 1


class ProcessExitedError(RuntimeError):
    """A process ended while it was waited for."""


def die_with_parent() -> None:
    """In the child, before exec (``preexec_fn``): SIGTERM when the process that started
    it dies. Only from a process with a single thread."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_pdeathsig = die_with_parent


@dataclass
class Process:
    """A child process, its output (stdout and stderr) in ``log_path``. ``group``: it
    leads a session of its own, so that it and whatever it forks are signalled
    together."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    group: bool = False
    stop_timeout: float = 20.0  # how long :meth:`stop` waits after SIGTERM by default

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        name: str | None = None,
        group: bool = False,
        die_with_parent: bool = False,
        stop_timeout: float = 20.0,
    ) -> Process:
        """Start ``argv`` (``env``: the whole environment, default this process's).
        ``die_with_parent``: it gets SIGTERM if this process dies (for tools run from a
        single thread: it runs code in the child before exec)."""
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=None if env is None else dict(env),
                cwd=cwd,
                start_new_session=group,
                preexec_fn=_pdeathsig if die_with_parent else None,  # noqa: PLW1509
            )
        return cls(name or Path(argv[0]).name, popen, log_path, group, stop_timeout)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """Its exit status, None while it runs."""
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self, since: int = 0) -> str:
        """Its log (``since``: from that offset, a :meth:`log_mark` taken before)."""
        with self.log_path.open("rb") as file:
            file.seek(since)
            return file.read().decode(errors="replace")

    def log_mark(self) -> int:
        """Where its log ends now."""
        return self.log_path.stat().st_size

    def log_tail(self, chars: int = 4000) -> str:
        return self.log()[-chars:]

    def line(self, prefix: str) -> str | None:
        """The first line of its log that starts with ``prefix``."""
        return next((x for x in self.log().splitlines() if x.startswith(prefix)), None)

    def wait_until(
        self, ready: Callable[[], bool], timeout: float, what: str = "", interval: float = 0.05
    ) -> float:
        """Until ``ready()`` (an OSError from it counts as not yet); the seconds it took."""
        return wait_until(ready, timeout, what or f"{self.name} ready", (self,), interval)

    def wait_line(self, prefix: str, timeout: float) -> str:
        """Until its log has a line that starts with ``prefix``; that line."""
        self.wait_until(lambda: self.line(prefix) is not None, timeout, f"{prefix!r} logged")
        line = self.line(prefix)
        assert line is not None
        return line

    def signal(self, sig: int) -> None:
        """``sig`` to it (to its whole group if it leads one), if it still runs."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                if self.group:
                    os.killpg(self.pid, sig)
                else:
                    self.popen.send_signal(sig)

    def stop(self, timeout: float | None = None) -> int:
        """SIGTERM (after SIGCONT: a stopped process would not act on it), SIGKILL if it
        still runs after ``timeout`` s (default: its ``stop_timeout``); its exit status.
        A group leader's group is killed after it, so that nothing it forked outlives it."""
        timeout = self.stop_timeout if timeout is None else timeout
        if self.alive():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait(10)
        if self.group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        return int(self.popen.returncode)

    def stop_cleanly(self, timeout: float | None = None) -> None:
        """Stop it: it must exit 0 and have logged no traceback."""
        code = self.stop(timeout)
        log = self.log()
        assert code == 0, f"{self.name} exited with {code}:\n{log[-8000:]}"
        assert "Traceback" not in log, log[-8000:]

    def rss_mb(self) -> float:
        return rss_mb(self.pid)


def wait_until(
    ready: Callable[[], bool],
    timeout: float,
    what: str,
    processes: Iterable[Process] = (),
    interval: float = 0.05,
) -> float:
    """Until ``ready()`` (an OSError from it counts as not yet), while each of
    ``processes`` runs; the seconds it took. ProcessExitedError if one of them ends first,
    TimeoutError after ``timeout`` s, either with their logs."""
    watched = list(processes)
    started = time.monotonic()
    deadline = started + timeout
    while True:
        try:
            if ready():
                return time.monotonic() - started
        except OSError:
            pass
        for process in watched:
            if not process.alive():
                raise ProcessExitedError(
                    f"{process.name} exited with {process.returncode} before {what}:\n"
                    + process.log_tail()
                )
        if time.monotonic() > deadline:
            logs = "".join(f"\n--- {p.name}\n{p.log_tail()}" for p in watched)
            raise TimeoutError(f"not {what} after {timeout:.0f} s{logs}")
        time.sleep(interval)


def log_file(folder: Path, stem: str) -> Path:
    """``folder/stem.log``, or ``stem-2.log``, ``stem-3.log``... if taken: a process
    started again keeps the log of the one before."""
    path, n = folder / f"{stem}.log", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.log"
    return path


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Something accepts connections on ``host:port``."""
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def memory_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process in kB (empty if it is gone)."""
    out = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def rss_mb(pid: int) -> float:
    return memory_kb(pid).get("VmRSS", 0) / 1024


def children(pid: int) -> list[int]:
    """The direct children of a process (empty if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def tree_memory_mb(pid: int, *, leave_out: int = 0) -> tuple[float, float]:
    """(RSS, PSS) in MB of a process and its children (an ext_proc launcher and its
    workers), leaving out ``leave_out`` (its Envoy). PSS shares each page among the
    processes that map it, so it adds up to what the tree really holds."""
    rss = pss = 0
    for member in [pid, *children(pid)]:
        if member == leave_out:
            continue
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{member}/smaps_rollup").read_text().splitlines():
                key, _, value = line.partition(":")
                if key == "Rss":
                    rss += int(value.split()[0])
                elif key == "Pss":
                    pss += int(value.split()[0])
    return rss / 1024, pss / 1024
