"""The ext_proc server in the test's own event loop (extproc.service.server.serve on a
free port of 127.0.0.1), for tests that drive it over gRPC without Envoy, and what they
read from its replies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from extproc.core.contract import Contract
from extproc.service.reload import ReloadSettings
from extproc.service.server import serve
from extproc.service.tls import TlsSettings
from tests.recorded_metrics import RecordedServerMetrics

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


@asynccontextmanager
async def serving(
    contract: Contract,
    metrics: RecordedServerMetrics,
    *,
    grace_seconds: float = 1.0,
    tls: TlsSettings | None = None,
    reload: ReloadSettings | None = None,
) -> AsyncIterator[int]:
    """The server's port while the block runs; stopped (``grace_seconds``) after it."""
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve(
            contract,
            address="127.0.0.1:0",
            metrics_address=None,
            grace_seconds=grace_seconds,
            stop=stop,
            metrics=metrics,
            on_ready=ready.set_result,
            tls=tls,
            reload=reload,
        )
    )
    waiters: set[asyncio.Future[Any]] = {task, ready}
    done, _ = await asyncio.wait(
        waiters, timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
    )
    if task in done:
        task.result()  # serve() failed: raise its error
    assert ready in done, f"the ext_proc server did not start within {START_TIMEOUT_S:.0f} s"
    try:
        yield ready.result()
    finally:
        stop.set()
        await asyncio.wait_for(task, STOP_TIMEOUT_S)


def set_headers(mutation: ep.HeaderMutation) -> dict[str, bytes]:
    """The headers a mutation sets (each with ``raw_value``, as Envoy needs)."""
    out: dict[str, bytes] = {}
    for option in mutation.set_headers:
        header = option.header
        assert header.value == "", f"{header.key} set with `value`; Envoy needs raw_value"
        out[header.key] = header.raw_value
    return out
