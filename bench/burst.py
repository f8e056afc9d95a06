"""Memory under a burst of large batches, and what every client got.

``python -m bench.burst`` starts the fake Dynamo upstream (tests/fake_upstream.py) and
``extproc run`` in front of it (default policy unless ``--config``), sends
``--concurrency`` simultaneous requests of ``--inputs`` short inputs with
``dimensions`` (the rewrite path: the upstream answers base64, the gateway cuts and
re-normalises), samples the RSS of the ext_proc process and of Envoy every 50 ms, and
prints one line of figures: idle, peak and 5 s after the burst, plus the answers by
status. Every request must get a 200 or a 503 envelope with Retry-After; anything else
is counted as ``lost``. Loopback only; every wait is bounded.
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
from pathlib import Path

import orjson

from bench.procfs import rss_mb
from tests.conftest import QWEN_MODEL, SHIPPED_QWEN_POLICY, qwen_tokenizer_dir
from tests.fake_upstream import FakeUpstream
from tests.harness import Gateway, http, metric_value, start_gateway

SAMPLE_EVERY_S = 0.05
SHAPES = ("standalone", "single-filter")
ENVOY_DIR = Path(__file__).resolve().parents[1] / "envoy"
SETTLE_S = 5.0


@dataclass(frozen=True)
class BurstResult:
    idle_mb: tuple[float, float]  # ext_proc, Envoy before the burst
    peak_mb: tuple[float, float]
    after_mb: tuple[float, float]  # SETTLE_S after the last answer
    answers: Counter[str]  # "200", "503-overloaded", ..., "lost"
    seconds: float
    rejected_metric: float

    def line(self) -> str:
        (ei, vi), (ep, vp), (ea, va) = self.idle_mb, self.peak_mb, self.after_mb
        answers = ", ".join(f"{k}: {v}" for k, v in sorted(self.answers.items()))
        return (
            f"ext_proc RSS idle {ei:.0f} MB, peak {ep:.0f} MB, {SETTLE_S:.0f} s after "
            f"{ea:.0f} MB ({ea / ei:.2f}x idle); Envoy idle {vi:.0f} MB, peak {vp:.0f} MB, "
            f"after {va:.0f} MB; answers in {self.seconds:.1f} s: {answers}; "
            f"extproc_admission_rejected_total {self.rejected_metric:.0f}"
        )


def classify(status: int, headers: dict[str, str], body: bytes) -> str:
    if status == 200:
        return "200"
    try:
        error = orjson.loads(body)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return "lost"
    label = f"{status}-{error.get('code')}"
    if status == 503 and ("retry-after" not in headers or not error.get("message")):
        return label + "-unclean"
    return label


def request_body(inputs: int, dimensions: int, input_bytes: int) -> bytes:
    """``inputs`` distinct English documents of about ``input_bytes`` each; with
    ``dimensions`` (0: none, the answer passes through untouched)."""
    text = "The quick brown fox jumps over the lazy dog while the cat sleeps. "
    filler = (text * (input_bytes // len(text) + 1))[: max(input_bytes - 24, 0)]
    doc: dict[str, object] = {
        "model": QWEN_MODEL,
        "input": [f"document number {i} {filler}" for i in range(inputs)],
    }
    if dimensions:
        doc["dimensions"] = dimensions
    return orjson.dumps(doc)


def burst(gateway: Gateway, *, concurrency: int, body: bytes) -> BurstResult:
    ext_pid = gateway.process.pid
    match = re.search(r"envoy pid (\d+)", gateway.ready_line)
    envoy_pid = int(match.group(1)) if match else 0
    # Warm up: tokenizer and first allocations are part of "idle".
    gateway.embeddings({"model": QWEN_MODEL, "input": "x"})
    time.sleep(1.0)
    idle = (rss_mb(ext_pid), rss_mb(envoy_pid))
    peak = list(idle)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mb(ext_pid))
            peak[1] = max(peak[1], rss_mb(envoy_pid))
            time.sleep(SAMPLE_EVERY_S)

    def one(_: int) -> str:
        try:
            reply = gateway.embeddings(body, timeout=120)
        except OSError:
            return "lost"
        return classify(reply.status, reply.headers, reply.body)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        answers = Counter(pool.map(one, range(concurrency)))
    seconds = time.monotonic() - started
    time.sleep(SETTLE_S)
    stop.set()
    sampler.join(5)
    after = (rss_mb(ext_pid), rss_mb(envoy_pid))
    metrics = http("GET", f"{gateway.metrics_url}/metrics").body.decode()
    return BurstResult(
        idle,
        (peak[0], peak[1]),
        after,
        answers,
        seconds,
        metric_value(metrics, "extproc_admission_rejected_total"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=40)
    parser.add_argument("--inputs", type=int, default=2048)
    parser.add_argument("--dimensions", type=int, default=256, help="0: no dimensions")
    parser.add_argument("--input-bytes", type=int, default=36, help="size of each input")
    parser.add_argument("--rounds", type=int, default=1)
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
        )
        try:
            body = request_body(args.inputs, args.dimensions, args.input_bytes)
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
