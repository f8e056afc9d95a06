"""The admission budget is the host's, whatever `--workers` is: `extproc run` splits
the policy's `max_inflight_bytes` evenly over its workers, so a burst that one worker
admits up to the budget and refuses past it is admitted and refused at the same total
by two (each admitting its half). Before the split, each worker admitted the whole
budget and a two-worker host took twice the work."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest

from extproc.core.contract import Contract
from extproc.core.request_rewrite import rewrite_request
from extproc.service.admission import request_work_bytes, response_work_bytes
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import GatewaySpec
from testing_support.qwen import QWEN_MODEL, SHIPPED_QWEN_POLICY
from tests.harness import Gateways

pytestmark = pytest.mark.alone  # a burst held at the upstream, counted by its answers

# 256 inputs cut to 256-d: its answer is rewritten, so its work is its body's and its
# answer's (admission.py's estimates, computed below from the same functions).
BODY = orjson.dumps(
    {"model": QWEN_MODEL, "input": [f"doc {i}" for i in range(256)], "dimensions": 256}
)
BURST = 14
PER_WORKER = 3  # requests of that work each worker's half of the budget holds


def work_of_one(contract: Contract) -> int:
    forward = rewrite_request(BODY, contract.policy, contract.tokenizers, clock=time.monotonic)
    return request_work_bytes(len(BODY)) + response_work_bytes(forward.plan)


def burst_admitted(gateways: Gateways, upstream: FakeUpstream, budget: int, workers: int) -> int:
    """How many of a burst of BURST such requests get a 200 while the upstream holds
    every admitted one for 3 s (the others wait 100 ms and get 503)."""
    policy = (
        f"limits:\n  max_inflight_bytes: {budget}\n  admission_wait_ms: 100\n"
        + SHIPPED_QWEN_POLICY.read_text(encoding="utf-8")
    )
    upstream.reset()
    upstream.fault, upstream.slow_seconds = "slow", 3.0
    try:
        spec = GatewaySpec(upstream.url, policy=policy, workers=workers)
        with gateways.own(spec) as gateway, ThreadPoolExecutor(BURST) as pool:
            replies = list(pool.map(lambda _: gateway.embeddings(BODY, timeout=60), range(BURST)))
    finally:
        upstream.reset()
    statuses = sorted(r.status for r in replies)
    assert set(statuses) <= {200, 503}, statuses
    return statuses.count(200)


def test_two_workers_admit_a_burst_at_the_budget_one_worker_admits(
    gateways: Gateways, upstream: FakeUpstream, qwen_contract: Contract
) -> None:
    work = work_of_one(qwen_contract)
    # Room for 2 x PER_WORKER requests and a half: one process holds 6 of them, each of
    # two processes 3 (the half request is no room for a fourth).
    budget = int((2 * PER_WORKER + 0.5) * work)
    one = burst_admitted(gateways, upstream, budget, workers=1)
    two = burst_admitted(gateways, upstream, budget, workers=2)
    assert one == 2 * PER_WORKER, (one, work, budget)
    assert two == 2 * PER_WORKER, (two, work, budget)
