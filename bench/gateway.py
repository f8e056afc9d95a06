"""The gateway as users run it, under soak: ``extproc run`` (ext_proc in that process)
and the Envoy it starts, each named by PID and start time for its whole life."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.envoy_admin import Envoy
from bench.processes import READY_TIMEOUT_S, extproc_command, spawn, stop_process
from bench.procfs import start_time
from extproc.service.net import free_port

READY_LINE = re.compile(
    r"envoy pid (?P<envoy_pid>\d+), ext_proc [\d.]+:(?P<extproc_port>\d+), "
    r"admin [\d.]+:(?P<admin_port>\d+)"
)


@dataclass
class Gateway:
    """``extproc run`` (ext_proc in this process) and the Envoy it started."""

    process: subprocess.Popen[bytes]
    log_path: Path
    port: int
    envoy: Envoy | None = None  # its .process is `extproc run`, Envoy's parent
    envoy_pid: int = 0
    identity: dict[str, str] = field(default_factory=dict)  # pid -> start time

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        """The same two processes as at start, both still running."""
        return bool(self.identity) and all(
            start_time(int(pid)) == started for pid, started in self.identity.items()
        )

    def stop(self) -> None:
        # `extproc run` stops its Envoy first, then drains ext_proc (--grace).
        stop_process(self.process, timeout=30)
        pid = self.envoy_pid
        started = self.identity.get(str(pid))
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if not pid or not started or start_time(pid) != started:
                return  # gone (or the PID now names another process: leave it)
            os.kill(pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and start_time(pid) == started:
                time.sleep(0.1)


def start_gateway(workdir: Path, upstream_port: int) -> Gateway:
    """`extproc run` in front of the upstream; returns once its ready line is logged."""
    port = free_port()
    log_path = workdir / "gateway.log"
    # One ext_proc process, in `extproc run`'s own: the soak judges that process's RSS.
    upstream = ("--upstream", f"http://127.0.0.1:{upstream_port}", "--workers", "1")
    process = spawn(extproc_command("run", port, 5, *upstream), log_path)
    gateway = Gateway(process, log_path, port)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        match = READY_LINE.search(log_path.read_text(errors="replace"))
        if match:
            gateway.envoy_pid = int(match["envoy_pid"])
            gateway.envoy = Envoy("gateway", process, port, int(match["admin_port"]), log_path)
            for pid in (process.pid, gateway.envoy_pid):
                gateway.identity[str(pid)] = start_time(pid)
            return gateway
        if process.poll() is not None:
            break
        time.sleep(0.1)
    gateway.stop()
    raise RuntimeError(
        f"`extproc run` not ready ({process.returncode}):\n"
        + log_path.read_text(errors="replace")[-3000:]
    )
