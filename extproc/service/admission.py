"""Admission control: a per-process budget of work, in bytes, that a slow client
cannot hold.

A request's work is its body, counted :data:`REQUEST_WORK_PER_BODY_BYTE` times
(:func:`request_work_bytes`), plus, when the gateway must rewrite or check the
answer, an estimate of the upstream's answer and of the client's (see
:func:`response_work_bytes`). The process's RSS above its idle size grows in
proportion to the work it holds, so bounding that bounds the memory.

The budget keeps two kinds of share:

- **in flight**: work that is here (a body being processed, an answer's
  reservation). Only this bounds the memory.
- **pending**: a reservation made at the request headers, where the server sees
  them (single-filter.yaml and the meshes; standalone.yaml's route for large or
  unsized bodies), for a body Envoy has not read yet: the work of the declared
  Content-Length, or of the body limit when none is declared. It lets the server
  refuse most of a burst of large uploads before Envoy reads their bodies. It is
  live for ``hold(d) = d / upload_rate`` from when it is granted (``d`` the
  declared bytes, ``upload_rate`` the policy's floor rate): the time such a body
  takes to arrive at that rate. Then it counts for nothing. When the body comes,
  its reservation is dropped and the body is admitted as work in flight.

Rules of :class:`AdmissionGate`:

1. A body, or an answer's reservation, is admitted when it fits in flight
   (``in_flight + work <= capacity``, or no other ticket holds work in flight).
   Bodies wait first come, first served, ahead of every request still at its
   headers: their bytes are already in Envoy.
2. Request headers go on with a reservation when ``in_flight + live pending +
   work <= capacity``, or when no other ticket holds work in flight or a live
   reservation. Otherwise they wait, first come, first served. A reservation holds
   back a request that came after it was granted for at most that request's own
   hold: past it, the reservations granted before it came count for nothing to
   it, and it goes on (with its own reservation) when the work in flight and the
   reservations granted since it came leave room, passing waiters held back only
   by reservations, never one that waits for room in flight. A hold as long as
   the wait or longer never ends early: such a request waits like one in a burst
   of large uploads.
3. Every wait is bounded (``admission_wait_ms``); a request still waiting then is
   refused, and the caller answers 503 ``overloaded``.

So an upload that stalls holds its share of the budget for at most its hold after
its headers go on, holds back the requests that come after that for at most their
own hold, and holds no work in this process. Bodies slower than the floor rate
weaken the burst refusal only: their reservations lapse, and each lapse lets at
most the room it held go on.

Invariants of :class:`Budget`:

- ``in_flight`` is the sum of the held tickets' ``cost``, ``holders`` their count;
  ``0 <= in_flight``.
- ``in_flight <= capacity``, unless exactly one ticket is held, or the capacity was
  lowered under what was held (then nothing is added until it fits again). A
  request bigger than the whole budget is therefore admitted alone, on an idle
  process, rather than never: every request the policy's size caps accept can be
  served.
- ``pending`` is the sum of the tickets' reservations, ``pending_holders`` their
  count; after :meth:`Budget.prune` at ``now``, each of them is live at ``now``.
  A ticket may hold work in flight, a reservation, both or neither.

:class:`Budget` is pure bookkeeping: the time is a value passed in, no clock, no
I/O. :class:`AdmissionGate` is its asyncio shell (the loop's clock, bounded waits,
a timer for the moments a reservation lapses or a waiter's hold ends).
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import math
from dataclasses import dataclass, field

from extproc.core.api_errors import ServerError
from extproc.core.endpoint import Plan

# A body's work: its bytes, the parsed inputs and, for inputs long enough to be
# tokenized, their token ids and the rewritten body. Counted three times, a body
# weighs in the budget what its memory does next to the answers' bytes estimated
# below, so one budget bounds the RSS of both.
REQUEST_WORK_PER_BODY_BYTE = 3


def request_work_bytes(body_bytes: int) -> int:
    """Work of a request body of ``body_bytes`` (declared or received)."""
    return body_bytes * REQUEST_WORK_PER_BODY_BYTE


def response_work_bytes(plan: Plan) -> int:
    """Bytes the response phase holds at once for this plan: the upstream's body and
    the client's, both alive while the answer is rewritten. 0 when the answer is
    left to stream past the gateway."""
    return plan.answer_bytes() if plan.needs_response else 0


def overloaded_error(retry_after_s: int) -> ServerError:
    """The refused request's answer (sent with a ``Retry-After`` header)."""
    return ServerError(
        503, f"The gateway is at capacity; retry after {retry_after_s} s.", code="overloaded"
    )


