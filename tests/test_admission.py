"""Admission control's pieces: the budget's invariant, the gate's bounded first-come
first-served wait, the work estimate of a plan, the policy fields and the stream's
503 answer."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import orjson
import pytest

from extproc.core.contract import Contract
from extproc.core.plan import Encoding, ResponsePlan
from extproc.core.policy import load_policy_file
from extproc.core.policy.loader import PolicyError
from extproc.core.policy.model import (
    DEFAULT_ADMISSION_WAIT_MS,
    DEFAULT_MAX_INFLIGHT_BYTES,
    DEFAULT_RETRY_AFTER_S,
    Limits,
)
from extproc.service.admission import (
    AdmissionGate,
    Budget,
    Ticket,
    overloaded_error,
    response_work_bytes,
)
from extproc.service.stream import ExtProcStream, Phase
from tests.conftest import SHIPPED_QWEN_POLICY

MiB = 1024 * 1024


def invariant_holds(budget: Budget, tickets: list[Ticket]) -> bool:
    held = [t for t in tickets if t.held]
    return (
        budget.in_flight == sum(t.cost for t in held)
        and budget.holders == len(held)
        and budget.in_flight >= 0
        and (budget.in_flight <= budget.capacity or len(held) == 1)
    )


def test_budget_invariant_under_random_traffic() -> None:
    rng = random.Random(7)
    budget = Budget(capacity=100)
    tickets = [Ticket() for _ in range(12)]
    admitted = refused = 0
    for _ in range(5000):
        ticket = rng.choice(tickets)
        if ticket.held and rng.random() < 0.4:
            budget.give_back(ticket)
        elif ticket.held and rng.random() < 0.2:
            budget.settle(ticket, rng.randrange(0, 2 * ticket.cost + 1))
        else:
            extra = rng.choice([0, 1, 10, 40, 99, 150])
            if budget.fits(ticket, extra):
                budget.take(ticket, extra)
                admitted += 1
            else:
                with pytest.raises(ValueError):
                    budget.take(ticket, extra)
                refused += 1
        assert invariant_holds(budget, tickets)
    assert admitted > 100 and refused > 100  # both sides were exercised


def test_a_request_bigger_than_the_budget_is_admitted_alone() -> None:
    budget = Budget(capacity=10)
    big, small = Ticket(), Ticket()
    assert budget.fits(big, 1000)
    budget.take(big, 1000)
    assert budget.fits(big, 500)  # alone, it may grow (its answer's share)
    assert not budget.fits(small, 1)
    budget.give_back(big)
    assert (budget.in_flight, budget.holders) == (0, 0)
    budget.give_back(big)  # twice is harmless
    assert (budget.in_flight, budget.holders) == (0, 0)


def test_a_reservation_settles_down_to_the_body_and_lets_waiters_in() -> None:
    """A share reserved from the request headers (declared length, or the body limit
    when none is declared) is lowered to the body that came, never raised."""

    async def scenario() -> tuple[int, bool]:
        gate = AdmissionGate(Budget(capacity=100), wait_s=5.0)
        unsized, next_one = Ticket(), Ticket()
        assert await gate.admit(unsized, 100)  # unknown length: the whole limit
        waiting = asyncio.create_task(gate.admit(next_one, 60))
        await asyncio.sleep(0.02)
        assert not waiting.done()
        gate.settle(unsized, 30)  # the body was 30 bytes
        admitted = await asyncio.wait_for(waiting, 1.0)
        gate.settle(unsized, 90)  # never raised by a settle
        assert unsized.cost == 30 and gate.in_flight == 90
        gate.release(unsized)
        gate.release(next_one)
        return gate.in_flight, admitted

    assert asyncio.run(scenario()) == (0, True)
    budget = Budget(capacity=10)
    idle = Ticket()
    budget.settle(idle, 0)  # not held: nothing to settle
    assert (budget.in_flight, idle.held) == (0, False)


def test_gate_waits_in_order_then_refuses() -> None:
    async def scenario() -> list[str]:
        gate = AdmissionGate(Budget(capacity=100), wait_s=0.2)
        first, second, third = Ticket(), Ticket(), Ticket()
        assert await gate.admit(first, 80)
        events: list[str] = []

        async def wait_for(name: str, ticket: Ticket, cost: int, wait_s: float) -> None:
            ok = await gate.admit(ticket, cost, wait_s=wait_s)
            events.append(f"{name}:{'in' if ok else 'refused'}")

        waiting = [
            asyncio.create_task(wait_for("second", second, 50, 5.0)),
            asyncio.create_task(wait_for("third", third, 10, 5.0)),
        ]
        await asyncio.sleep(0.05)
        # `third` would fit now (80 + 10) but arrived after `second`: first come, first served.
        assert events == [] and gate.in_flight == 80
        gate.release(first)
        await asyncio.gather(*waiting)
        assert gate.in_flight == 60
        late = Ticket()
        refused = await gate.admit(late, 50)  # default wait: 0.2 s
        events.append(f"late:{'in' if refused else 'refused'}")
        gate.release(second)
        gate.release(third)
        assert gate.in_flight == 0 and not gate._queue
        return events

    assert asyncio.run(scenario()) == ["second:in", "third:in", "late:refused"]


def test_a_cancelled_waiter_leaves_no_bytes_behind() -> None:
    async def scenario() -> int:
        gate = AdmissionGate(Budget(capacity=10), wait_s=5.0)
        holder, waiter = Ticket(), Ticket()
        assert await gate.admit(holder, 10)
        task = asyncio.create_task(gate.admit(waiter, 5))
        await asyncio.sleep(0.02)
        task.cancel()  # Envoy gave up on the stream while it waited
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.release(waiter)  # the servicer's finally
        gate.release(holder)
        return gate.in_flight + len(gate._queue)

    assert asyncio.run(scenario()) == 0


def plan(**overrides: object) -> ResponsePlan:
    fields: dict[str, object] = {
        "model": "m",
        "input_count": 2048,
        "native_dimensions": 1024,
        "upstream_kind": "dynamo",
        "client_encoding": Encoding.FLOAT,
        "upstream_encoding": Encoding.BASE64,
        "dimensions": 256,
    }
    fields.update(overrides)
    return ResponsePlan(**fields)  # type: ignore[arg-type]


def test_response_work_follows_the_answers_sizes() -> None:
    rewrite = response_work_bytes(plan())
    # Measured bodies of this case: ~11.2 MB of base64 from the upstream, ~5.5 MB of
    # 256-d float JSON to the client. The estimate is of that order, not a multiple.
    assert 15 * MiB < rewrite < 25 * MiB
    assert response_work_bytes(plan(dimensions=None, client_encoding=Encoding.BASE64)) == 0
    assert response_work_bytes(plan(input_count=1)) < 16 * 1024
    checked = plan(dimensions=None, upstream_encoding=Encoding.FLOAT, check_only=True)
    assert response_work_bytes(checked) > 0


def test_policy_defaults_and_bounds(tmp_path: Path) -> None:
    models = SHIPPED_QWEN_POLICY.read_text()

    def load(limits: str) -> Limits:
        path = tmp_path / "policy.yaml"
        path.write_text(f"limits:\n{limits}\n{models}")
        return load_policy_file(path).limits

    limits = load_policy_file(SHIPPED_QWEN_POLICY).limits
    assert limits.max_inflight_bytes == DEFAULT_MAX_INFLIGHT_BYTES == 48 * MiB
    assert limits.admission_wait_ms == DEFAULT_ADMISSION_WAIT_MS
    assert limits.retry_after_s == DEFAULT_RETRY_AFTER_S
    custom = load("  max_inflight_bytes: 2097152\n  admission_wait_ms: 0\n  retryAfterS: 5")
    assert (custom.max_inflight_bytes, custom.admission_wait_ms, custom.retry_after_s) == (
        2 * MiB,
        0,
        5,
    )
    for bad, field in [
        ("  max_inflight_bytes: 1000", "max_inflight_bytes"),
        ("  admission_wait_ms: 60000", "admission_wait_ms"),
        ("  retry_after_s: 0", "retry_after_s"),
    ]:
        with pytest.raises(PolicyError, match=field):
            load(bad)


def test_refused_stream_answers_503_overloaded_with_retry_after(
    qwen_contract: Contract,
) -> None:
    stream = ExtProcStream(qwen_contract)
    reply = stream.refuse_overloaded(overloaded_error(3), 3)
    response = reply.immediate_response
    assert response.status.code == 503
    headers = {h.header.key: h.header.raw_value.decode() for h in response.headers.set_headers}
    assert headers == {"content-type": "application/json", "retry-after": "3"}
    error = orjson.loads(response.body)["error"]
    assert error == {
        "message": "The gateway is at capacity; retry after 3 s.",
        "type": "server_error",
        "param": None,
        "code": "overloaded",
    }
    assert stream.phase is Phase.DONE and stream.decided and not stream.response_follows
