"""The gateway as users run it, under soak: ``extproc run`` (ext_proc in that process)
and the Envoy it starts, each named by PID and start time for its whole life."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.envoy_admin import Envoy
from bench.processes import READY_TIMEOUT_S
from bench.procfs import start_time
from bench.workloads import POLICY, REPO
from testing_support.gateway import Gateway as RunGateway
from testing_support.gateway import start_gateway as start_run
from testing_support.qwen import qwen_tokenizers


@dataclass
class Gateway:
    """``extproc run`` (ext_proc in this process) and the Envoy it started."""

    run: RunGateway
    envoy: Envoy  # its .process is `extproc run`, Envoy's parent
    identity: dict[str, str] = field(default_factory=dict)  # pid -> start time

    @property
    def url(self) -> str:
        return self.run.url

    @property
    def envoy_pid(self) -> int:
        return self.run.envoy_pid

    def alive(self) -> bool:
        """The same two processes as at start, both still running."""
        return bool(self.identity) and all(
            start_time(int(pid)) == started for pid, started in self.identity.items()
        )

    def stop(self) -> None:
        # `extproc run` stops its Envoy first, then drains ext_proc (--grace).
        self.run.stop(timeout=30)
        pid = self.envoy_pid
        started = self.identity.get(str(pid))
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if not started or start_time(pid) != started:
                return  # gone (or the PID now names another process: leave it)
            os.kill(pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and start_time(pid) == started:
                time.sleep(0.1)


def start_gateway(workdir: Path, upstream_port: int) -> Gateway:
    """`extproc run` in front of the upstream; returns once its ready line is logged."""
    # One ext_proc process, in `extproc run`'s own: the soak judges that process's RSS.
    run = start_run(
        f"http://127.0.0.1:{upstream_port}",
        workdir,
        config=POLICY,
        tokenizer_overrides=qwen_tokenizers(),
        workers=1,
        cwd=REPO,
        die_with_parent=True,
        timeout=READY_TIMEOUT_S,
    )
    admin_port = int(run.admin_url.rsplit(":", 1)[1])
    gateway = Gateway(run, Envoy("gateway", run.process, run.port, admin_port))
    for pid in (run.process.pid, run.envoy_pid):
        gateway.identity[str(pid)] = start_time(pid)
    return gateway
