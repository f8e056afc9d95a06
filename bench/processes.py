"""Starting and stopping the processes of a run: every one on 127.0.0.1, started and
stopped by PID through testing_support's one process wrapper, each with
PR_SET_PDEATHSIG (it receives SIGTERM if this process dies); every wait is bounded.
"""

from __future__ import annotations

import contextlib
import signal
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from bench.workloads import POLICY, REPO
from testing_support.serve import Serve, ServeSpec, start_serve

READY_TIMEOUT_S = 120.0  # the ext_proc server loads the tokenizer first


def serve_spec(policy: Path = POLICY, grace_s: int = 2) -> ServeSpec:
    """`extproc serve` with the shipped Qwen3 policy (or ``policy``) and its tokenizer."""
    return ServeSpec(policy=policy, grace=grace_s)


def start_server(folder: Path, port: int, spec: ServeSpec, name: str) -> Serve:
    """`extproc serve` as ``spec`` says on 127.0.0.1:``port``, its log ``name-PORT.log``
    in ``folder``; it dies with this process. Not waited for (``wait_ready``)."""
    return start_serve(spec, folder, port=port, wait=False, die_with_parent=True, name=name)


@contextlib.contextmanager
def lone_server(port: int, env: Mapping[str, str] | None = None) -> Iterator[Serve]:
    """`extproc serve` on 127.0.0.1:``port`` with the shipped policy, its log in a
    temporary folder: for the tools that drive the server alone and watch its memory."""
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as folder:
        serve = start_serve(
            serve_spec(grace_s=1), Path(folder), port=port, wait=False, env=env, cwd=REPO
        )
        try:
            yield serve
        finally:
            serve.stop(15)


def _raise_interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt inside the block, so that cleanup runs."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
