"""An embeddings client with a request budget: every request (POST or GET) is counted
against it first, and none is sent once it is spent.

A tool that must not overload a production server (learn asks a legacy server at most
``--budget`` questions) gives each server its own :class:`RequestBudget`; the clients of
one server share it, so a second client (learn's verification) spends from the same
count. How many requests are in flight at once is
:mod:`extproc.tools.toolkit.request_pool`'s to bound.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.runtime.blocking_http import HttpResult
from extproc.tools.toolkit.embeddings_client import DEFAULT_TIMEOUT_S, EmbeddingsClient


class BudgetSpentError(Exception):
    """A server's request budget is spent; the request was not sent."""


class RequestBudget:
    """At most ``limit`` requests to one server (``server`` names it in the error).
    Thread-safe: ``take`` counts one request or raises, never both."""

    def __init__(self, limit: int, server: str) -> None:
        self.limit = limit
        self.server = server
        self._spent = 0
        self._lock = threading.Lock()

    @property
    def spent(self) -> int:
        return self._spent

    def take(self) -> None:
        """Count one request (BudgetSpentError when none is left)."""
        with self._lock:
            if self._spent >= self.limit:
                raise BudgetSpentError(
                    f"the {self.server}'s budget of {self.limit} requests is spent"
                )
            self._spent += 1


class BudgetedClient(EmbeddingsClient):
    """An embeddings client whose every request is counted against ``budget`` first."""

    def __init__(
        self,
        url: str,
        budget: RequestBudget,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        headers: Mapping[str, str] | None = None,
        dialect: EmbeddingsDialect | None = None,
    ) -> None:
        super().__init__(url, timeout_s=timeout_s, headers=headers, dialect=dialect)
        self.budget = budget

    def post(self, body: bytes, content_type: str = "application/json") -> HttpResult:
        self.budget.take()
        return super().post(body, content_type)

    def get(self, path: str) -> HttpResult:
        self.budget.take()
        return super().get(path)
