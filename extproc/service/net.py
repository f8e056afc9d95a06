"""Addresses and ports: the one parser of ``HOST:PORT`` and the one free-port finder.

Free of gRPC and Envoy imports, so commands and tools can use it without loading
the server.
"""

from __future__ import annotations

import socket


def split_host_port(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port); an empty host means every
    interface (``0.0.0.0``). Raises ValueError for anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
