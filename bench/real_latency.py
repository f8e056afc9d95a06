"""Latency through the gateway versus direct, on the real upstreams of this CPU:
``python -m bench.real_latency``.

For plain vLLM and for Dynamo (frontend + vLLM worker), each serving all-MiniLM-L6-v2
(`scripts/setup-real-upstream.sh` prepares them; minutes the first time), one at a
time: `extproc run` with the shipped MiniLM policy in front, then the procedure, on
both paths alternately (direct, gateway) for ``--repetitions`` (3): ``--sequential``
(30) batch-8 requests one after the other, then ``--concurrent`` (40) at concurrency
4. Prints, per upstream, the medians of p50, p99 and documents/s, and the gateway's
ratio to direct; exit 1 if any request was not a 200. Loopback only; everything it
started is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from testing_support.gateway import Gateway, start_gateway
from testing_support.http import Reply, http
from testing_support.qwen import REPO
from testing_support.real_upstream import (
    SERVED_MODEL,
    RealEnv,
    Stack,
    real_env,
    start_dynamo,
    start_vllm,
)

POLICY = REPO / "extproc" / "policies" / "all-minilm-l6-v2.yaml"
CORPUS = REPO / "extproc" / "data" / "corpus.jsonl"
FIGURES = ("seq_p50", "seq_p99", "c4_p50", "c4_p99", "c4_docs_per_s")


def batches() -> list[list[str]]:
    """The corpus's English documents, eight to a batch."""
    docs = [json.loads(line) for line in CORPUS.read_text().splitlines()]
    texts = [d["text"] for d in docs if d["kind"] == "document"]
    return [texts[i : i + 8] for i in range(0, len(texts), 8)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def run_once(
    send: Callable[[list[str]], Reply], sequential: int, concurrent: int
) -> tuple[dict[str, float], list[int]]:
    """One repetition: its figures and every status."""
    work = batches()

    def timed(i: int) -> tuple[float, int]:
        started = time.perf_counter()
        status = send(work[i % len(work)]).status
        return (time.perf_counter() - started) * 1000, status

    one_by_one = [timed(i) for i in range(sequential)]
    started = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        four = list(pool.map(timed, range(concurrent)))
    wall = time.perf_counter() - started
    seq = [ms for ms, _ in one_by_one]
    con = [ms for ms, _ in four]
    figures = {
        "seq_p50": percentile(seq, 0.5),
        "seq_p99": percentile(seq, 0.99),
        "c4_p50": percentile(con, 0.5),
        "c4_p99": percentile(con, 0.99),
        "c4_docs_per_s": concurrent * 8 / wall,
    }
    return figures, [status for _, status in one_by_one + four]


@contextmanager
def running(stack: Stack) -> Iterator[Stack]:
    try:
        yield stack
    finally:
        stack.stop()


def measure(stack: Stack, gateway: Gateway, args: argparse.Namespace) -> tuple[str, bool]:
    def direct(texts: list[str]) -> Reply:
        body = {"model": SERVED_MODEL, "input": texts}
        return http("POST", f"{stack.url}/v1/embeddings", body)

    def through(texts: list[str]) -> Reply:
        return gateway.embeddings({"model": SERVED_MODEL, "input": texts})

    runs: dict[str, list[dict[str, float]]] = {"direct": [], "gateway": []}
    ok = True
    for _ in range(args.repetitions):  # alternate, so drift hits both alike
        for side, send in (("direct", direct), ("gateway", through)):
            figures, statuses = run_once(send, args.sequential, args.concurrent)
            runs[side].append(figures)
            ok = ok and all(status == 200 for status in statuses)
    med = {
        side: {k: statistics.median(r[k] for r in reps) for k in FIGURES}
        for side, reps in runs.items()
    }
    d, g = med["direct"], med["gateway"]
    lines = [
        f"{stack.kind}: ms and documents/s, median of {args.repetitions}",
        "| path | seq p50 | seq p99 | c4 p50 | c4 p99 | c4 docs/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in (("direct", d), ("gateway", g)):
        lines.append(
            f"| {name} | {m['seq_p50']:.1f} | {m['seq_p99']:.1f} | {m['c4_p50']:.1f} | "
            f"{m['c4_p99']:.1f} | {m['c4_docs_per_s']:.0f} |"
        )
    lines.append(
        "| gateway / direct | " + " | ".join(f"{g[k] / d[k]:.2f}x" for k in FIGURES) + " |"
    )
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--sequential", type=int, default=30)
    parser.add_argument("--concurrent", type=int, default=40)
    parser.add_argument("--upstreams", default="vllm,dynamo", help="of vllm,dynamo")
    args = parser.parse_args(argv)
    env: RealEnv = real_env()
    starters = {"vllm": start_vllm, "dynamo": start_dynamo}
    all_ok = True
    with tempfile.TemporaryDirectory(prefix="real-latency-") as folder:
        for kind in args.upstreams.split(","):
            work = Path(folder) / kind
            with running(starters[kind](env, work)) as stack:
                (work / "gateway").mkdir()
                gateway = start_gateway(
                    stack.url,
                    work / "gateway",
                    config=POLICY,
                    tokenizer_overrides=f"{SERVED_MODEL}={env.model_dir}",
                )
                try:
                    table, ok = measure(stack, gateway, args)
                finally:
                    gateway.process.stop_cleanly()
            print(table, flush=True)
            all_ok = all_ok and ok
    if not all_ok:
        print("error: a request did not get a 200", file=sys.stderr)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
