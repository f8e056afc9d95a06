"""One cell: one case under one workload for one repetition, with its CPU and counters."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.envoy_admin import StatsDelta
from bench.procfs import CpuMeter, memory_kb_sum
from bench.stack import Stack
from bench.workloads import Case, Workload
from bench.wrk import capture_errors, run_wrk
from testing_support.processes import Process, memory_kb
from testing_support.serve import Serve

CAPTURE_S = 3.0


@dataclass
class CellRunner:
    stack: Stack
    bodies: dict[tuple[str, int], Path]
    cells: list[dict[str, Any]] = field(default_factory=list)
    captures: list[dict[str, Any]] = field(default_factory=list)
    captured: set[tuple[str, str]] = field(default_factory=set)

    def url(self, case: Case) -> str:
        if case.target == "upstream":
            assert self.stack.upstream is not None
            return f"http://127.0.0.1:{self.stack.upstream.port}"
        return self.stack.envoys[case.target].url

    def body(self, case: Case, workload: Workload) -> Path:
        return self.bodies[(case.request, workload.inputs)]

    def load(self, case: Case, workload: Workload, duration_s: float) -> None:
        """Unmeasured load (warm-up)."""
        run_wrk(
            self.url(case),
            self.body(case, workload),
            connections=workload.connections,
            duration_s=duration_s,
            timeout_s=workload.timeout_s,
        )

    def processor_pids(self, case: Case) -> list[int]:
        """The ext_proc processes that serve ``case`` (both workers of a 2-worker case)."""
        stack = self.stack
        processes: list[Process | Serve | None]
        if case.floor:
            processes = [stack.floor]
        elif case.workers > 1:
            processes = list(stack.native_workers if case.native else stack.workers)
        else:
            processes = [stack.extproc_native if case.native else stack.extproc]
        pids = [p.pid for p in processes if p is not None]
        assert pids, f"no ext_proc process for {case.key}"
        return pids

    def measure(
        self, case: Case, workload: Workload, duration_s: float, repetition: int
    ) -> dict[str, Any]:
        envoy = self.stack.envoys.get(case.target)
        assert self.stack.upstream is not None and self.stack.extproc is not None
        processors = self.processor_pids(case)
        groups = {"upstream": self.stack.upstream.pids(), "extproc": processors}
        if envoy:
            groups["envoy"] = [envoy.process.pid]
        stats_before = envoy.stats() if envoy else {}
        meter = CpuMeter(groups, ours=self.stack.pids())
        started = time.monotonic()
        run = run_wrk(
            self.url(case),
            self.body(case, workload),
            connections=workload.connections,
            duration_s=duration_s,
            timeout_s=workload.timeout_s,
        )
        if envoy:
            envoy.wait_idle(timeout=workload.timeout_s)
        wall = time.monotonic() - started
        cpu = meter.stop()
        delta = StatsDelta.between(stats_before, envoy.stats() if envoy else {})
        # Envoy also counts requests wrk abandoned at the end; their CPU was spent.
        served = delta.requests if envoy else run.requests
        cell = {
            "case": case.key,
            "workload": workload.key,
            "repetition": repetition,
            "wrk_pid": run.pid,
            "requests": run.requests,
            "requests_counted_by_envoy": served if envoy else None,
            "duration_s": round(run.seconds, 3),
            "req_per_s": run.req_per_s,
            "docs_per_s": run.req_per_s * workload.inputs,
            **run.latency_ms(),
            "mean_ms": run.summary["latency_us"]["mean"] / 1000,
            "bytes_read": run.summary["bytes"],
            "non_2xx_3xx": run.errors["status"],
            "socket_errors": run.socket_errors,
            "wrk_errors": run.errors,
            "envoy_codes": delta.response_codes(),
            "ext_proc_msgs_per_req": delta.msgs_per_request() if envoy else None,
            "ext_proc_stats": delta.ext_proc(),
            "cpu_ms_per_req": cpu.ms_per_request(served),
            "cpu_cores_busy": {
                "machine": cpu.cores(cpu.machine_busy),
                "this_run": cpu.cores(cpu.ours),
                "others": cpu.others_cores,
            },
            "wall_s": round(wall, 3),
            # A and B leave ext_proc idle: its memory says nothing about them. The
            # workers of a 2-worker case together.
            "extproc_memory_kb": memory_kb_sum(processors) if case.uses_extproc else None,
            "envoy_memory_kb": memory_kb(envoy.process.pid) if envoy else None,
        }
        self.cells.append(cell)
        key = (case.key, workload.key)
        if (run.errors["status"] or run.socket_errors) and key not in self.captured:
            self.captured.add(key)
            self.captures.append(self.capture(case, workload, min(duration_s, CAPTURE_S)))
        return cell

    def capture(self, case: Case, workload: Workload, duration_s: float) -> dict[str, Any]:
        """Re-run briefly with a response() hook: the exact statuses and bodies."""
        captured = capture_errors(
            self.url(case),
            self.body(case, workload),
            self.stack.workdir / f"capture-{case.key}-{workload.key}",
            connections=workload.connections,
            duration_s=duration_s,
            timeout_s=workload.timeout_s,
        )
        return {"case": case.key, "workload": workload.key, "duration_s": duration_s, **captured}
