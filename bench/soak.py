"""Soak: the shipped gateway under a steady mixed load for minutes (issue 6, issue 7's RSS).

    bench/setup.sh                                  # once: wrk, nginx + njs (idempotent)
    .venv/bin/python bench/soak.py                  # 10 min: c=16, 20 windows of 30 s
    .venv/bin/python bench/soak.py --duration 40 --window 10   # the CI smoke's shape

What runs (all on 127.0.0.1, all stopped by PID at the end, on Ctrl-C and on SIGTERM):
the instant nginx+njs upstream of ``bench/run.py`` (``upstream.py``), and the gateway as
users run it: ``extproc run`` (the ext_proc server in that process, plus the Envoy it
starts on ``envoy/standalone.yaml``) with the shipped Qwen3 policy and its real
tokenizer. wrk drives it at ``--connections`` (16) with a mix of requests
(``--mix``, rotated by ``wrk_mix.lua``): by default 70% the seed's batch of 8
documents (no rewrite), 10% the full rewrite (``input_type: "query"`` +
``dimensions: 256``), 10% ``encoding_format: "base64"``, 10% ``"float"``.

Windows. The soak is ``--duration`` seconds cut into consecutive wrk runs of
``--window`` seconds (default 20 x 30 s). One wrk per window, rather than one wrk for
the whole soak, because wrk reports latency percentiles only at its end and a
``response()`` hook to time requests in Lua would copy every 100 KB body into Lua:
separate runs give exact per-window p50/p99 from wrk's own histogram at no client cost.
The price is a reconnect of the 16 connections every window and up to 16 requests
abandoned in flight at each window's end (Envoy still answers them; wrk does not count
them). Window 1 is the warm-up: its errors count, its latencies and RSS are not used as
a reference.

Sampled every ``--sample-interval`` seconds (SIGALRM in this one thread, so the wrk
runs are still started from a single-threaded process) and at the end of every window:
``VmRSS`` of the ext_proc process and of Envoy (``/proc/PID/status``). Per window: wrk's
requests, req/s, p50/p99/max, non-2xx and socket errors; Envoy's counters (2xx/4xx/5xx,
ext_proc messages per request: with the default mix ~1.2, which shows that the rewrite
requests really went through the response path); CPU (cores) of ext_proc, Envoy, the
upstream and wrk, and of everything else on the machine ("others' cores", from
``/proc/stat``). Before the first window and after the last, one request of each kind is
checked by hand (status 200, 8 vectors, 1,024 or 256 dimensions).

Verdict (exit status 0 if every check passes, else 1):

- errors: zero wrk non-2xx/3xx and socket errors (connect, read, write, timeout) in every
  window, warm-up included; zero Envoy 5xx; every check request right; ext_proc and
  Envoy are the same processes at the end as at the start.
- RSS flat: ``max(ext_proc VmRSS over every sample of the last third of the windows)``
  is under ``(1 + --rss-growth) x`` the VmRSS sampled at the end of window 1 (10%).
  The baseline is taken after a window of full load, not after start, because the
  first requests build the working set (gRPC and HTTP buffers for 16 concurrent
  streams, allocator arenas, lazy state), and the RSS right after start is not steady
  either (the tokenizer load settles: here it fell from ~175 to ~115 MB in the first
  seconds). Neither is a leak. The maximum over the last third (rather than the last
  sample) catches a leak that keeps growing without depending on where one sample falls.
- RSS ceiling: the largest ext_proc VmRSS sampled in the whole soak is at most
  ``--rss-limit-mb`` (300: issue 7's target; 0 disables this check).
- p99 stable: the median of the p99s of the last third of the windows is at most
  ``--p99-ratio`` (1.5) x the median of the p99s of the first third after the warm-up
  (20 windows: windows 15-20 vs 2-7; 4 windows: window 4 vs 2). A degradation that
  comes from the gateway (a leak, a growing queue) is persistent and moves every late
  window; a neighbour's burst on a shared machine moves one or two, which the median
  ignores.

A third is ``max(1, (windows - 1) // 3)`` windows; at least 3 windows are needed.

Output: the table on stdout; ``soak.json`` (settings, machine, versions, checks, every
window and every sample), ``soak.md`` (the table) and ``gateway.log`` in ``--out``
(default ``bench/results/soak-<UTC timestamp>/``, git-ignored).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as harness  # noqa: E402  (bench/run.py: processes, wrk, /proc readers)
import upstream as upstream_mod  # noqa: E402

INPUTS = upstream_mod.SMALL_BATCH  # the seed's batch of 8 documents
REQUEST_TIMEOUT_S = 10  # wrk's per-request timeout: an answer later than this is an error
READY_TIMEOUT_S = harness.READY_TIMEOUT_S
READY_LINE = re.compile(
    r"envoy pid (?P<envoy_pid>\d+), ext_proc [\d.]+:(?P<extproc_port>\d+), "
    r"admin [\d.]+:(?P<admin_port>\d+)"
)


# -- the mix --------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    key: str
    description: str
    fields: dict[str, Any]  # added to the seed request
    dimensions: int  # what the client must get back


KINDS = {
    k.key: k
    for k in (
        Kind("seed", "8 documents (~84 tokens), no rewrite", {}, 1024),
        Kind(
            "rewrite",
            "input_type query + dimensions 256: instruction, cut to 256-d, renormalised",
            {"input_type": "query", "dimensions": harness.REWRITE_DIMENSIONS},
            harness.REWRITE_DIMENSIONS,
        ),
        Kind(
            "base64",
            "encoding_format base64 (legacy profile: float arrays back)",
            {"encoding_format": "base64"},
            1024,
        ),
        Kind("float", "encoding_format float", {"encoding_format": "float"}, 1024),
        Kind("query", "input_type query: instruction only", {"input_type": "query"}, 1024),
    )
}
DEFAULT_MIX = "seed=70,rewrite=10,base64=10,float=10"


def parse_mix(text: str) -> dict[str, int]:
    mix: dict[str, int] = {}
    for item in text.split(","):
        key, sep, weight = item.strip().partition("=")
        if not sep or key not in KINDS or not weight.isdigit():
            raise ValueError(f"bad --mix item {item!r}: KIND=WEIGHT, KIND in {list(KINDS)}")
        mix[key] = mix.get(key, 0) + int(weight)
    mix = {k: w for k, w in mix.items() if w > 0}
    if not mix:
        raise ValueError("--mix has no kind with a weight > 0")
    return mix


def schedule(mix: dict[str, int]) -> list[str]:
    """The mix as one cycle of kinds, spread evenly (smooth weighted round-robin)."""
    divisor = math.gcd(*mix.values())
    weights = {k: w // divisor for k, w in mix.items()}
    total = sum(weights.values())
    current = dict.fromkeys(weights, 0)
    out = []
    for _ in range(total):
        for key, weight in weights.items():
            current[key] += weight
        best = max(current, key=lambda k: current[k])
        current[best] -= total
        out.append(best)
    return out


def write_bodies(directory: Path, mix: dict[str, int]) -> tuple[dict[str, Path], Path]:
    """One body file per kind and the schedule file wrk_mix.lua reads."""
    seed = orjson.loads(harness.request_body("plain", INPUTS))
    paths = {}
    for key in mix:
        paths[key] = directory / f"request-{key}.json"
        paths[key].write_bytes(orjson.dumps({**seed, **KINDS[key].fields}))
    cycle = schedule(mix)
    schedule_path = directory / "schedule.txt"
    schedule_path.write_text("".join(f"{paths[k]}\n" for k in cycle))
    return paths, schedule_path


# -- the gateway under test ------------------------------------------------------


def _start_time(pid: int) -> str:
    """Field 22 of /proc/PID/stat: with the PID, names one process for its whole life."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text[text.rindex(")") + 2 :].split()[19]


