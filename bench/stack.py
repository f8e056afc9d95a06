"""The processes the benchmark measures, started once per run, each on its own so that
/proc gives its CPU time and RSS: an instant upstream, `extproc serve`, the do-nothing
floor processor (which also serves the library floor), and one Envoy per configuration
(B, N, S, T, F, Z, U, L); for the native cases also a second `extproc serve` with the
native policy and Envoys S-n, F-n; for the 2-worker cases two more `extproc serve`
(two more with the native policy for S-n2) behind Envoy S2 (S-n2), whose ext_proc
cluster lists both as `extproc run --workers 2` renders it."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

from bench import upstream as upstream_mod
from bench.envoy_admin import Envoy
from bench.envoy_configs import NativeTarget, envoy_configs
from bench.processes import READY_TIMEOUT_S, serve_spec, start_server
from bench.workloads import POLICY, REPO, native_policy
from testing_support.envoy import EnvoySpec, start_envoy
from testing_support.processes import Process, free_port, port_open
from testing_support.serve import Serve


class Stack:
    """Everything this run started, stopped in reverse order, by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.upstream: upstream_mod.UpstreamProcess | None = None
        self.extproc: Serve | None = None
        self.extproc_port = 0
        self.floor: Process | None = None
        self.floor_port = 0
        self.library_port = 0  # the floor process's library-work listener (case L)
        # The ext_proc server with the native policy (S-n), when a native case runs.
        self.extproc_native: Serve | None = None
        self.native: NativeTarget | None = None
        # The 2-worker cases' `extproc serve` processes (and their ports), by policy.
        self.workers: list[Serve] = []
        self.worker_ports: list[int] = []
        self.native_workers: list[Serve] = []
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
            die_with_parent=True,
            native_port=free_port() if native else 0,
        )
        self.extproc_port = free_port()
        self.extproc = start_server(self.workdir, self.extproc_port, serve_spec(), "extproc")
        servers = [self.extproc]
        if workers > 1:
            self.worker_ports = [free_port() for _ in range(workers)]
            for i, port in enumerate(self.worker_ports, start=1):
                name = f"extproc-worker{i}"
                self.workers.append(start_server(self.workdir, port, serve_spec(), name))
            servers += self.workers
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
            native_spec = serve_spec(policy)
            self.extproc_native = start_server(
                self.workdir, self.native.extproc_port, native_spec, "extproc-native"
            )
            servers.append(self.extproc_native)
            for i, port in enumerate(self.native_worker_ports, start=1):
                name = f"extproc-native-worker{i}"
                self.native_workers.append(start_server(self.workdir, port, native_spec, name))
            servers += self.native_workers
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
        self.floor = Process.start(
            argv, self.workdir / "floor.log", cwd=REPO, name="floor processor", die_with_parent=True
        )
        self._start_envoys()
        for server in servers:
            server.wait_ready(READY_TIMEOUT_S)
        for port in floor_ports:
            self.floor.wait_until(partial(port_open, port), READY_TIMEOUT_S, f"floor on :{port}")
        for envoy in self.envoys.values():
            envoy.wait_ready(READY_TIMEOUT_S)

    def _start_envoys(self) -> None:
        assert self.upstream is not None
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
            # Envoy's default concurrency, as `extproc run` starts it.
            spec = EnvoySpec.of(config, f"envoy-{name}", concurrency=None)
            started = start_envoy(spec, self.workdir, wait=False, die_with_parent=True)
            self.envoys[name] = Envoy(name, started.process, port, admin_port)

    def servers(self) -> list[Serve]:
        """Every `extproc serve` of the run."""
        started = [self.extproc, self.extproc_native, *self.workers, *self.native_workers]
        return [server for server in started if server is not None]

    def pids(self) -> list[int]:
        pids = list(self.upstream.pids()) if self.upstream else []
        pids += [server.process.pid for server in self.servers()]
        if self.floor:
            pids.append(self.floor.pid)
        pids += [e.process.pid for e in self.envoys.values()]
        return pids

    def stop(self) -> None:
        for envoy in self.envoys.values():
            envoy.process.stop(15)
        for server in self.servers():
            server.stop(15)
        if self.floor is not None:
            self.floor.stop(15)
        if self.upstream is not None:
            self.upstream.stop()
