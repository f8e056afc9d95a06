"""Admission control: a per-process budget of work in flight, in bytes.

A request's work is its body, counted :data:`REQUEST_WORK_PER_BODY_BYTE` times
(:func:`request_work_bytes`), plus, when the gateway must rewrite or check the
answer, an estimate of the upstream's answer and of the client's (see
:func:`response_work_bytes`). The process's RSS follows that work (about three
times it above the idle size, measured), so bounding it bounds the memory.

Where the request headers reach the server, the body's share is reserved there,
from the declared Content-Length (the body limit when none is declared), before
Envoy sends the body; the body then settles it to its real size. Otherwise the
body is admitted when it arrives.

Invariant of :class:`Budget`: ``0 <= in_flight`` and ``in_flight <= capacity``
unless exactly one ticket is held. A request bigger than the whole budget is
therefore admitted alone, on an idle process, rather than never: every request
the policy's size caps accept can be served.

:class:`Budget` is pure bookkeeping (no clock, no I/O). :class:`AdmissionGate` is
its asyncio shell: requests that do not fit wait in arrival order, each for a
bounded time, then are refused; the caller answers them 503 ``overloaded``.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field

from extproc.core.errors import SERVER_ERROR, ApiError
from extproc.core.plan import Encoding, ResponsePlan

# Bytes per vector component as the upstream or the client sees it: base64 of a
# float32 is 16/3 bytes; a float32 written as JSON (`-0.012345678,`) about 12.
_BYTES_PER_VALUE = {Encoding.BASE64: 16 / 3, Encoding.FLOAT: 12.0}
_BYTES_PER_ITEM = 96  # `{"object":"embedding","index":N,"embedding":...}`


# The body's bytes, the parsed inputs and, for inputs long enough to be tokenized,
# their token ids and the rewritten body: an 8 MB body of 2,048 English inputs of
# 4,000 characters took the process ~90 MB above idle, 2 MB bodies 6-24 MB. Counted
# three times, a body weighs what its RSS does in the budget's unit of work (the
# answers' estimate below is of their bytes, whose RSS is about three times that).
REQUEST_WORK_PER_BODY_BYTE = 3


def request_work_bytes(body_bytes: int) -> int:
    """Work of a request body of ``body_bytes`` (declared or received)."""
    return body_bytes * REQUEST_WORK_PER_BODY_BYTE


def response_work_bytes(plan: ResponsePlan) -> int:
    """Bytes the response phase holds at once for this plan: the upstream's body and
    the client's, both alive while the answer is rewritten. 0 when the answer is
    left to stream past the gateway."""
    if not plan.needs_response:
        return 0
    items = plan.input_count
    upstream = items * (plan.native_dimensions * _BYTES_PER_VALUE[plan.upstream_encoding])
    client_dims = plan.dimensions or plan.native_dimensions
    client = items * (client_dims * _BYTES_PER_VALUE[plan.client_encoding])
    return int(upstream + client) + 2 * items * _BYTES_PER_ITEM


def overloaded_error(retry_after_s: int) -> ApiError:
    """The refused request's answer (sent with a ``Retry-After`` header)."""
    return ApiError(
        503,
        f"The gateway is at capacity; retry after {retry_after_s} s.",
        type=SERVER_ERROR,
        code="overloaded",
    )


@dataclass
class Ticket:
    """One request's share of the budget, held until the request is over."""

    cost: int = 0
    held: bool = False


@dataclass
class Budget:
    """Bytes of work in flight against a capacity (invariant in the module doc)."""

    capacity: int
    in_flight: int = 0
    holders: int = 0

    def fits(self, ticket: Ticket, extra: int) -> bool:
        """Can ``ticket`` (held or not) grow by ``extra`` bytes now?"""
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

    def settle(self, ticket: Ticket, cost: int) -> None:
        """Lower a held ticket to ``cost`` bytes (a reservation made from the request
        headers, settled to the body that came); the rest goes back. Never raises it:
        growing is :meth:`take`'s, which checks the capacity."""
        if ticket.held and 0 <= cost < ticket.cost:
            self.in_flight -= ticket.cost - cost
            ticket.cost = cost

    def give_back(self, ticket: Ticket) -> None:
        if not ticket.held:
            return
        self.in_flight -= ticket.cost
        self.holders -= 1
        ticket.cost, ticket.held = 0, False


@dataclass
class _Waiter:
    ticket: Ticket
    extra: int
    admitted: asyncio.Future[None]


@dataclass
class AdmissionGate:
    """The budget shared by every stream of one process, with a bounded, first-come
    first-served wait. Single event loop; not thread-safe."""

    budget: Budget
    wait_s: float
    _queue: collections.deque[_Waiter] = field(default_factory=collections.deque)

    @property
    def in_flight(self) -> int:
        return self.budget.in_flight

    def must_wait(self, ticket: Ticket, extra: int) -> bool:
        """Would :meth:`admit` queue this request rather than admit it at once?"""
        return bool(self._queue) or not self.budget.fits(ticket, extra)

    async def admit(self, ticket: Ticket, extra: int, *, wait_s: float | None = None) -> bool:
        """Add ``extra`` bytes to ``ticket``, waiting at most ``wait_s`` (default: the
        gate's) behind earlier requests. False: refused, the ticket is unchanged."""
        if not self.must_wait(ticket, extra):
            self.budget.take(ticket, extra)
            return True
        waiter = _Waiter(ticket, extra, asyncio.get_running_loop().create_future())
        self._queue.append(waiter)
        timeout = self.wait_s if wait_s is None else wait_s
        try:
            await asyncio.wait_for(asyncio.shield(waiter.admitted), timeout)
        except TimeoutError:
            pass
        finally:
            # Timed out or cancelled (Envoy gave up on the stream): leave the queue,
            # and let the next in line in where this one did not fit. Admitted in
            # the meantime: the ticket holds the bytes; its owner releases it.
            if not waiter.admitted.done():
                self._queue.remove(waiter)
                waiter.admitted.cancel()
                self._wake()
        return not waiter.admitted.cancelled()

    def settle(self, ticket: Ticket, cost: int) -> None:
        """:meth:`Budget.settle`, and let waiters into the room it leaves."""
        self.budget.settle(ticket, cost)
        self._wake()

    def release(self, ticket: Ticket) -> None:
        self.budget.give_back(ticket)
        self._wake()

    def _wake(self) -> None:
        while self._queue and self.budget.fits(self._queue[0].ticket, self._queue[0].extra):
            waiter = self._queue.popleft()
            self.budget.take(waiter.ticket, waiter.extra)
            waiter.admitted.set_result(None)