@dataclass(eq=False)
class Ticket:
    """One request's shares of the budget, held until the request is over."""

    cost: int = 0  # work in flight
    held: bool = False
    pending: int = 0  # reserved at the request headers, from pending_since to pending_until
    pending_since: float = 0.0
    pending_until: float = 0.0
    reservation: int = 0  # which of the budget's reservations it holds


@dataclass
class Budget:
    """Work in flight and pending reservations against a capacity (invariants in
    the module doc). ``now`` is a time on whatever clock the caller keeps."""

    capacity: int
    in_flight: int = 0
    holders: int = 0
    pending: int = 0
    pending_holders: int = 0
    # (until, reservation, ticket) of every reservation made, a heap; an entry whose
    # ticket no longer holds that reservation is skipped when it comes up.
    _expiries: list[tuple[float, int, Ticket]] = field(default_factory=list)
    _made: int = 0

    def fits(self, ticket: Ticket, extra: int) -> bool:
        """Can ``ticket`` (held or not) add ``extra`` bytes of work in flight now?"""
        alone = self.holders == 0 or (self.holders == 1 and ticket.held)
        return alone or self.in_flight + extra <= self.capacity

    def take(self, ticket: Ticket, extra: int) -> None:
        if not self.fits(ticket, extra):
            raise ValueError("over budget")
        self.in_flight += extra
        ticket.cost += extra
        if not ticket.held:
            ticket.held = True
            self.holders += 1

    def give_back(self, ticket: Ticket) -> None:
        self.unreserve(ticket)
        if not ticket.held:
            return
        self.in_flight -= ticket.cost
        self.holders -= 1
        ticket.cost, ticket.held = 0, False

    def live_pending(self, now: float, *, since: float = -math.inf) -> tuple[int, int]:
        """(work, count) of the reservations live at ``now`` and granted at or after
        ``since`` (default: all of them)."""
        self.prune(now)
        if since == -math.inf:
            return self.pending, self.pending_holders
        work = count = 0
        for _, reservation, ticket in self._expiries:
            if ticket.reservation == reservation and ticket.pending_since >= since:
                work += ticket.pending
                count += 1
        return work, count

    def fits_reserved(
        self, ticket: Ticket, work: int, now: float, *, since: float = -math.inf
    ) -> bool:
        """Can ``ticket`` reserve ``work`` at ``now``, next to the work in flight and
        the live reservations granted at or after ``since`` (default: all)?"""
        pending, count = self.live_pending(now, since=since)
        own = ticket.pending if ticket.reservation and ticket.pending_since >= since else 0
        alone = (self.holders == 0 or (self.holders == 1 and ticket.held)) and count == (
            1 if own else 0
        )
        return alone or self.in_flight + pending - own + work <= self.capacity

    def reserve(
        self, ticket: Ticket, work: int, until: float, now: float, *, since: float = -math.inf
    ) -> None:
        """Reserve ``work`` for ``ticket`` (in place of any it had) from ``now`` until
        ``until``, if it fits next to the reservations granted since ``since``."""
        if not self.fits_reserved(ticket, work, now, since=since):
            raise ValueError("over budget")
        self.unreserve(ticket)
        if work <= 0 or until <= now:
            return  # lapsed already: it would count for nothing
        self._made += 1
        ticket.pending, ticket.reservation = work, self._made
        ticket.pending_since, ticket.pending_until = now, until
        self.pending += work
        self.pending_holders += 1
        heapq.heappush(self._expiries, (until, self._made, ticket))

    def unreserve(self, ticket: Ticket) -> None:
        """Drop ``ticket``'s reservation (its body came, or it is over)."""
        if ticket.reservation:
            self.pending -= ticket.pending
            self.pending_holders -= 1
            ticket.pending = ticket.reservation = 0

    def prune(self, now: float) -> None:
        """Drop the reservations that are no longer live at ``now``."""
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            _, reservation, ticket = heapq.heappop(expiries)
            if ticket.reservation == reservation:
                self.unreserve(ticket)

    def next_expiry(self) -> float:
        """When the next reservation lapses (a dropped one may come first: a wake-up
        for nothing); infinity when none is held."""
        return self._expiries[0][0] if self._expiries else math.inf


