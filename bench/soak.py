"""Soak: the shipped gateway under a steady mixed load for minutes.

    bench/setup.sh                                  # once: wrk, nginx + njs (idempotent)
    .venv/bin/python -m bench.soak                  # 10 min: c=16, 20 windows of 30 s
    .venv/bin/python -m bench.soak --duration 40 --window 10   # the CI smoke's shape

What runs (all on 127.0.0.1, all stopped by PID at the end, on Ctrl-C and on SIGTERM):
the benchmark's instant nginx+njs upstream (``upstream.py``), and the gateway as
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
  ``--rss-limit-mb`` (300 MB, the gateway's memory budget; 0 disables this check).
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
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench import upstream as upstream_mod
from bench import wrk
from bench.environment import result_head, utc_stamp
from bench.gateway import Gateway, start_gateway
from bench.mix import DEFAULT_MIX, INPUTS, KINDS, parse_mix, schedule, write_bodies
from bench.options import add_upstream, command_parser
from bench.processes import sigterm_interrupts
from bench.procfs import loadavg
from bench.render import fmt, markdown_table, text_table
from bench.sampler import Sampler
from bench.soak_verdict import verdict, verdict_lines
from bench.windows import REQUEST_TIMEOUT_S, check_requests, measure_window
from bench.workloads import HERE
from extproc.service.net import free_port
from testing_support.processes import memory_kb

# -- the command line ---------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = command_parser(
        "python -m bench.soak",
        __doc__,
        "Exit status: 0 pass, 1 fail (or cut short), 2 wrk missing.",
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
        help="ext_proc VmRSS ceiling (300; 0 = no ceiling check)",
    )
    parser.add_argument(
        "--p99-ratio",
        type=float,
        default=1.5,
        help="allowed median p99 of the last third of the windows / that of the first third "
        "after the warm-up (1.5)",
    )
    add_upstream(parser)
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


def settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
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
    }


# -- the soak -------------------------------------------------------------------------


@dataclass
class Soak:
    """One soak's state: what it started and what it measured."""

    args: argparse.Namespace
    workdir: Path
    started: float
    result: dict[str, Any]
    upstream: upstream_mod.UpstreamProcess | None = None
    gateway: Gateway | None = None
    sampler: Sampler | None = None
    windows: list[dict[str, Any]] = field(default_factory=list)
    checks: dict[str, Any] = field(default_factory=dict)
    alive: bool = False

    def start(self) -> tuple[dict[str, Path], Path]:
        """The upstream and the gateway; the request bodies and wrk's schedule."""
        bodies, schedule_path = write_bodies(self.workdir, self.args.mix_weights)
        upstream_dir = self.workdir / "upstream"
        upstream_mod.write_bodies(upstream_dir, sizes=(INPUTS,))
        self.upstream = upstream_mod.start(
            upstream_dir, free_port(), self.args.upstream, die_with_parent=True
        )
        self.result["versions"]["upstream"] = self.upstream.kind
        self.gateway = start_gateway(self.workdir, self.upstream.port)
        assert self.gateway.envoy is not None
        pids = {"extproc": self.gateway.run.process.pid, "envoy": self.gateway.envoy_pid}
        self.result["pids"] = pids
        self.result["extproc_rss_mb_after_start"] = (
            memory_kb(pids["extproc"]).get("VmRSS", 0) / 1024
        )
        print(
            f"soak: upstream {self.upstream.kind} :{self.upstream.port}; gateway "
            f"{self.gateway.url} (extproc run pid {pids['extproc']}, envoy pid {pids['envoy']}, "
            f"admin :{self.gateway.envoy.admin_port}), ready in "
            f"{time.monotonic() - self.started:.1f} s",
            flush=True,
        )
        return bodies, schedule_path

    def load(self, schedule_path: Path) -> None:
        """The windows, one after the other, RSS sampled throughout."""
        assert self.gateway is not None and self.upstream is not None
        args = self.args
        self.sampler = Sampler(self.result["pids"], args.sample_interval, time.monotonic())
        with self.sampler:
            for index in range(1, args.windows + 1):
                if time.monotonic() - self.started > args.max_runtime:
                    print(f"soak: --max-runtime {args.max_runtime:.0f} s reached", flush=True)
                    break
                window = measure_window(
                    index,
                    self.gateway,
                    self.upstream,
                    self.sampler,
                    schedule_path,
                    connections=args.connections,
                    seconds=args.window_s,
                )
                self.windows.append(window)
                print_window(window, args.windows)

    def run(self) -> None:
        bodies, schedule_path = self.start()
        assert self.gateway is not None
        self.checks["before"] = check_requests(self.gateway, bodies, "before")
        weights = self.args.mix_weights
        self.result["ext_proc_msgs_per_req_expected"] = sum(
            w * self.checks["before"][k]["ext_proc_msgs"] for k, w in weights.items()
        ) / sum(weights.values())
        self.load(schedule_path)
        self.checks["after"] = check_requests(self.gateway, bodies, "after")
        self.alive = self.gateway.alive()
        self.result["complete"] = len(self.windows) == self.args.windows

    def stop(self) -> None:
        wrk.stop_children()  # interrupted mid-window: that window's wrk is still our child
        if self.gateway is not None:
            memory = memory_kb(self.gateway.run.process.pid)
            self.result["extproc_rss_mb_end"] = memory.get("VmRSS", 0) / 1024
            self.result["extproc_vmhwm_mb"] = memory.get("VmHWM", 0) / 1024
            self.gateway.stop()
        if self.upstream is not None:
            self.upstream.stop()

    def judge(self) -> None:
        result, samples = self.result, self.sampler.samples if self.sampler else []
        checks_ok = bool(self.checks) and all(
            c["ok"] for when in ("before", "after") for c in self.checks.get(when, {}).values()
        )
        result["runtime_s"] = round(time.monotonic() - self.started, 1)
        result["loadavg_at_end"] = loadavg()
        result["check_requests"] = self.checks
        result["verdict"] = verdict(
            windows=self.windows,
            samples=samples,
            checks_ok=checks_ok,
            alive=self.alive,
            args=self.args,
            complete=result["complete"],
        )
        result["windows"] = self.windows
        result["samples"] = samples


