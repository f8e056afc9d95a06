"""The pair store: halves wait here for their other half, bounded in time and size.

Rules:

1. Halves are keyed by request id. An entry is *complete* when it holds a
   baseline and a candidate half (and a noise half, when the store expects one);
   it then leaves the store at once, as a :class:`Completed`.
2. An entry older than ``ttl_s`` expires. If it holds a baseline and a candidate
   (only a missing noise half kept it), it completes without noise; otherwise
   each half in it is dropped with reason ``expired``.
3. When more than ``max_pending`` entries or ``max_bytes`` of halves are waiting,
   the oldest entries are dropped (reason ``evicted``) until both bounds hold.
4. A second half of the same role for a pending id is dropped (``duplicate``);
   a half for an id that completed recently is dropped (``late``): a client that
   reuses request ids, or a noise half the store was not told to expect.

Time is passed in (``now``, seconds on any monotonic clock): no clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from extproc.tools.shadow.half import Half, Role

DropReason: TypeAlias = Literal["expired", "evicted", "duplicate", "late"]


@dataclass(frozen=True)
class StoreLimits:
    ttl_s: float = 30.0
    max_pending: int = 10_000
    max_bytes: int = 1 << 30


@dataclass(frozen=True)
class Completed:
    baseline: Half
    candidate: Half
    noise: Half | None


@dataclass(frozen=True)
class Dropped:
    request_id: str
    role: Role
    reason: DropReason


@dataclass
class _Entry:
    deadline: float
    halves: dict[Role, Half] = field(default_factory=dict)
    nbytes: int = 0


class PairStore:
    def __init__(self, limits: StoreLimits = StoreLimits(), *, expect_noise: bool = False) -> None:
        if limits.ttl_s <= 0 or limits.max_pending < 1 or limits.max_bytes < 1:
            raise ValueError("store limits must be positive")
        self.limits = limits
        self.expect_noise = expect_noise
        self._pending: OrderedDict[str, _Entry] = OrderedDict()
        self._done: OrderedDict[str, None] = OrderedDict()  # recently completed ids
        self._bytes = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def pending_bytes(self) -> int:
        return self._bytes

    def add(self, half: Half, now: float) -> tuple[Completed | None, list[Dropped]]:
        key = half.request_id
        if key in self._done:
            return None, [Dropped(key, half.role, "late")]
        entry = self._pending.get(key)
        if entry is None:
            entry = _Entry(deadline=now + self.limits.ttl_s)
            self._pending[key] = entry
        elif half.role in entry.halves:
            return None, [Dropped(key, half.role, "duplicate")]
        entry.halves[half.role] = half
        entry.nbytes += half.nbytes
        self._bytes += half.nbytes
        if self._is_complete(entry):
            return self._complete(key), []
        return None, self._evict()

    def expire(self, now: float) -> tuple[list[Completed], list[Dropped]]:
        completed: list[Completed] = []
        dropped: list[Dropped] = []
        while self._pending:
            key, entry = next(iter(self._pending.items()))
            if entry.deadline > now:
                break
            if Role.BASELINE in entry.halves and Role.CANDIDATE in entry.halves:
                completed.append(self._complete(key))
            else:
                dropped.extend(self._drop(key, "expired"))
        return completed, dropped

    def _is_complete(self, entry: _Entry) -> bool:
        needed = {Role.BASELINE, Role.CANDIDATE}
        if self.expect_noise:
            needed.add(Role.NOISE)
        return needed <= entry.halves.keys()

    def _complete(self, key: str) -> Completed:
        entry = self._pending.pop(key)
        self._bytes -= entry.nbytes
        self._remember(key)
        return Completed(
            entry.halves[Role.BASELINE], entry.halves[Role.CANDIDATE], entry.halves.get(Role.NOISE)
        )

    def _evict(self) -> list[Dropped]:
        dropped: list[Dropped] = []
        while self._pending and (
            len(self._pending) > self.limits.max_pending or self._bytes > self.limits.max_bytes
        ):
            key = next(iter(self._pending))
            dropped.extend(self._drop(key, "evicted"))
        return dropped

    def _drop(self, key: str, reason: DropReason) -> list[Dropped]:
        entry = self._pending.pop(key)
        self._bytes -= entry.nbytes
        return [Dropped(key, role, reason) for role in entry.halves]

    def _remember(self, key: str) -> None:
        self._done[key] = None
        while len(self._done) > self.limits.max_pending:
            self._done.popitem(last=False)