@dataclass(eq=False)
class _Waiter:
    ticket: Ticket
    work: int
    admitted: asyncio.Future[None]
    # Request headers only: when they came, how long the reservation they get lives,
    # and from when the reservations granted before they came no longer hold them
    # back (infinity: not before the wait ends).
    since: float = 0.0
    hold_s: float = 0.0
    patience_until: float = math.inf


@dataclass(eq=False)
class AdmissionGate:
    """The budget shared by every stream of one process, with bounded, first-come
    first-served waits (rules in the module doc). Single event loop; not
    thread-safe."""

    budget: Budget
    wait_s: float
    upload_rate: float  # bytes a second: a declared body's hold is its size over this
    _bodies: collections.deque[_Waiter] = field(default_factory=collections.deque)
    _headers: list[_Waiter] = field(default_factory=list)
    _timer: asyncio.TimerHandle | None = None

    @property
    def in_flight(self) -> int:
        return self.budget.in_flight

    @property
    def capacity(self) -> int:
        return self.budget.capacity

    def hold_s(self, declared_bytes: int) -> float:
        """How long a reservation for a body of ``declared_bytes`` stays live."""
        return declared_bytes / self.upload_rate

    def configure(self, capacity: int, wait_s: float, upload_rate: float) -> None:
        """New settings for the requests to come (a reloaded policy). What tickets
        hold stays theirs; a lower capacity only stops new work until it fits."""
        self.budget.capacity = capacity
        self.wait_s = wait_s
        self.upload_rate = upload_rate
        self._wake()

    def must_wait(self, ticket: Ticket, extra: int) -> bool:
        """Would :meth:`admit` queue this work rather than admit it at once?"""
        return bool(self._bodies) or not self.budget.fits(ticket, extra)

    def headers_must_wait(self, ticket: Ticket, work: int) -> bool:
        """Would :meth:`admit_headers` queue these request headers?"""
        return bool(self._bodies or self._headers) or not self.budget.fits_reserved(
            ticket, work, _now()
        )

    async def admit(self, ticket: Ticket, extra: int, *, wait_s: float | None = None) -> bool:
        """Add ``extra`` bytes of work in flight to ``ticket`` (a body, an answer),
        waiting at most ``wait_s`` (default: the gate's) behind earlier bodies.
        False: refused, the ticket is unchanged."""
        if not self.must_wait(ticket, extra):
            self.budget.take(ticket, extra)
            return True
        waiter = _Waiter(ticket, extra, asyncio.get_running_loop().create_future())
        self._bodies.append(waiter)
        return await self._wait(waiter, self._bodies, self.wait_s if wait_s is None else wait_s)

    async def admit_headers(
        self, ticket: Ticket, work: int, declared_bytes: int, *, wait_s: float | None = None
    ) -> bool:
        """Let request headers go on, with a reservation of ``work`` for their body of
        ``declared_bytes`` when it fits (rule 2), waiting at most ``wait_s``. False:
        refused, the ticket is unchanged."""
        now = _now()
        hold = self.hold_s(declared_bytes)
        if not (self._bodies or self._headers) and self.budget.fits_reserved(ticket, work, now):
            self.budget.reserve(ticket, work, now + hold, now)
            return True
        timeout = self.wait_s if wait_s is None else wait_s
        waiter = _Waiter(
            ticket,
            work,
            asyncio.get_running_loop().create_future(),
            since=now,
            hold_s=hold,
            patience_until=now + hold if hold < timeout else math.inf,
        )
        self._headers.append(waiter)
        self._wake(now)  # its hold may end before anything else happens: the timer
        return await self._wait(waiter, self._headers, timeout)

    async def _wait(
        self, waiter: _Waiter, queue: collections.deque[_Waiter] | list[_Waiter], timeout: float
    ) -> bool:
        try:
            await asyncio.wait_for(asyncio.shield(waiter.admitted), timeout)
        except TimeoutError:
            pass
        finally:
            # Timed out or cancelled (Envoy gave up on the stream): leave the queue,
            # and let the next in line in where this one did not fit. Admitted in
            # the meantime: the ticket holds its share; its owner releases it.
            if not waiter.admitted.done():
                queue.remove(waiter)
                waiter.admitted.cancel()
                self._wake()
        return not waiter.admitted.cancelled()

    def arrived(self, ticket: Ticket, work: int) -> bool:
        """The ticket's body came: its reservation gives way to ``work`` in flight,
        taken at once when it fits (rule 1). False: it does not, and the caller
        queues it with :meth:`admit` before anything else runs, ahead of the
        requests at their headers."""
        self.budget.unreserve(ticket)
        if work and self.must_wait(ticket, work):
            return False
        if work:
            self.budget.take(ticket, work)
        self._wake()  # the room its reservation held beyond its work
        return True

    def release(self, ticket: Ticket) -> None:
        self.budget.give_back(ticket)
        self._wake()

    def _wake(self, now: float | None = None) -> None:
        """Let in every waiter the rules admit now, and set the timer for the next
        moment that may admit one without a release."""
        budget = self.budget
        bodies = self._bodies
        while bodies and budget.fits(bodies[0].ticket, bodies[0].work):
            waiter = bodies.popleft()
            budget.take(waiter.ticket, waiter.work)
            waiter.admitted.set_result(None)
        if bodies or not self._headers:
            self._set_timer(math.inf)  # a release, not the time, lets them in
            return
        if now is None:
            now = _now()
        waiting: list[_Waiter] = []
        held_back = blocked = False  # a waiter ahead waits: for anything / for room in flight
        for waiter in self._headers:
            ticket, work = waiter.ticket, waiter.work
            # Past its hold, the reservations granted before it came count for
            # nothing to it, and it may pass waiters held back only by reservations.
            since = waiter.since if now >= waiter.patience_until else -math.inf
            if blocked:
                waiting.append(waiter)
            elif (not held_back or since > -math.inf) and budget.fits_reserved(
                ticket, work, now, since=since
            ):
                budget.reserve(ticket, work, now + waiter.hold_s, now, since=since)
                waiter.admitted.set_result(None)
            else:
                held_back = True
                blocked = not budget.fits(ticket, work)
                waiting.append(waiter)
        self._headers[:] = waiting
        if not waiting or not budget.fits(waiting[0].ticket, waiting[0].work):
            self._set_timer(math.inf)  # the first waits for room in flight: a release
            return
        budget.prune(now)
        upcoming = (w.patience_until for w in waiting if w.patience_until > now)
        self._set_timer(min(budget.next_expiry(), min(upcoming, default=math.inf)))

    def _set_timer(self, when: float) -> None:
        if self._timer is not None:
            if self._timer.when() == when:
                return
            self._timer.cancel()
            self._timer = None
        if when < math.inf:
            self._timer = asyncio.get_running_loop().call_at(when, self._on_timer, when)

    def _on_timer(self, when: float) -> None:
        self._timer = None
        # The loop may run a timer a hair early: it is for `when`.
        self._wake(max(_now(), when))


def _now() -> float:
    return asyncio.get_running_loop().time()
