"""Section 3 of the report: latency and throughput, as a cut-over study measures them.

Per repetition and per server: ``sequential`` requests one after the other (default 30),
then ``concurrent`` requests (default 40) from ``concurrency`` threads (default 4); every
request is one batch of 8 corpus documents, cycling through the batches. Reported per
server: the median over repetitions (default 3) of sequential p50/p99, concurrent
p50/p99 and concurrent documents per second; error counts are summed. Repetitions
alternate between the servers (baseline, candidate, baseline, ...) so slow drift of
the machine hits both alike. Before each timed phase the connections are opened with
unmeasured warm-up requests (one per thread).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.runtime.blocking_http import HttpResult
from extproc.tools.parity import Answer
from extproc.tools.toolkit.embeddings_client import EmbeddingsClient
from extproc.tools.toolkit.stats import median, percentile, ratio

BARRIER_TIMEOUT_S = 10.0
MAX_ERROR_EXAMPLES = 5


@dataclass(frozen=True)
class LatencyPlan:
    sequential: int = 30
    concurrent: int = 40
    concurrency: int = 4
    repetitions: int = 3
    batch_size: int = 8


QUICK_PLAN = LatencyPlan(sequential=10, concurrent=8, concurrency=4, repetitions=1)


@dataclass(frozen=True)
class LatencyRequest:
    """One request the latency runs send, and how many inputs it embeds."""

    body: bytes
    inputs: int


@dataclass(frozen=True)
class Timing:
    """One request of a latency run: answered as asked, and how long it took."""

    ok: bool
    elapsed_ms: float
    error: str | None = None


@dataclass(frozen=True)
class RunSample:
    """The raw measurements of one repetition on one server."""

    sequential: tuple[Timing, ...]
    concurrent: tuple[Timing, ...]
    concurrent_wall_s: float
    concurrent_docs: int  # documents embedded by the successful concurrent requests


@dataclass(frozen=True)
class Figures:
    sequential_p50_ms: float | None
    sequential_p99_ms: float | None
    concurrent_p50_ms: float | None
    concurrent_p99_ms: float | None
    concurrent_docs_per_s: float | None
    errors: int


@dataclass(frozen=True)
class SideLatency:
    repetitions: tuple[Figures, ...]
    median: Figures  # errors: the sum over repetitions
    error_examples: tuple[str, ...]


@dataclass(frozen=True)
class LatencyResult:
    plan: LatencyPlan
    baseline: SideLatency
    candidate: SideLatency
    ratios: dict[str, float | None]  # candidate / baseline, per figure


FIGURES = (
    "sequential_p50_ms",
    "sequential_p99_ms",
    "concurrent_p50_ms",
    "concurrent_p99_ms",
    "concurrent_docs_per_s",
)


def _pct(outcomes: Sequence[Timing], q: float) -> float | None:
    values = [o.elapsed_ms for o in outcomes if o.ok]
    return percentile(values, q) if values else None


def figures(sample: RunSample) -> Figures:
    """p50/p99 over the successful requests, docs/s over the concurrent phase's wall time."""
    errors = sum(1 for o in sample.sequential + sample.concurrent if not o.ok)
    docs_per_s = (
        sample.concurrent_docs / sample.concurrent_wall_s
        if sample.concurrent_wall_s > 0 and sample.concurrent_docs > 0
        else None
    )
    return Figures(
        sequential_p50_ms=_pct(sample.sequential, 50),
        sequential_p99_ms=_pct(sample.sequential, 99),
        concurrent_p50_ms=_pct(sample.concurrent, 50),
        concurrent_p99_ms=_pct(sample.concurrent, 99),
        concurrent_docs_per_s=docs_per_s,
        errors=errors,
    )


