"""One soak window: a wrk run of the mix against the gateway, with its counters, CPU and
RSS; and the requests checked by hand before and after the load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.envoy_admin import StatsDelta
from bench.gateway import Gateway
from bench.mix import INPUTS, KINDS
from bench.probe import probe_through
from bench.procfs import CpuMeter
from bench.sampler import Sampler
from bench.upstream import UpstreamProcess
from bench.wrk import run_wrk

REQUEST_TIMEOUT_S = 10  # wrk's per-request timeout: an answer later than this is an error


def measure_window(
    index: int,
    gateway: Gateway,
    upstream: UpstreamProcess,
    sampler: Sampler,
    schedule_path: Path,
    *,
    connections: int,
    seconds: int,
) -> dict[str, Any]:
    assert gateway.envoy is not None
    envoy = gateway.envoy
    groups = {
        "extproc": [gateway.run.process.pid],
        "envoy": [gateway.envoy_pid],
        "upstream": upstream.pids(),
    }
    stats_before = envoy.stats()
    meter = CpuMeter(groups)
    sampler.window = index
    run = run_wrk(
        gateway.url,
        schedule_path,
        connections=connections,
        duration_s=seconds,
        timeout_s=REQUEST_TIMEOUT_S,
        script="wrk_mix.lua",
    )
    end_sample = sampler.sample("window_end")
    sampler.window = None
    envoy.wait_idle(timeout=REQUEST_TIMEOUT_S)
    delta = StatsDelta.between(stats_before, envoy.stats())
    cpu = meter.stop()
    extproc_rss = sampler.in_window(index, "extproc")
    envoy_rss = sampler.in_window(index, "envoy")
    return {
        "window": index,
        "phase": "warm-up" if index == 1 else "steady",
        "seconds": round(run.seconds, 3),
        "requests": run.requests,
        "req_per_s": run.req_per_s,
        **run.latency_ms(),
        "non_2xx_3xx": run.errors["status"],
        "socket_errors": run.socket_errors,
        "errors": run.errors["status"] + run.socket_errors,
        "wrk_errors": run.errors,
        "envoy_requests": delta.requests,
        "envoy_codes": delta.response_codes(),
        "ext_proc_msgs_per_req": delta.msgs_per_request(),
        "ext_proc_stats": delta.ext_proc(),
        "extproc_rss_mb_end": end_sample["extproc_rss_mb"],
        "extproc_rss_mb_max": max(extproc_rss) if extproc_rss else None,
        "envoy_rss_mb_end": end_sample["envoy_rss_mb"],
        "envoy_rss_mb_max": max(envoy_rss) if envoy_rss else None,
        "rss_samples": len([s for s in sampler.samples if s["window"] == index]),
        "cores": {
            **{name: cpu.cores(ticks) for name, ticks in cpu.groups.items()},
            "others": cpu.others_cores,
        },
    }


def check_requests(
    gateway: Gateway, bodies: dict[str, Path], when: str
) -> dict[str, dict[str, Any]]:
    """One request of each kind, by hand: 200, 8 vectors, the right size; its messages."""
    assert gateway.envoy is not None
    out = {}
    for key, path in bodies.items():
        result = probe_through(gateway.envoy, gateway.url, path, INPUTS, KINDS[key].dimensions)
        result["when"] = when
        out[key] = result
    return out
