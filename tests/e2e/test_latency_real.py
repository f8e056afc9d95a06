"""The seed's latency procedure through the gateway versus direct, on the real
upstreams: 30 sequential batch-8 requests and 40 requests at concurrency 4,
median of 3 alternating repetitions. Prints the table (docs/upstreams.md);
asserts only that every request succeeded: absolute times on this CPU are only
indicative, and speed targets belong to the benchmark harness."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from testing_support.gateway import Gateway
from testing_support.http import Reply, http
from tests.real_upstream import SERVED_MODEL, Stack

REPO = Path(__file__).resolve().parents[2]
REPETITIONS = 3


def batches() -> list[list[str]]:
    docs = [
        json.loads(line)
        for line in (REPO / "extproc" / "data" / "corpus.jsonl").read_text().splitlines()
    ]
    texts = [d["text"] for d in docs if d["kind"] == "document"]
    return [texts[i : i + 8] for i in range(0, len(texts), 8)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def run_once(send: Callable[[list[str]], Reply]) -> dict[str, float]:
    work = batches()

    def timed(i: int) -> tuple[float, int]:
        started = time.perf_counter()
        status = send(work[i % len(work)]).status
        return time.perf_counter() - started, status

    sequential = [timed(i) for i in range(30)]
    started = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        concurrent = list(pool.map(timed, range(40)))
    wall = time.perf_counter() - started
    statuses = [s for _, s in sequential + concurrent]
    assert statuses == [200] * 70, statuses
    seq = [t * 1000 for t, _ in sequential]
    con = [t * 1000 for t, _ in concurrent]
    return {
        "seq_p50": percentile(seq, 0.5),
        "seq_p99": percentile(seq, 0.99),
        "c4_p50": percentile(con, 0.5),
        "c4_p99": percentile(con, 0.99),
        "c4_docs_per_s": 40 * 8 / wall,
    }


def test_seed_latency_procedure(upstream: Stack, gateway: Gateway) -> None:
    def to_direct(texts: list[str]) -> Reply:
        return http(
            "POST", f"{upstream.url}/v1/embeddings", {"model": SERVED_MODEL, "input": texts}
        )

    def to_gateway(texts: list[str]) -> Reply:
        return gateway.embeddings({"model": SERVED_MODEL, "input": texts})

    runs: dict[str, list[dict[str, float]]] = {"direct": [], "gateway": []}
    for _ in range(REPETITIONS):  # alternate, so drift hits both alike
        runs["direct"].append(run_once(to_direct))
        runs["gateway"].append(run_once(to_gateway))
    medians = {
        side: {k: statistics.median(r[k] for r in reps) for k in reps[0]}
        for side, reps in runs.items()
    }
    d, g = medians["direct"], medians["gateway"]
    print(f"\n[e2e latency] {upstream.kind} (ms; docs/s), median of {REPETITIONS}")
    print("| path | seq p50 | seq p99 | c4 p50 | c4 p99 | c4 docs/s |")
    for name, m in (("direct", d), ("gateway", g)):
        print(
            f"| {name} | {m['seq_p50']:.1f} | {m['seq_p99']:.1f} | {m['c4_p50']:.1f} | "
            f"{m['c4_p99']:.1f} | {m['c4_docs_per_s']:.0f} |"
        )
    print(
        f"| gateway/direct | {g['seq_p50'] / d['seq_p50']:.2f}x | {g['seq_p99'] / d['seq_p99']:.2f}x | "
        f"{g['c4_p50'] / d['c4_p50']:.2f}x | {g['c4_p99'] / d['c4_p99']:.2f}x | "
        f"{g['c4_docs_per_s'] / d['c4_docs_per_s']:.2f}x |"
    )