@dataclass
class Gateway:
    """``extproc run`` (ext_proc in this process) and the Envoy it started."""

    process: subprocess.Popen[bytes]
    log_path: Path
    port: int
    envoy: harness.Envoy | None = None  # its .process is `extproc run`, Envoy's parent
    envoy_pid: int = 0
    identity: dict[str, str] = field(default_factory=dict)  # pid -> start time

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        """The same two processes as at start, both still running."""
        return bool(self.identity) and all(
            _start_time(int(pid)) == started for pid, started in self.identity.items()
        )

    def stop(self) -> None:
        # `extproc run` stops its Envoy first, then drains ext_proc (--grace).
        harness.stop_process(self.process, timeout=30)
        pid = self.envoy_pid
        started = self.identity.get(str(pid))
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if not pid or not started or _start_time(pid) != started:
                return  # gone (or the PID now names another process: leave it)
            os.kill(pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and _start_time(pid) == started:
                time.sleep(0.1)


def start_gateway(workdir: Path, upstream_port: int) -> Gateway:
    port = harness.free_port()
    log_path = workdir / "gateway.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "extproc",
                "run",
                "--upstream",
                f"http://127.0.0.1:{upstream_port}",
                "--listen",
                f"127.0.0.1:{port}",
                "--config",
                str(harness.POLICY),
                "--tokenizer",
                f"{harness.MODEL}={harness.qwen_tokenizer_dir()}",
                "--grace",
                "5",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=harness._die_with_parent,  # noqa: PLW1509 (no threads here)
            cwd=harness.REPO,
        )
    gateway = Gateway(process, log_path, port)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        match = READY_LINE.search(log_path.read_text(errors="replace"))
        if match:
            gateway.envoy_pid = int(match["envoy_pid"])
            gateway.envoy = harness.Envoy(
                "gateway", process, port, int(match["admin_port"]), log_path
            )
            for pid in (process.pid, gateway.envoy_pid):
                gateway.identity[str(pid)] = _start_time(pid)
            return gateway
        if process.poll() is not None:
            break
        time.sleep(0.1)
    gateway.stop()
    raise RuntimeError(
        f"`extproc run` not ready ({process.returncode}):\n"
        + log_path.read_text(errors="replace")[-3000:]
    )


