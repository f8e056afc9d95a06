"""Admission control's pieces: the budget's invariants, pending reservations that
lapse, the gate's bounded first-come first-served waits (on a loop whose clock
jumps from timer to timer, so the times are exact), reconfiguration, the work
estimate of a plan, the policy fields and the stream's 503 answer."""

from __future__ import annotations

import asyncio
import math
import random
import selectors
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest

from extproc.core.contract import Contract
from extproc.core.plan import Encoding, ResponsePlan
from extproc.core.policy.loader import PolicyError
from extproc.core.policy.model import (
    DEFAULT_ADMISSION_UPLOAD_BYTES_PER_S,
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
from extproc.service.policy_file import load_policy_file
from extproc.service.stream import ExtProcStream, Phase, Shape
from testing_support.qwen import SHIPPED_QWEN_POLICY
from tests.recorded_metrics import RecordedStreamMetrics

MiB = 1024 * 1024
T = TypeVar("T")


class JumpingSelector(selectors.SelectSelector):
    """Waits for nothing: moves its loop's clock to the end of the timeout instead."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError("nothing is scheduled: the scenario would wait forever")
        self.clock += timeout
        return super().select(0)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only while every task waits, and then straight
    to the next timer: holds, waits and timeouts take no real time and happen at
    exactly the times they are set for."""

    def __init__(self) -> None:
        self._jumps = JumpingSelector()
        super().__init__(self._jumps)

    def time(self) -> float:
        return self._jumps.clock


def run_virtual(scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(scenario())


def now() -> float:
    return round(asyncio.get_running_loop().time(), 6)


def invariant_holds(budget: Budget, tickets: list[Ticket], at: float) -> bool:
    held = [t for t in tickets if t.held]
    budget.prune(at)
    return (
        budget.in_flight == sum(t.cost for t in held)
        and budget.holders == len(held)
        and budget.in_flight >= 0
        and (budget.in_flight <= budget.capacity or len(held) == 1)
        and budget.pending == sum(t.pending for t in tickets)
        and budget.pending_holders == len([t for t in tickets if t.pending])
        and all(t.pending_until > at for t in tickets if t.pending)
    )


def test_budget_invariants_under_random_traffic() -> None:
    rng = random.Random(7)
    budget = Budget(capacity=100)
    tickets = [Ticket() for _ in range(12)]
    clock = 0.0
    counts = dict.fromkeys(["taken", "refused", "reserved", "unfit", "lapsed"], 0)
    for _ in range(5000):
        clock += rng.choice([0.0, 0.0, 0.01, 0.1, 0.3])
        ticket = rng.choice(tickets)
        roll = rng.random()
        if ticket.held and roll < 0.3:
            budget.give_back(ticket)
        elif roll < 0.5:
            work, until = rng.choice([1, 10, 40, 99, 150]), clock + rng.choice([0.05, 0.2, 1.0])
            if budget.fits_reserved(ticket, work, clock):
                budget.reserve(ticket, work, until, clock)
                counts["reserved"] += 1
            else:
                with pytest.raises(ValueError):
                    budget.reserve(ticket, work, until, clock)
                counts["unfit"] += 1
        elif roll < 0.6:
            budget.unreserve(ticket)  # its body came
        else:
            extra = rng.choice([0, 1, 10, 40, 99, 150])
            if budget.fits(ticket, extra):
                budget.take(ticket, extra)
                counts["taken"] += 1
            else:
                with pytest.raises(ValueError):
                    budget.take(ticket, extra)
                counts["refused"] += 1
        pending_before = budget.pending
        assert invariant_holds(budget, tickets, clock)
        counts["lapsed"] += budget.pending < pending_before
    assert min(counts.values()) > 100, counts  # every path was exercised


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
    # At the headers, alone means no work in flight and no live reservation.
    other = Ticket()
    budget.reserve(other, 5, until=1.0, now=0.0)
    assert not budget.fits_reserved(big, 1000, 0.5)
    assert budget.fits_reserved(big, 1000, 1.0)  # the other one lapsed
    budget.reserve(big, 1000, until=3.0, now=1.0)
    assert budget.fits_reserved(big, 2000, 2.0)  # alone: it may reserve afresh
    assert (budget.pending, budget.pending_holders) == (1000, 1)


def test_a_reservation_lapses_after_its_hold_and_is_never_work_in_flight() -> None:
    budget = Budget(capacity=100)
    stalled, other = Ticket(), Ticket()
    budget.reserve(stalled, 80, until=0.25, now=0.0)
    assert (budget.in_flight, budget.live_pending(0.1)) == (0, (80, 1))
    assert not budget.fits_reserved(other, 40, 0.1)  # not at the headers
    assert budget.fits(other, 40)  # but a body is admitted: only work here counts
    assert budget.fits_reserved(other, 40, 0.25)  # lapsed: it counts for nothing
    assert (stalled.pending, budget.pending, budget.pending_holders) == (0, 0, 0)
    budget.give_back(stalled)  # its stream ends much later: nothing to give back
    assert (budget.in_flight, budget.holders, budget.pending) == (0, 0, 0)
    # A body that comes replaces its reservation with its own work in flight.
    budget.reserve(other, 60, until=1.0, now=0.5)
    budget.unreserve(other)
    budget.take(other, 30)
    assert (budget.in_flight, budget.live_pending(0.6), other.cost) == (30, (0, 0), 30)
    budget.prune(2.0)  # its old expiry comes up: nothing to drop
    assert (budget.in_flight, budget.pending) == (30, 0)
    assert budget.next_expiry() == math.inf


def gate(capacity: int = 100, wait_s: float = 1.0, upload_rate: float = 100.0) -> AdmissionGate:
    """Times in these scenarios: a declared body of d bytes is held d / 100 s."""
    return AdmissionGate(Budget(capacity), wait_s, upload_rate)


Log = list[tuple[str, bool, float, int]]


async def headers(
    at: AdmissionGate, log: Log, name: str, work: int, declared: int, **wait: float
) -> Ticket:
    """Request headers: (name, admitted, when, the reservation they got)."""
    ticket = Ticket()
    admitted = await at.admit_headers(ticket, work, declared, **wait)
    log.append((name, admitted, now(), ticket.pending))
    return ticket


async def body(at: AdmissionGate, log: Log, name: str, ticket: Ticket, work: int) -> None:
    """A body: (name, admitted, when, its work in flight)."""
    admitted = at.arrived(ticket, work) or await at.admit(ticket, work)
    log.append((name, admitted, now(), ticket.cost))


def test_a_stalled_reservation_holds_a_waiter_back_for_at_most_its_own_hold() -> None:
    async def scenario() -> tuple[Log, int]:
        at = gate()
        log: Log = []
        stalled = await headers(at, log, "stalled", 90, 50)  # live until 0.5 s
        await asyncio.sleep(0.01)
        await asyncio.gather(
            headers(at, log, "small", 30, 10),  # its hold: 0.1 s
            headers(at, log, "large", 30, 150),  # 1.5 s, over the 1 s wait
        )
        assert stalled.pending == 0  # lapsed, never arrived
        return log, at.budget.pending

    log, pending = run_virtual(scenario)
    assert log == [
        ("stalled", True, 0.0, 90),
        ("small", True, 0.11, 30),  # after its own hold, next to work in flight only
        ("large", True, 0.5, 30),  # when the stalled one lapsed
    ]
    assert pending == 30


def test_past_its_hold_a_waiter_counts_the_reservations_granted_since_it_came() -> None:
    """Waiters whose hold ends together do not all go on: each one's reservation
    counts for those that came before it was granted."""

    async def scenario() -> Log:
        at = AdmissionGate(Budget(48), wait_s=1.0, upload_rate=32.0)
        log: Log = []
        for name in ("stalled 1", "stalled 2"):
            await headers(at, log, name, 24, 100)  # live for 3.125 s
        await asyncio.sleep(0.01)
        await asyncio.gather(*(headers(at, log, f"w{i}", 6, 2) for i in range(10)))
        return log

    log = run_virtual(scenario)
    assert log[:2] == [("stalled 1", True, 0.0, 24), ("stalled 2", True, 0.0, 24)]
    # 48 of room in flight, 6 each: 8 after their hold (2 / 32 s), the other two once
    # those 8 reservations lapse in their turn.
    assert log[2:] == [(f"w{i}", True, 0.0725, 6) for i in range(8)] + [
        (f"w{i}", True, 0.135, 6) for i in (8, 9)
    ]


def test_bodies_go_first_and_headers_wait_in_order() -> None:
    async def scenario() -> Log:
        at = gate()
        log: Log = []
        first = Ticket()
        assert await at.admit(first, 80)
        waiting = [
            asyncio.create_task(headers(at, log, "h1", 50, 500)),  # waits for room in flight
            asyncio.create_task(headers(at, log, "h2", 5, 1)),  # fits, but h1 is first
        ]
        await asyncio.sleep(0.1)
        assert log == []
        await body(at, log, "b1", Ticket(), 15)  # bodies pass the headers: 95 in flight
        late_body = asyncio.create_task(body(at, log, "b2", Ticket(), 30))
        await asyncio.sleep(0.1)
        at.release(first)  # 15 in flight: b2, then h1, then h2
        await asyncio.gather(late_body, *waiting)
        refused = await headers(at, log, "late", 60, 1)  # 45 + 55 reserved: no room
        assert refused.pending == 0 and not refused.held
        return log

    assert run_virtual(scenario) == [
        ("b1", True, 0.1, 15),
        ("b2", True, 0.2, 30),
        ("h1", True, 0.2, 50),
        ("h2", True, 0.2, 5),
        ("late", False, 1.2, 0),  # the whole wait, then refused
    ]


def test_only_waiters_held_back_by_reservations_are_passed() -> None:
    async def scenario() -> Log:
        at = gate(wait_s=2.0)
        log: Log = []
        await headers(at, log, "stalled", 90, 100)  # live until 1.0 s
        await asyncio.sleep(0.01)
        await asyncio.gather(
            headers(at, log, "h1", 20, 150),  # held back until 1.0 (its hold: 1.5 s)
            headers(at, log, "h2", 20, 10),  # hold 0.1 s: passes h1
        )
        busy = Ticket()
        assert await at.admit(busy, 80)  # in flight: 80, and h1's reservation of 20
        await asyncio.gather(
            headers(at, log, "h3", 30, 150),  # waits for room in flight
            headers(at, log, "h4", 5, 1, wait_s=1.0),  # fits in flight, may not pass h3
        )
        return log

    assert run_virtual(scenario) == [
        ("stalled", True, 0.0, 90),
        ("h2", True, 0.11, 20),
        ("h1", True, 1.0, 20),
        ("h4", False, 2.0, 0),
        ("h3", False, 3.0, 0),
    ]


@pytest.mark.parametrize(
    ("declared", "work", "admitted"),
    [(8, 24, 2), (2, 6, 8)],  # hold 0.25 s (the wait), 0.0625 s (under it)
    ids=["8-MiB-like", "2-MiB-like"],
)
def test_a_burst_of_fast_uploads_is_refused_at_the_headers(
    declared: int, work: int, admitted: int
) -> None:
    """What reservations are for: bodies that arrive at a sane rate fill the budget in
    flight, and the rest of the burst is refused at its headers, bodies unread."""

    async def scenario() -> tuple[list[str], float, int]:
        at = AdmissionGate(Budget(48), wait_s=0.25, upload_rate=32.0)
        outcomes: list[str] = []

        async def request() -> None:
            ticket = Ticket()
            if not await at.admit_headers(ticket, work, declared):
                outcomes.append("refused at the headers")
                return
            went_on_reserved = ticket.pending > 0
            await asyncio.sleep(0.05)  # the body arrives at 160 per second
            ok = at.arrived(ticket, work) or await at.admit(ticket, work)
            outcomes.append("served" if ok and went_on_reserved else "body refused or unreserved")
            await asyncio.sleep(1.0)  # processed
            at.release(ticket)

        await asyncio.gather(*(request() for _ in range(20)))
        return outcomes, now(), at.in_flight + at.budget.live_pending(now())[0]

    outcomes, ended, left = run_virtual(scenario)
    assert sorted(outcomes) == ["refused at the headers"] * (20 - admitted) + ["served"] * admitted
    assert (ended, left) == (1.05, 0)


def test_reconfiguration_applies_to_what_comes_next() -> None:
    async def scenario() -> Log:
        at = gate()
        log: Log = []
        running = Ticket()
        assert await at.admit(running, 80)
        waiting = asyncio.create_task(headers(at, log, "raised", 50, 500))
        await asyncio.sleep(0.1)
        at.configure(200, 1.0, 100.0)  # room now: in at once
        await waiting
        at.configure(50, 0.5, 1000.0)  # lower than what is held: it stays held
        assert (at.in_flight, running.cost, at.budget.pending) == (80, 80, 50)
        small = asyncio.create_task(body(at, log, "small body", Ticket(), 1))
        await asyncio.sleep(0.2)
        at.release(running)  # 0 in flight: the small body fits the new capacity
        await small
        await headers(at, log, "new wait", 60, 1)  # not alone: refused after 0.5 s
        await headers(at, log, "new rate", 10, 100)  # held back for 100 / 1000 s
        return log

    assert run_virtual(scenario) == [
        ("raised", True, 0.1, 50),
        ("small body", True, 0.3, 1),
        ("new wait", False, 0.8, 0),
        ("new rate", True, 0.9, 10),
    ]


def test_a_cancelled_waiter_leaves_nothing_behind() -> None:
    async def scenario() -> int:
        at = gate(capacity=10, wait_s=5.0)
        holder, in_body, at_headers = Ticket(), Ticket(), Ticket()
        assert await at.admit(holder, 10)
        tasks = [
            asyncio.create_task(at.admit(in_body, 5)),
            asyncio.create_task(at.admit_headers(at_headers, 5, 10_000)),
        ]
        await asyncio.sleep(0.02)
        for task in tasks:
            task.cancel()  # Envoy gave up on the stream while it waited
            with pytest.raises(asyncio.CancelledError):
                await task
        for ticket in (in_body, at_headers, holder):
            at.release(ticket)  # the servicer's finally
        return at.in_flight + at.budget.pending + len(at._bodies) + len(at._headers)

    assert run_virtual(scenario) == 0


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
    assert limits.admission_upload_bytes_per_s == DEFAULT_ADMISSION_UPLOAD_BYTES_PER_S
    custom = load(
        "  max_inflight_bytes: 2097152\n  admission_wait_ms: 0\n  retryAfterS: 5\n"
        "  admission_upload_bytes_per_s: 1048576"
    )
    assert (
        custom.max_inflight_bytes,
        custom.admission_wait_ms,
        custom.retry_after_s,
        custom.admission_upload_bytes_per_s,
    ) == (2 * MiB, 0, 5, MiB)
    for bad, field in [
        ("  max_inflight_bytes: 1000", "max_inflight_bytes"),
        ("  admission_wait_ms: 60000", "admission_wait_ms"),
        ("  retry_after_s: 0", "retry_after_s"),
        ("  admission_upload_bytes_per_s: 65536", "admission_upload_bytes_per_s"),
        ("  admission_upload_bytes_per_s: 0", "admission_upload_bytes_per_s"),
    ]:
        with pytest.raises(PolicyError, match=f"limits.{field}: must be between"):
            load(bad)


def test_refused_stream_answers_503_overloaded_with_retry_after(
    qwen_contract: Contract,
) -> None:
    stream = ExtProcStream(qwen_contract, Shape.RESPONSE_ON_SECOND_STREAM, RecordedStreamMetrics())
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
    assert stream.phase is Phase.DONE and stream.decided