def _median_of(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return median(present) if present else None


def combine(samples: Sequence[RunSample]) -> SideLatency:
    """Median of each figure over the repetitions; errors summed."""
    reps = tuple(figures(s) for s in samples)
    examples: list[str] = []
    for sample in samples:
        for outcome in sample.sequential + sample.concurrent:
            if outcome.error and len(examples) < MAX_ERROR_EXAMPLES:
                examples.append(outcome.error)
    med = Figures(
        sequential_p50_ms=_median_of([r.sequential_p50_ms for r in reps]),
        sequential_p99_ms=_median_of([r.sequential_p99_ms for r in reps]),
        concurrent_p50_ms=_median_of([r.concurrent_p50_ms for r in reps]),
        concurrent_p99_ms=_median_of([r.concurrent_p99_ms for r in reps]),
        concurrent_docs_per_s=_median_of([r.concurrent_docs_per_s for r in reps]),
        errors=sum(r.errors for r in reps),
    )
    return SideLatency(repetitions=reps, median=med, error_examples=tuple(examples))


def ratios(baseline: Figures, candidate: Figures) -> dict[str, float | None]:
    return {name: ratio(getattr(candidate, name), getattr(baseline, name)) for name in FIGURES}


# ------------------------------------------------------------------------------ I/O


def _check(result: HttpResult, inputs: int, dialect: EmbeddingsDialect | None) -> Timing:
    elapsed_ms = result.elapsed_s * 1000.0
    if result.status != 200:
        return Timing(False, elapsed_ms, f"HTTP {result.status or result.error}")
    answer = Answer.read(result.status, result.body, dialect)
    if answer.count is None:
        return Timing(False, elapsed_ms, f"unreadable answer: {answer.problem}")
    if answer.count != inputs:
        return Timing(False, elapsed_ms, f"{answer.count} vectors for {inputs} inputs")
    return Timing(True, elapsed_ms)


def measure_once(
    client: EmbeddingsClient,
    requests: Sequence[LatencyRequest],
    plan: LatencyPlan,
    pool: ThreadPoolExecutor,
) -> RunSample:
    """One repetition against one server. ``pool`` has ``plan.concurrency`` threads."""
    if not requests:
        raise ValueError("no requests to send")
    client.post(requests[0].body)  # warm-up: this thread's connection
    sequential: list[Timing] = []
    for i in range(plan.sequential):
        request = requests[i % len(requests)]
        sequential.append(_check(client.post(request.body), request.inputs, client.dialect))

    barrier = threading.Barrier(plan.concurrency, timeout=BARRIER_TIMEOUT_S)

    def warm() -> None:  # one request on each pool thread, so each has its connection
        client.post(requests[0].body)
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()

    for future in [pool.submit(warm) for _ in range(plan.concurrency)]:
        future.result()

    def one(i: int) -> Timing:
        request = requests[i % len(requests)]
        return _check(client.post(request.body), request.inputs, client.dialect)

    started = time.perf_counter()
    futures = [pool.submit(one, i) for i in range(plan.concurrent)]
    concurrent = [f.result() for f in futures]
    wall = time.perf_counter() - started
    docs = sum(
        requests[i % len(requests)].inputs for i, outcome in enumerate(concurrent) if outcome.ok
    )
    return RunSample(tuple(sequential), tuple(concurrent), wall, docs)


def run_latency(
    baseline: EmbeddingsClient,
    candidate: EmbeddingsClient,
    requests: Sequence[LatencyRequest],
    plan: LatencyPlan,
) -> LatencyResult:
    samples: dict[str, list[RunSample]] = {"baseline": [], "candidate": []}
    with (
        ThreadPoolExecutor(plan.concurrency, thread_name_prefix="probe-base") as base_pool,
        ThreadPoolExecutor(plan.concurrency, thread_name_prefix="probe-cand") as cand_pool,
    ):
        for _ in range(plan.repetitions):
            samples["baseline"].append(measure_once(baseline, requests, plan, base_pool))
            samples["candidate"].append(measure_once(candidate, requests, plan, cand_pool))
    base = combine(samples["baseline"])
    cand = combine(samples["candidate"])
    return LatencyResult(
        plan=plan, baseline=base, candidate=cand, ratios=ratios(base.median, cand.median)
    )