# -- the report -----------------------------------------------------------------------


COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("window", lambda w: f"{w['window']}{' (warm-up)' if w['window'] == 1 else ''}"),
    ("requests", lambda w: f"{w['requests']:,}"),
    ("req/s", lambda w: f"{w['req_per_s']:,.0f}"),
    ("p50 ms", lambda w: fmt(w["p50_ms"])),
    ("p99 ms", lambda w: fmt(w["p99_ms"])),
    ("max ms", lambda w: fmt(w["max_ms"])),
    ("errors", lambda w: str(w["errors"])),
    ("msgs/req", lambda w: fmt(w["ext_proc_msgs_per_req"])),
    ("ext_proc RSS MB", lambda w: fmt(w["extproc_rss_mb_end"], 1)),
    ("(max)", lambda w: fmt(w["extproc_rss_mb_max"], 1)),
    ("Envoy RSS MB", lambda w: fmt(w["envoy_rss_mb_end"], 1)),
    ("ext_proc cores", lambda w: fmt(w["cores"]["extproc"])),
    ("Envoy cores", lambda w: fmt(w["cores"]["envoy"])),
    ("others' cores", lambda w: fmt(w["cores"]["others"])),
]


def window_rows(windows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    return [name for name, _ in COLUMNS], [[get(w) for _, get in COLUMNS] for w in windows]


def print_window(window: dict[str, Any], windows: int) -> None:
    print(
        f"  window {window['window']:>3}/{windows} {window['req_per_s']:7.0f} req/s  "
        f"p50 {window['p50_ms']:6.2f}  p99 {window['p99_ms']:6.2f} ms  "
        f"errors {window['errors']}  ext_proc RSS "
        f"{fmt(window['extproc_rss_mb_end'], 1)} MB  Envoy "
        f"{fmt(window['envoy_rss_mb_end'], 1)} MB  others' cores "
        f"{window['cores']['others']:.2f}",
        flush=True,
    )


def check_failures(result: dict[str, Any]) -> list[str]:
    return [
        f"  check request {key} ({when}) FAILED: {c}"
        for when, kinds in result["check_requests"].items()
        for key, c in kinds.items()
        if not c["ok"]
    ]


def summary_line(result: dict[str, Any]) -> str:
    """Run-wide figures: ext_proc memory, requests, messages, load, runtime."""
    windows = result["windows"]
    msgs = [w["ext_proc_msgs_per_req"] for w in windows]
    return (
        f"ext_proc VmRSS after start {fmt(result.get('extproc_rss_mb_after_start'), 1)} MB, "
        f"at the end {fmt(result.get('extproc_rss_mb_end'), 1)} MB, peak (VmHWM) "
        f"{fmt(result.get('extproc_vmhwm_mb'), 1)} MB; {len(result['samples'])} RSS samples; "
        f"{sum(w['requests'] for w in windows):,} requests; ext_proc messages per request "
        f"{fmt(statistics.median(msgs) if msgs else None)}"
        f" (the mix's check requests: {fmt(result.get('ext_proc_msgs_per_req_expected'))})"
        f"; load average {' '.join(result['machine']['loadavg_at_start'])} at start, "
        f"{' '.join(result['loadavg_at_end'])} at the end; runtime {result['runtime_s']:.0f} s"
    )


def write_report(soak: Soak, out_dir: Path) -> None:
    head, rows = window_rows(soak.windows)
    verdict_text = "\n".join(verdict_lines(soak.result) + check_failures(soak.result))
    summary = summary_line(soak.result)
    print("\n" + text_table(head, rows, left={0}) + "\n\n" + verdict_text + "\n" + summary)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "soak.json").write_bytes(orjson.dumps(soak.result, option=orjson.OPT_INDENT_2))
    (out_dir / "soak.md").write_text(
        markdown_table(head, rows) + "\n\n" + verdict_text + "\n\n" + summary + "\n"
    )
    if soak.gateway is not None:
        with contextlib.suppress(OSError):
            shutil.copy(soak.gateway.run.log_path, out_dir / "gateway.log")
    print(f"results: {out_dir}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wrk.require()
    started_wall, started = time.time(), time.monotonic()
    out_dir: Path = args.out or HERE / "results" / f"soak-{utc_stamp(started_wall)}"
    result = {**result_head(started_wall), "settings": settings(args), "complete": False}
    soak = Soak(args, Path(tempfile.mkdtemp(prefix="extproc-soak-")), started, result)
    print(
        f"soak: {args.windows} windows x {args.window_s} s at c={args.connections}, mix "
        + ", ".join(f"{k} {w}" for k, w in args.mix_weights.items())
        + f"; stops by {args.max_runtime:.0f} s; {os.cpu_count()} cores, load "
        + " ".join(result["machine"]["loadavg_at_start"]),
        flush=True,
    )
    try:
        with sigterm_interrupts():
            soak.run()
    except KeyboardInterrupt as exc:
        print(f"soak: interrupted ({exc}); reporting what was measured", file=sys.stderr)
    except Exception as exc:
        print(f"soak: failed: {exc!r}", file=sys.stderr)
        result["failure"] = repr(exc)
    finally:
        soak.stop()
    soak.judge()
    write_report(soak, out_dir)
    shutil.rmtree(soak.workdir, ignore_errors=True)
    return 0 if result["verdict"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
