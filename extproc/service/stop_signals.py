"""How a long-running command learns it should stop: SIGTERM or SIGINT set an event.
Kept apart from the gRPC server so that a launcher can wait on it without grpc."""

from __future__ import annotations

import asyncio
import signal


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (call from inside the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop
