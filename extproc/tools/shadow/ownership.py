"""Which replica owns a request id: rendezvous (highest-random-weight) hashing.

Envoy balances ext_proc streams per stream and cannot hash them onto endpoints,
so the baseline and candidate halves of one request may land on different
comparator replicas. Every replica knows the same peer list and its own address;
the owner of a request id is the peer with the highest ``hash(peer, id)``. When
a peer joins or leaves, only the ids it owns (about 1/N) move.

Peers are named ``HOST:PORT`` (the gRPC address other replicas reach it at); the
list is given statically (``a:50061,b:50061``) or as a DNS name resolved now and
then (``dns:NAME:PORT``: a Kubernetes headless Service gives one A record per
ready pod), with ``--self`` the replica's own ``POD_IP:PORT``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PeerSpec:
    static: tuple[str, ...] = ()
    dns_name: str | None = None
    dns_port: int = 0

    @property
    def is_dns(self) -> bool:
        return self.dns_name is not None


def parse_peers(text: str) -> PeerSpec:
    """``HOST:PORT,HOST:PORT`` or ``dns:NAME:PORT``; ``""`` means no peers (alone)."""
    text = text.strip()
    if not text:
        return PeerSpec()
    if text.startswith("dns:"):
        host, port = split_host_port(text.removeprefix("dns:"))
        if not host or host == "0.0.0.0":
            raise ValueError(f"{text!r}: expected dns:NAME:PORT")
        return PeerSpec(dns_name=host, dns_port=port)
    peers = []
    for raw in text.split(","):
        item = raw.strip()
        if item:
            split_host_port(item)  # validates
            peers.append(item)
    return PeerSpec(static=tuple(dict.fromkeys(peers)))


def split_host_port(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too); the same rules as ``extproc.service.server``'s, without
    importing the gRPC server for it."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def owner(request_id: str, peers: Sequence[str]) -> str:
    """The peer that owns ``request_id`` (``peers`` must not be empty)."""
    if not peers:
        raise ValueError("no peers")
    return max(peers, key=lambda peer: (_weight(peer, request_id), peer))


def _weight(peer: str, request_id: str) -> int:
    data = peer.encode() + b"\x00" + request_id.encode("utf-8", "replace")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")