def stop_wrk() -> None:
    """SIGTERM, by PID, any wrk that is still a child of this process."""
    me = os.getpid()
    with contextlib.suppress(OSError):
        children = Path(f"/proc/{me}/task/{me}/children").read_text().split()
        for pid in map(int, children):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "wrk":
                    os.kill(pid, signal.SIGTERM)
                    os.waitpid(pid, 0)


# -- sampling --------------------------------------------------------------------


class Sampler:
    """VmRSS of the watched processes every ``interval`` s (SIGALRM) and on demand."""

    def __init__(self, pids: dict[str, int], interval: float, t0: float) -> None:
        self.pids = pids
        self.interval = interval
        self.t0 = t0
        self.window: int | None = None
        self.samples: list[dict[str, Any]] = []

    def sample(self, at: str = "timer") -> dict[str, Any]:
        row: dict[str, Any] = {
            "t_s": round(time.monotonic() - self.t0, 2),
            "window": self.window,
            "at": at,
        }
        for name, pid in self.pids.items():
            rss = harness.memory_kb(pid).get("VmRSS")
            row[f"{name}_rss_mb"] = round(rss / 1024, 1) if rss else None
        self.samples.append(row)
        return row

    def _on_alarm(self, _signum: int, _frame: Any) -> None:
        self.sample()

    def __enter__(self) -> Sampler:
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.setitimer(signal.ITIMER_REAL, self.interval, self.interval)
        return self

    def __exit__(self, *_: object) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


# -- one window -------------------------------------------------------------------


