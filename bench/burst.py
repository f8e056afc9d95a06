"""Memory under a burst of large batches, and what every client got.

``python -m bench.burst`` starts the fake Dynamo upstream (testing_support/fake_upstream.py) and
``extproc run`` in front of it (default policy unless ``--config``; ``--workers``, by
default its own: the usable CPUs), sends ``--concurrency`` simultaneous requests of
``--inputs`` short inputs with ``dimensions`` (the rewrite path: the upstream answers
base64, the gateway cuts and re-normalises), samples the RSS of the ext_proc processes
(`extproc run` and its workers, together) and of Envoy every 50 ms, and
prints one line of figures: idle, peak and 5 s after the burst, plus the answers by
status, and Envoy's counters of its own answers and resets over the burst. Every
request must get a 200 or a 503 envelope with Retry-After (or its proper 4xx);
anything else is counted as ``lost`` (with the status or the client's error).
Loopback only; every wait is bounded.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path

import orjson

from extproc.runtime.cpu_count import cpus_available
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import Gateway, start_gateway
from testing_support.http import http, metric_value, post, request_body
from testing_support.processes import rss_mb, tree_memory_mb
from testing_support.qwen import QWEN_MODEL, SHIPPED_QWEN_POLICY, qwen_tokenizer_dir

SAMPLE_EVERY_S = 0.05
SHAPES = ("standalone", "single-filter")
ENVOY_DIR = Path(__file__).resolve().parents[1] / "envoy"
SETTLE_S = 5.0
# Envoy's side of the answers (summed over filters and listeners): its own 503s at
# capacity, processor failures, and streams or connections it reset or closed.
ENVOY_COUNTERS = (
    "rq_overload_local_reply",
    "streams_failed",
    "message_timeouts",
    "downstream_rq_rx_reset",
    "downstream_rq_tx_reset",
    "downstream_cx_destroy_local_active_rq",
)


@dataclass(frozen=True)
class BurstResult:
    idle_mb: tuple[float, float]  # ext_proc, Envoy before the burst
    peak_mb: tuple[float, float]
    after_mb: tuple[float, float]  # SETTLE_S after the last answer
    answers: Counter[str]  # "200", "503-overloaded", ..., "lost-<why>"
    seconds: float
    rejected_metric: float
    envoy_counters: dict[str, int]  # ENVOY_COUNTERS, counted over the burst

    def line(self) -> str:
        (ei, vi), (ep, vp), (ea, va) = self.idle_mb, self.peak_mb, self.after_mb
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(self.answers.items()))
        return (
            f"ext_proc RSS (all its processes) idle {ei:.0f} MB, peak {ep:.0f} MB, "
            f"{SETTLE_S:.0f} s after {ea:.0f} MB ({ea / ei:.2f}x idle); "
            f"Envoy idle {vi:.0f} MB, peak {vp:.0f} MB, after {va:.0f} MB; "
            f"answers in {self.seconds:.1f} s: {answers}; "
            f"extproc_admission_rejected_total {self.rejected_metric:.0f}; Envoy "
            + (", ".join(f"{k} {v}" for k, v in self.envoy_counters.items() if v) or "-")
        )


def classify(status: int, headers: dict[str, str], body: bytes) -> str:
    if status == 200:
        return "200"
    try:
        error = orjson.loads(body)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return f"lost-{status}"
    label = f"{status}-{error.get('code')}"
    if status == 503 and ("retry-after" not in headers or not error.get("message")):
        return label + "-unclean"
    if "or restarting" in str(error.get("message")):
        # Envoy's own (local_reply_config): its overload manager, or the processor failed.
        return label + "-by-envoy"
    return label


def envoy_counters(admin_url: str) -> dict[str, int]:
    text = http("GET", f"{admin_url}/stats").body.decode()
    totals = dict.fromkeys(ENVOY_COUNTERS, 0)
    for name, value in re.findall(r"^(\S+): (\d+)$", text, re.MULTILINE):
        suffix = name.rsplit(".", 1)[-1]
        if suffix in totals:
            totals[suffix] += int(value)
    return totals


def tree_rss(ext_pid: int, envoy_pid: int) -> float:
    """RSS of every ext_proc process: `extproc run` and its workers, not Envoy."""
    return tree_memory_mb(ext_pid, leave_out=envoy_pid)[0]


def burst(gateway: Gateway, *, concurrency: int, body: bytes) -> BurstResult:
    ext_pid, envoy_pid, admin_url = gateway.process.pid, gateway.envoy_pid, gateway.admin_url
    # Warm up: tokenizer and first allocations are part of "idle".
    gateway.embeddings({"model": QWEN_MODEL, "input": "x"})
    time.sleep(1.0)
    idle = (tree_rss(ext_pid, envoy_pid), rss_mb(envoy_pid))
    counters_before = envoy_counters(admin_url)
    peak = list(idle)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], tree_rss(ext_pid, envoy_pid))
            peak[1] = max(peak[1], rss_mb(envoy_pid))
            time.sleep(SAMPLE_EVERY_S)

    def one(_: int) -> str:
        try:
            reply, cut = post(gateway.url, body, timeout=120)
        except (OSError, HTTPException) as error:  # no answer at all
            return f"lost-{type(error).__name__}"
        label = classify(reply.status, reply.headers, reply.body)
        return f"{label}-before-upload-end" if cut else label

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        answers = Counter(pool.map(one, range(concurrency)))
    seconds = time.monotonic() - started
    time.sleep(SETTLE_S)
    stop.set()
    sampler.join(5)
    after = (tree_rss(ext_pid, envoy_pid), rss_mb(envoy_pid))
    metrics = http("GET", f"{gateway.metrics_url}/metrics").body.decode()
    counters = envoy_counters(admin_url)
    return BurstResult(
        idle,
        (peak[0], peak[1]),
        after,
        answers,
        seconds,
        metric_value(metrics, "extproc_admission_rejected_total"),
        {k: counters[k] - counters_before[k] for k in ENVOY_COUNTERS},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=40)
    parser.add_argument("--inputs", type=int, default=2048)
    parser.add_argument("--dimensions", type=int, default=256, help="0: no dimensions")
    parser.add_argument("--input-bytes", type=int, default=36, help="size of each input")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--workers",
        type=int,
        default=cpus_available(),
        help="ext_proc workers (default: extproc run's, the usable CPUs)",
    )
    parser.add_argument("--config", type=Path, default=SHIPPED_QWEN_POLICY)
    parser.add_argument(
        "--envoy-template",
        choices=SHAPES,
        default="standalone",
        help="the Envoy shape `extproc run` renders (envoy/NAME.yaml)",
    )
    args = parser.parse_args()
    qwen_dir = qwen_tokenizer_dir()
    with (
        FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir) as upstream,
        tempfile.TemporaryDirectory(prefix="burst-") as logs,
    ):
        gateway = start_gateway(
            upstream.url,
            Path(logs),
            config=args.config,
            tokenizer_overrides=f"{QWEN_MODEL}={qwen_dir}",
            extra_args=["--envoy-template", str(ENVOY_DIR / f"{args.envoy_template}.yaml")],
            workers=args.workers,
        )
        try:
            body = request_body(args.inputs, args.dimensions, args.input_bytes)
            rss, pss = tree_memory_mb(gateway.process.pid, leave_out=gateway.envoy_pid)
            print(
                f"ext_proc at start, {args.workers} worker(s): RSS {rss:.0f} MB, PSS {pss:.0f} MB "
                "(`extproc run` and its workers)",
                flush=True,
            )
            print(
                f"{args.concurrency} concurrent requests of {len(body):,} bytes "
                f"through envoy/{args.envoy_template}.yaml",
                flush=True,
            )
            for _ in range(args.rounds):
                result = burst(gateway, concurrency=args.concurrency, body=body)
                print(result.line(), flush=True)
        finally:
            gateway.stop()


if __name__ == "__main__":
    main()
