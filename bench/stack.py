"""The processes the benchmark measures, started once per run, each on its own so that
/proc gives its CPU time and RSS: an instant upstream, `extproc serve`, the do-nothing
floor processor (which also serves the library floor), and one Envoy per configuration
(B, N, S, T, F, Z, U, L); for the native cases also a second `extproc serve` with the
native policy and Envoys S-n, F-n; for the 2-worker cases two more `extproc serve`
(two more with the native policy for S-n2) behind Envoy S2 (S-n2), whose ext_proc
cluster lists both as `extproc run --workers 2` renders it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from bench import upstream as upstream_mod
from bench.envoy_admin import Envoy
from bench.envoy_configs import NativeTarget, envoy_configs
from bench.processes import (
    READY_TIMEOUT_S,
    die_with_parent,
    extproc_command,
    spawn,
    stop_process,
    wait_for_port,
)
from bench.workloads import POLICY, native_policy
from extproc.runtime.envoy_process import envoy_binary
from extproc.service.net import free_port


class Stack:
    """Everything this run started, stopped in reverse order, by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.upstream: upstream_mod.UpstreamProcess | None = None
        self.extproc: subprocess.Popen[bytes] | None = None
        self.extproc_port = 0
        self.floor: subprocess.Popen[bytes] | None = None
        self.floor_port = 0
        self.library_port = 0  # the floor process's library-work listener (case L)
        # The ext_proc server with the native policy (S-n), when a native case runs.
        self.extproc_native: subprocess.Popen[bytes] | None = None
        self.native: NativeTarget | None = None
        # The 2-worker cases' `extproc serve` processes (and their ports), by policy.
        self.workers: list[subprocess.Popen[bytes]] = []
        self.worker_ports: list[int] = []
        self.native_workers: list[subprocess.Popen[bytes]] = []
        self.native_worker_ports: list[int] = []
        self.envoys: dict[str, Envoy] = {}

    def start(
        self,
        upstream_kind: str,
        with_big_bodies: bool,
        native: bool = False,
        workers: int = 1,
        native_workers: bool = False,
    ) -> None:
        bodies = self.workdir / "upstream"
        small, big = upstream_mod.SMALL_BATCH, upstream_mod.BIG_BATCH
        upstream_mod.write_bodies(bodies, (small, big) if with_big_bodies else (small,))
        self.upstream = upstream_mod.start(
            bodies,
            free_port(),
            upstream_kind,
            preexec=die_with_parent,
            native_port=free_port() if native else 0,
        )
        self.extproc_port = free_port()
        self.extproc = spawn(
            extproc_command("serve", self.extproc_port, 2), self.workdir / "extproc.log"
        )
        servers = [(self.extproc_port, self.extproc, "extproc.log")]
        if workers > 1:
            self.worker_ports = [free_port() for _ in range(workers)]
            for i, port in enumerate(self.worker_ports, start=1):
                log_name = f"extproc-worker{i}.log"
                self.workers.append(
                    spawn(extproc_command("serve", port, 2), self.workdir / log_name)
                )
                servers.append((port, self.workers[-1], log_name))
        if native:
            policy = native_policy(self.workdir)
            if native_workers and workers > 1:
                self.native_worker_ports = [free_port() for _ in range(workers)]
            self.native = NativeTarget(
                self.upstream.native_port,
                free_port(),
                policy,
                floor_port=free_port(),
                worker_ports=tuple(self.native_worker_ports),
            )
            self.extproc_native = spawn(
                extproc_command("serve", self.native.extproc_port, 2, policy=policy),
                self.workdir / "extproc-native.log",
            )
            servers.append((self.native.extproc_port, self.extproc_native, "extproc-native.log"))
            for i, port in enumerate(self.native_worker_ports, start=1):
                log_name = f"extproc-native-worker{i}.log"
                self.native_workers.append(
                    spawn(extproc_command("serve", port, 2, policy=policy), self.workdir / log_name)
                )
                servers.append((port, self.native_workers[-1], log_name))
        self.floor_port = free_port()
        floor_ports = [self.floor_port]
        self.library_port = free_port()
        floor_ports.append(self.library_port)
        argv = [sys.executable, "-m", "bench.floor_processor", "--listen"]
        argv += [f"127.0.0.1:{self.floor_port}", "--listen-library"]
        argv.append(f"127.0.0.1:{self.library_port}")
        if self.native is not None:
            floor_ports.append(self.native.floor_port)
            argv += ["--listen-native", f"127.0.0.1:{self.native.floor_port}"]
        self.floor = spawn(argv, self.workdir / "floor.log")
        self._start_envoys()
        for port, process, log_name in servers:
            try:
                wait_for_port(port, process, READY_TIMEOUT_S, "extproc serve")
            except (RuntimeError, TimeoutError) as exc:
                text = (self.workdir / log_name).read_text(errors="replace")
                raise RuntimeError(f"{exc}\n{text}") from exc
        for port in floor_ports:
            wait_for_port(port, self.floor, READY_TIMEOUT_S, "floor processor")
        for envoy in self.envoys.values():
            envoy.wait_ready(READY_TIMEOUT_S)

    def _start_envoys(self) -> None:
        assert self.upstream is not None
        binary = envoy_binary()
        configs = envoy_configs(
            self.upstream.port,
            self.extproc_port,
            POLICY,
            self.floor_port,
            self.native,
            library_port=self.library_port,
            worker_ports=tuple(self.worker_ports),
        )
        for name, (config, port, admin_port) in configs.items():
            path = self.workdir / f"envoy-{name}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            log_path = self.workdir / f"envoy-{name}.log"
            argv = [binary, "-c", str(path), "--use-dynamic-base-id", "-l", "warning"]
            process = spawn(argv, log_path, cwd=None)
            self.envoys[name] = Envoy(name, process, port, admin_port, log_path)

    def pids(self) -> list[int]:
        pids = list(self.upstream.pids()) if self.upstream else []
        if self.extproc:
            pids.append(self.extproc.pid)
        if self.extproc_native:
            pids.append(self.extproc_native.pid)
        pids += [w.pid for w in (*self.workers, *self.native_workers)]
        if self.floor:
            pids.append(self.floor.pid)
        pids += [e.process.pid for e in self.envoys.values()]
        return pids

    def stop(self) -> None:
        for envoy in self.envoys.values():
            stop_process(envoy.process)
        if self.extproc is not None:
            stop_process(self.extproc)
        if self.extproc_native is not None:
            stop_process(self.extproc_native)
        for worker in (*self.workers, *self.native_workers):
            stop_process(worker)
        if self.floor is not None:
            stop_process(self.floor)
        if self.upstream is not None:
            self.upstream.stop()
