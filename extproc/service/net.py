"""Addresses and ports: the one parser of ``HOST:PORT`` and the one free-port finder.

Free of gRPC and Envoy imports, so commands and tools can use it without loading
the server.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path


def split_host_port(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port); an empty host means every
    interface (``0.0.0.0``). Raises ValueError for anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


# Ports this process has handed out: a port is given once, even when whoever took it
# has not bound it yet.
_handed_out: set[int] = set()
# Where to look when the kernel's ephemeral range cannot be read: Linux's default.
_DEFAULT_EPHEMERAL_LOW = 32768
_SPAN = 12000


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, not handed out before by this
    process, and below the kernel's ephemeral range. The ports the OS picks for
    ``bind(0)`` are the ones it also gives outgoing connections, so a port found that
    way can be taken by a client socket before its server binds it (seen: an Envoy
    that failed to bind while others started beside it)."""
    low = _ephemeral_low()
    start = max(1024, low - _SPAN)
    for _ in range(64):
        port = random.randrange(start, low)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    _handed_out.add(port)
    return port


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return max(int(text.split()[0]), 1024 + 1)
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW
