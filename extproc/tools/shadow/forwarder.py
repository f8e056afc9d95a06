"""Route each half to its owner replica: into the local comparator, or to a peer.

Never blocks the tap: :meth:`HalfRouter.submit` is synchronous. Halves for a
peer wait in a bounded queue (full: dropped, counted ``queue_full``); one sender
task per peer sends them in batches with a deadline (failed: dropped, counted
``unreachable``), never retried. When the peer list changes, queued halves for
a peer that left are dropped (``peer_gone``); anything else that goes wrong while
sending is counted ``error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import grpc

from extproc.tools.shadow.comparator import Comparator
from extproc.tools.shadow.half import Half
from extproc.tools.shadow.ownership import owner
from extproc.tools.shadow.peer import PeerClient
from extproc.tools.shadow.v1 import shadow_pb2 as pb
from extproc.tools.shadow.wire import to_proto

log = logging.getLogger("extproc.tools.shadow.forwarder")

MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024


@dataclass(frozen=True)
class ForwardLimits:
    queue_size: int = 1000  # halves waiting per peer
    batch_size: int = 64
    batch_bytes: int = 16 * 1024 * 1024
    timeout_s: float = 2.0


class _PeerLink:
    def __init__(self, address: str, comparator: Comparator, limits: ForwardLimits) -> None:
        self.client = PeerClient(address, max_message_bytes=MAX_MESSAGE_BYTES)
        self.queue: asyncio.Queue[Half] = asyncio.Queue(maxsize=limits.queue_size)
        self._comparator = comparator
        self._limits = limits
        self.task = asyncio.create_task(self._run(), name=f"shadow-forward-{address}")

    def offer(self, half: Half) -> None:
        try:
            self.queue.put_nowait(half)
        except asyncio.QueueFull:
            self._comparator.forwarding("queue_full")

    async def _run(self) -> None:
        while True:
            batch = [await self.queue.get()]
            size = batch[0].nbytes
            while (
                len(batch) < self._limits.batch_size
                and size < self._limits.batch_bytes
                and not self.queue.empty()
            ):
                half = self.queue.get_nowait()
                batch.append(half)
                size += half.nbytes
            request = pb.ForwardRequest(halves=[to_proto(h) for h in batch])
            try:
                await self.client.forward(request, self._limits.timeout_s)
            except grpc.aio.AioRpcError as exc:
                log.debug("forward to %s failed: %s", self.client.address, exc.code().name)
                self._comparator.forwarding("unreachable", len(batch))
            except Exception as exc:  # a bug here must not stop this peer's sender
                log.error("forward to %s failed: %s", self.client.address, type(exc).__name__)
                self._comparator.forwarding("error", len(batch))
            else:
                self._comparator.forwarding("sent", len(batch))

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self._comparator.forwarding("peer_gone", self.queue.qsize())
        await self.client.close()


class HalfRouter:
    def __init__(
        self,
        comparator: Comparator,
        *,
        self_address: str,
        limits: ForwardLimits = ForwardLimits(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.comparator = comparator
        self.self_address = self_address
        self.limits = limits
        self._clock = clock
        self.peers: tuple[str, ...] = (self_address,)
        self._links: dict[str, _PeerLink] = {}

    async def set_peers(self, peers: Sequence[str]) -> None:
        """Adopt a new peer list (self is always in it); open/close links to match."""
        wanted = tuple(sorted({*peers, self.self_address}))
        if wanted == self.peers:
            return
        log.info("peer list: %s", ", ".join(wanted))
        self.peers = wanted
        self.comparator.metrics.peers.set(len(wanted))
        for address in [a for a in self._links if a not in wanted]:
            await self._links.pop(address).close()
        for address in wanted:
            if address != self.self_address and address not in self._links:
                self._links[address] = _PeerLink(address, self.comparator, self.limits)

    def submit(self, half: Half) -> None:
        target = owner(half.request_id, self.peers)
        if target == self.self_address:
            self.comparator.accept(half, self._clock(), source="tap")
        else:
            self._links[target].offer(half)

    def owns(self, request_id: str) -> bool:
        return owner(request_id, self.peers) == self.self_address

    async def close(self) -> None:
        for link in list(self._links.values()):
            await link.close()
        self._links.clear()

    async def peer_tallies_json(self, timeout_s: float) -> tuple[list[bytes], list[str]]:
        """Every other peer's tally JSON; and the peers that did not answer."""
        links = list(self._links.values())
        replies = await asyncio.gather(
            *(link.client.get_tally(timeout_s) for link in links), return_exceptions=True
        )
        tallies: list[bytes] = []
        missing: list[str] = []
        for link, reply in zip(links, replies, strict=True):
            if isinstance(reply, pb.GetTallyReply):
                tallies.append(reply.tally_json)
            else:
                missing.append(link.client.address)
        return tallies, missing
