"""At most N requests in flight: a pool of N threads that sends a list of requests
and gives the answers back in the order asked (whatever order they arrive in).

The bound is the pool's, not a client's: requests to several servers through one pool
share it (learn keeps four in flight across both servers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

Sent = TypeVar("Sent")
Got = TypeVar("Got")


class RequestPool:
    """``max_in_flight`` threads named ``name``; :meth:`close` waits for them."""

    def __init__(self, max_in_flight: int, name: str) -> None:
        self.max_in_flight = max_in_flight
        self._pool = ThreadPoolExecutor(max_in_flight, thread_name_prefix=name)

    def send_all(self, send: Callable[[Sent], Got], requests: Iterable[Sent]) -> list[Got]:
        """``send`` each request on the pool's threads; the answers in the order asked
        (the first exception a ``send`` raised is raised here)."""
        futures = [self._pool.submit(send, request) for request in requests]
        return [future.result() for future in futures]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