def measure_window(
    index: int,
    gateway: Gateway,
    upstream: upstream_mod.UpstreamProcess,
    sampler: Sampler,
    schedule_path: Path,
    *,
    connections: int,
    seconds: int,
) -> dict[str, Any]:
    assert gateway.envoy is not None
    envoy = gateway.envoy
    watched = {
        "extproc": [gateway.process.pid],
        "envoy": [gateway.envoy_pid],
        "upstream": upstream.pids(),
    }
    stats_before = envoy.stats()
    cpu_before = {k: sum(harness.cpu_ticks(p) for p in v) for k, v in watched.items()}
    self_before = harness.cpu_ticks(os.getpid())
    busy_before, total_before = harness.machine_busy_ticks()
    harness._children_ticks_of_wrk()  # reset: only this window's wrk below
    sampler.window = index
    summary, _, _ = harness.run_wrk(
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
    stats_after = envoy.stats()
    cpu_after = {k: sum(harness.cpu_ticks(p) for p in v) for k, v in watched.items()}
    cpu_after["wrk"] = harness._children_ticks_of_wrk()
    cpu_before["wrk"] = 0
    ours = sum(cpu_after[k] - cpu_before[k] for k in cpu_after)
    ours += harness.cpu_ticks(os.getpid()) - self_before
    busy_after, total_after = harness.machine_busy_ticks()
    cores = os.cpu_count() or 1
    elapsed = max(total_after - total_before, 1)

    delta = {k: stats_after.get(k, 0) - stats_before.get(k, 0) for k in stats_after}
    counted = delta.get("downstream_rq_total", 0)
    errors = summary["errors"]
    socket_errors = errors["connect"] + errors["read"] + errors["write"] + errors["timeout"]
    seconds_measured = summary["duration_us"] / 1e6
    in_window = [s for s in sampler.samples if s["window"] == index]
    extproc_rss = [s["extproc_rss_mb"] for s in in_window if s["extproc_rss_mb"]]
    envoy_rss = [s["envoy_rss_mb"] for s in in_window if s["envoy_rss_mb"]]
    return {
        "window": index,
        "phase": "warm-up" if index == 1 else "steady",
        "seconds": round(seconds_measured, 3),
        "requests": summary["requests"],
        "req_per_s": summary["requests"] / seconds_measured if seconds_measured else 0.0,
        "p50_ms": summary["latency_us"]["p50"] / 1000,
        "p90_ms": summary["latency_us"]["p90"] / 1000,
        "p99_ms": summary["latency_us"]["p99"] / 1000,
        "max_ms": summary["latency_us"]["max"] / 1000,
        "non_2xx_3xx": errors["status"],
        "socket_errors": socket_errors,
        "errors": errors["status"] + socket_errors,
        "wrk_errors": errors,
        "envoy_requests": counted,
        "envoy_codes": {
            k.removeprefix("downstream_rq_"): v
            for k, v in delta.items()
            if re.fullmatch(r"downstream_rq_[1-5]xx", k) and v
        },
        "ext_proc_msgs_per_req": delta.get("ext_proc.stream_msgs_sent", 0) / max(counted, 1),
        "ext_proc_stats": {
            k.removeprefix("ext_proc."): v
            for k, v in delta.items()
            if k.startswith("ext_proc.") and v
        },
        "extproc_rss_mb_end": end_sample["extproc_rss_mb"],
        "extproc_rss_mb_max": max(extproc_rss) if extproc_rss else None,
        "envoy_rss_mb_end": end_sample["envoy_rss_mb"],
        "envoy_rss_mb_max": max(envoy_rss) if envoy_rss else None,
        "rss_samples": len(in_window),
        "cores": {
            **{
                k: (cpu_after[k] - cpu_before[k]) / elapsed * cores
                for k in ("extproc", "envoy", "upstream", "wrk")
            },
            "others": max(busy_after - busy_before - ours, 0) / elapsed * cores,
        },
    }


def check_requests(
    gateway: Gateway, bodies: dict[str, Path], when: str
) -> dict[str, dict[str, Any]]:
    """One request of each kind, by hand: 200, 8 vectors, the right size; its messages."""
    assert gateway.envoy is not None
    out = {}
    for key, path in bodies.items():
        sent = "ext_proc.stream_msgs_sent"
        before = gateway.envoy.stats().get(sent, 0)
        result = harness.probe(gateway.url, path, INPUTS, KINDS[key].dimensions)
        result["ext_proc_msgs"] = gateway.envoy.stats().get(sent, 0) - before
        result["when"] = when
        out[key] = result
    return out


# -- verdict ----------------------------------------------------------------------


def verdict(
    *,
    windows: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    checks_ok: bool,
    alive: bool,
    args: argparse.Namespace,
    complete: bool,
) -> dict[str, Any]:
    checks: list[dict[str, Any]] = []
    wrk_errors = sum(w["errors"] for w in windows)
    envoy_5xx = sum(w["envoy_codes"].get("5xx", 0) for w in windows)
    checks.append(
        {
            "name": "errors",
            "pass": complete and wrk_errors == 0 and envoy_5xx == 0 and checks_ok and alive,
            "value": wrk_errors,
            "limit": "== 0",
            "detail": f"wrk non-2xx + socket errors {wrk_errors}, Envoy 5xx {envoy_5xx}, "
            f"check requests {'ok' if checks_ok else 'FAILED'}, "
            + (
                f"processes {'the same, alive' if alive else 'DIED or restarted'}"
                if complete
                else "soak cut short"
            ),
        }
    )

    n = len(windows)
    # The last third of the windows after the warm-up, and the first third (>= 1 each).
    third = max(1, (n - 1) // 3)
    early = list(range(2, 2 + third))
    late = list(range(n - third + 1, n + 1))
    baseline = windows[0]["extproc_rss_mb_end"] if windows else None
    late_rss = [s["extproc_rss_mb"] for s in samples if s["window"] in late and s["extproc_rss_mb"]]
    late_max = max(late_rss) if late_rss else None
    growth = late_max / baseline - 1 if baseline and late_max and n >= 3 else None
    checks.append(
        {
            "name": "rss_flat",
            "pass": growth is not None and growth < args.rss_growth,
            "value": growth,
            "limit": f"< {args.rss_growth:.0%}",
            "baseline_mb": baseline,
            "late_max_mb": late_max,
            "late_windows": late,
            "detail": f"ext_proc VmRSS max over windows {_span(late)} "
            f"{_fmt(late_max, 1)} MB vs {_fmt(baseline, 1)} MB at the end of window 1",
        }
    )

    all_rss = [s["extproc_rss_mb"] for s in samples if s["extproc_rss_mb"]]
    peak = max(all_rss) if all_rss else None
    if args.rss_limit_mb > 0:
        checks.append(
            {
                "name": "rss_ceiling",
                "pass": peak is not None and peak <= args.rss_limit_mb,
                "value": peak,
                "limit": f"<= {args.rss_limit_mb:g} MB",
                "detail": f"largest ext_proc VmRSS sampled {_fmt(peak, 1)} MB",
            }
        )

    by_index = {w["window"]: w for w in windows}
    first = statistics.median(by_index[i]["p99_ms"] for i in early) if n >= 3 else None
    last = statistics.median(by_index[i]["p99_ms"] for i in late) if n >= 3 else None
    ratio = last / first if first and last is not None else None
    checks.append(
        {
            "name": "p99_stable",
            "pass": ratio is not None and ratio <= args.p99_ratio,
            "value": ratio,
            "limit": f"<= {args.p99_ratio:g}x",
            "first_ms": first,
            "last_ms": last,
            "early_windows": early,
            "late_windows": late,
            "detail": f"median p99 of windows {_span(late)} {_fmt(last)} ms vs windows "
            f"{_span(early)} {_fmt(first)} ms",
        }
    )
    slope = None
    steady = [s for s in samples if s["window"] and s["window"] > 1 and s["extproc_rss_mb"]]
    if len(steady) >= 3 and len({s["t_s"] for s in steady}) >= 2:
        slope = statistics.linear_regression(
            [s["t_s"] / 60 for s in steady], [s["extproc_rss_mb"] for s in steady]
        ).slope
    return {
        "pass": all(c["pass"] for c in checks),
        "checks": checks,
        "extproc_rss_slope_mb_per_min": slope,
    }


# -- report -----------------------------------------------------------------------


def _fmt(value: Any, digits: int = 2) -> str:
    return harness._fmt(value, digits)


def _span(indices: list[int]) -> str:
    return f"{indices[0]}-{indices[-1]}" if len(indices) > 1 else str(indices[0])


COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("window", lambda w: f"{w['window']}{' (warm-up)' if w['window'] == 1 else ''}"),
    ("requests", lambda w: f"{w['requests']:,}"),
    ("req/s", lambda w: f"{w['req_per_s']:,.0f}"),
    ("p50 ms", lambda w: _fmt(w["p50_ms"])),
    ("p99 ms", lambda w: _fmt(w["p99_ms"])),
    ("max ms", lambda w: _fmt(w["max_ms"])),
    ("errors", lambda w: str(w["errors"])),
    ("msgs/req", lambda w: _fmt(w["ext_proc_msgs_per_req"])),
    ("ext_proc RSS MB", lambda w: _fmt(w["extproc_rss_mb_end"], 1)),
    ("(max)", lambda w: _fmt(w["extproc_rss_mb_max"], 1)),
    ("Envoy RSS MB", lambda w: _fmt(w["envoy_rss_mb_end"], 1)),
    ("ext_proc cores", lambda w: _fmt(w["cores"]["extproc"])),
    ("Envoy cores", lambda w: _fmt(w["cores"]["envoy"])),
    ("others' cores", lambda w: _fmt(w["cores"]["others"])),
]


def text_table(windows: list[dict[str, Any]]) -> str:
    rows = [[name for name, _ in COLUMNS]] + [[get(w) for _, get in COLUMNS] for w in windows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = []
    for number, row in enumerate(rows):
        lines.append(
            " | ".join(
                cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
                for i, cell in enumerate(row)
            )
        )
        if number == 0:
            lines.append("-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(windows: list[dict[str, Any]]) -> str:
    lines = [
        "| " + " | ".join(name for name, _ in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(get(w) for _, get in COLUMNS) + " |" for w in windows]
    return "\n".join(lines)


def verdict_lines(result: dict[str, Any]) -> list[str]:
    v = result["verdict"]
    lines = [f"verdict: {'PASS' if v['pass'] else 'FAIL'}"]
    for check in v["checks"]:
        value = check["value"]
        if check["name"] == "rss_flat" and value is not None:
            shown = f"{value:+.1%}"
        elif check["name"] == "p99_stable" and value is not None:
            shown = f"{value:.2f}x"
        else:
            shown = _fmt(value, 1)
        lines.append(
            f"  {'ok  ' if check['pass'] else 'FAIL'} {check['name']:<12} {shown} "
            f"(limit {check['limit']}): {check['detail']}"
        )
    slope = v.get("extproc_rss_slope_mb_per_min")
    if slope is not None:
        lines.append(f"  ext_proc RSS trend after warm-up: {slope:+.2f} MB/min (least squares)")
    return lines


# -- the run ----------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit status: 0 pass, 1 fail (or cut short), 2 wrk missing.",
    )
    parser.add_argument("--duration", type=int, default=600, help="seconds of load (600)")
    parser.add_argument("--window", type=int, default=30, help="seconds per window (30)")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections (16)")
    parser.add_argument(
        "--mix",
        default=DEFAULT_MIX,
        help=f"KIND=WEIGHT,... with KIND in {', '.join(KINDS)} (default {DEFAULT_MIX})",
    )
    parser.add_argument(
        "--sample-interval", type=float, default=5.0, help="seconds between RSS samples (5)"
    )
    parser.add_argument(
        "--rss-growth", type=float, default=0.10, help="allowed ext_proc RSS growth (0.10)"
    )
    parser.add_argument(
        "--rss-limit-mb",
        type=float,
        default=300.0,
        help="ext_proc VmRSS ceiling, issue 7's target (300; 0 = no ceiling check)",
    )
    parser.add_argument(
        "--p99-ratio",
        type=float,
        default=1.5,
        help="allowed median p99 of the last third of the windows / that of the first third "
        "after the warm-up (1.5)",
    )
    parser.add_argument(
        "--upstream",
        choices=["auto", "nginx", "node"],
        default="auto",
        help="instant upstream implementation (auto: nginx+njs if installed)",
    )
    parser.add_argument("--out", type=Path, help="output directory")
    parser.add_argument(
        "--max-runtime",
        type=float,
        help="stop (and report what was measured, as a failure) after this many seconds "
        "(default: 1.25 x --duration + 180)",
    )
    args = parser.parse_args(argv)
    try:
        args.mix_weights = parse_mix(args.mix)
    except ValueError as exc:
        parser.error(str(exc))
    if args.window < 1 or args.duration < 3 * args.window:
        parser.error("--window >= 1 and --duration >= 3 x --window (warm-up + 2 windows)")
    if args.connections < 1 or args.sample_interval <= 0:
        parser.error("--connections >= 1 and --sample-interval > 0")
    # Whole windows: wrk takes whole seconds.
    args.windows = max(3, round(args.duration / args.window))
    args.window_s = max(1, round(args.duration / args.windows))
    if args.max_runtime is None:
        args.max_runtime = 1.25 * args.duration + 180
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is not installed: run bench/setup.sh", file=sys.stderr)
        return 2
    started_wall = time.time()
    started = time.monotonic()
    stamp = dt.datetime.fromtimestamp(started_wall, dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir: Path = args.out or HERE / "results" / f"soak-{stamp}"
    signal.signal(signal.SIGTERM, harness._on_signal)  # -> KeyboardInterrupt -> cleanup

    workdir = Path(tempfile.mkdtemp(prefix="extproc-soak-"))
    result: dict[str, Any] = {
        "schema": 1,
        "started_utc": dt.datetime.fromtimestamp(started_wall, dt.UTC).isoformat(),
        "machine": harness.machine(),
        "versions": harness.versions(),
        "settings": {
            "duration_s": args.windows * args.window_s,
            "windows": args.windows,
            "window_s": args.window_s,
            "connections": args.connections,
            "request_timeout_s": REQUEST_TIMEOUT_S,
            "mix": args.mix_weights,
            "kinds": {k: vars(KINDS[k]) for k in args.mix_weights},
            "schedule": schedule(args.mix_weights),
            "sample_interval_s": args.sample_interval,
            "rss_growth_limit": args.rss_growth,
            "rss_limit_mb": args.rss_limit_mb,
            "p99_ratio_limit": args.p99_ratio,
            "gateway": "extproc run (envoy/standalone.yaml, shipped Qwen3 policy, "
            "Qwen3 tokenizer), Envoy default concurrency",
        },
        "complete": False,
    }
    print(
        f"soak: {args.windows} windows x {args.window_s} s at c={args.connections}, mix "
        + ", ".join(f"{k} {w}" for k, w in args.mix_weights.items())
        + f"; stops by {args.max_runtime:.0f} s; {os.cpu_count()} cores, load "
        + " ".join(result["machine"]["loadavg_at_start"]),
        flush=True,
    )
    upstream: upstream_mod.UpstreamProcess | None = None
    gateway: Gateway | None = None
    windows: list[dict[str, Any]] = []
    sampler: Sampler | None = None
    checks: dict[str, Any] = {}
    alive = False
    exit_code = 1
    try:
        bodies, schedule_path = write_bodies(workdir, args.mix_weights)
        upstream_dir = workdir / "upstream"
        upstream_mod.write_bodies(upstream_dir, sizes=(INPUTS,))
        upstream = upstream_mod.start(
            upstream_dir, harness.free_port(), args.upstream, preexec=harness._die_with_parent
        )
        result["versions"]["upstream"] = upstream.kind
        gateway = start_gateway(workdir, upstream.port)
        assert gateway.envoy is not None
        pids = {"extproc": gateway.process.pid, "envoy": gateway.envoy_pid}
        result["pids"] = pids
        result["extproc_rss_mb_after_start"] = (
            harness.memory_kb(pids["extproc"]).get("VmRSS", 0) / 1024
        )
        print(
            f"soak: upstream {upstream.kind} :{upstream.port}; gateway {gateway.url} "
            f"(extproc run pid {pids['extproc']}, envoy pid {pids['envoy']}, admin "
            f":{gateway.envoy.admin_port}), ready in {time.monotonic() - started:.1f} s",
            flush=True,
        )
        checks["before"] = check_requests(gateway, bodies, "before")
        weights = args.mix_weights
        result["ext_proc_msgs_per_req_expected"] = sum(
            w * checks["before"][k]["ext_proc_msgs"] for k, w in weights.items()
        ) / sum(weights.values())
        sampler = Sampler(pids, args.sample_interval, time.monotonic())
        with sampler:
            for index in range(1, args.windows + 1):
                if time.monotonic() - started > args.max_runtime:
                    print(f"soak: --max-runtime {args.max_runtime:.0f} s reached", flush=True)
                    break
                window = measure_window(
                    index,
                    gateway,
                    upstream,
                    sampler,
                    schedule_path,
                    connections=args.connections,
                    seconds=args.window_s,
                )
                windows.append(window)
                print(
                    f"  window {index:>3}/{args.windows} {window['req_per_s']:7.0f} req/s  "
                    f"p50 {window['p50_ms']:6.2f}  p99 {window['p99_ms']:6.2f} ms  "
                    f"errors {window['errors']}  ext_proc RSS "
                    f"{_fmt(window['extproc_rss_mb_end'], 1)} MB  Envoy "
                    f"{_fmt(window['envoy_rss_mb_end'], 1)} MB  others' cores "
                    f"{window['cores']['others']:.2f}",
                    flush=True,
                )
        checks["after"] = check_requests(gateway, bodies, "after")
        alive = gateway.alive()
        result["complete"] = len(windows) == args.windows
    except KeyboardInterrupt as exc:
        print(f"soak: interrupted ({exc}); reporting what was measured", file=sys.stderr)
    except Exception as exc:
        print(f"soak: failed: {exc!r}", file=sys.stderr)
        result["failure"] = repr(exc)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        stop_wrk()  # interrupted mid-window: run_wrk's wrk is still our child
        if gateway is not None:
            memory = harness.memory_kb(gateway.process.pid)
            result["extproc_rss_mb_end"] = memory.get("VmRSS", 0) / 1024
            result["extproc_vmhwm_mb"] = memory.get("VmHWM", 0) / 1024
            gateway.stop()
        if upstream is not None:
            upstream.stop()

    samples = sampler.samples if sampler else []
    checks_ok = bool(checks) and all(
        c["ok"] for when in ("before", "after") for c in checks.get(when, {}).values()
    )
    result["runtime_s"] = round(time.monotonic() - started, 1)
    result["loadavg_at_end"] = Path("/proc/loadavg").read_text().split()[:3]
    result["check_requests"] = checks
    result["verdict"] = verdict(
        windows=windows,
        samples=samples,
        checks_ok=checks_ok,
        alive=alive,
        args=args,
        complete=result["complete"],
    )
    result["windows"] = windows
    result["samples"] = samples
    if result["verdict"]["pass"]:
        exit_code = 0

    report = text_table(windows)
    lines = verdict_lines(result)
    for when, kinds in checks.items():
        for key, c in kinds.items():
            if not c["ok"]:
                lines.append(f"  check request {key} ({when}) FAILED: {c}")
    msgs = [w["ext_proc_msgs_per_req"] for w in windows]
    msgs_median = statistics.median(msgs) if msgs else None
    summary = (
        f"ext_proc VmRSS after start {_fmt(result.get('extproc_rss_mb_after_start'), 1)} MB, "
        f"at the end {_fmt(result.get('extproc_rss_mb_end'), 1)} MB, peak (VmHWM) "
        f"{_fmt(result.get('extproc_vmhwm_mb'), 1)} MB; {len(samples)} RSS samples; "
        f"{sum(w['requests'] for w in windows):,} requests; ext_proc messages per request "
        f"{_fmt(msgs_median)}"
        f" (the mix's check requests: {_fmt(result.get('ext_proc_msgs_per_req_expected'))})"
        f"; load average "
        f"{' '.join(result['machine']['loadavg_at_start'])} at start, "
        f"{' '.join(result['loadavg_at_end'])} at the end; runtime {result['runtime_s']:.0f} s"
    )
    print("\n" + report + "\n\n" + "\n".join(lines) + "\n" + summary, flush=True)

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "soak.json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    (out_dir / "soak.md").write_text(
        markdown_table(windows) + "\n\n" + "\n".join(lines) + "\n\n" + summary + "\n"
    )
    with contextlib.suppress(OSError):
        shutil.copy(workdir / "gateway.log", out_dir / "gateway.log")
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"results: {out_dir}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
