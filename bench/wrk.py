"""The load generator: one wrk run, its summary, and the error capture.

Every run has a duration and a hard timeout. The measured runs use ``wrk_post.lua`` (one
body) or ``wrk_mix.lua`` (a rotating mix); neither defines a ``response()`` hook, which
would copy every response body into Lua. ``wrk_capture.lua`` adds that hook for a short
re-run after a cell saw errors, to record the exact statuses and bodies.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.workloads import HERE
from testing_support.processes import die_with_parent

SUMMARY_PREFIX = "BENCH_JSON "
CAPTURE_PREFIX = "CAPTURE_STATUS "


@dataclass(frozen=True)
class WrkRun:
    """wrk's summary line (BENCH_JSON, printed by the Lua done() hook) and its output."""

    summary: dict[str, Any]
    output: str
    pid: int

    @property
    def requests(self) -> int:
        return int(self.summary["requests"])

    @property
    def seconds(self) -> float:
        return float(self.summary["duration_us"]) / 1e6

    @property
    def req_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def errors(self) -> dict[str, int]:
        """connect, read, write, status (non-2xx/3xx) and timeout counts."""
        errors: dict[str, int] = self.summary["errors"]
        return errors

    @property
    def socket_errors(self) -> int:
        e = self.errors
        return e["connect"] + e["read"] + e["write"] + e["timeout"]

    def latency_ms(self) -> dict[str, float]:
        """p50_ms, p90_ms, p99_ms, max_ms: wrk's histogram (1 us resolution)."""
        latency = self.summary["latency_us"]
        return {f"{k}_ms": latency[k] / 1000 for k in ("p50", "p90", "p99", "max")}


def require() -> None:
    """Exit with status 2, saying how to install it, when wrk is missing."""
    if shutil.which("wrk") is None:
        print("wrk is not installed: run bench/setup.sh", file=sys.stderr)
        raise SystemExit(2)


def version() -> str:
    wrk = shutil.which("wrk")
    if not wrk:
        return ""
    out = subprocess.run([wrk, "-v"], capture_output=True, text=True, timeout=10, check=False)
    text = (out.stdout + out.stderr).strip()
    return text.splitlines()[0] if text else ""


def run_wrk(
    url: str,
    body_path: Path,
    *,
    connections: int,
    duration_s: float,
    timeout_s: int,
    script: str = "wrk_post.lua",
    extra_args: list[str] | None = None,
) -> WrkRun:
    """Run wrk once against ``url``/v1/embeddings; its Lua script gets body_path."""
    argv = [
        "wrk",
        "-t",
        str(min(connections, 2)),
        "-c",
        str(connections),
        "-d",
        f"{max(round(duration_s), 1)}s",  # wrk takes whole seconds
        "--timeout",
        f"{timeout_s}s",
        "-s",
        str(HERE / script),
        f"{url}/v1/embeddings",
        "--",
        str(body_path),
        *(extra_args or []),
    ]
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent,  # noqa: PLW1509 (no threads here)
    )
    try:
        out, _ = process.communicate(timeout=duration_s + timeout_s + 20)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate(timeout=10)
        raise RuntimeError(f"wrk did not finish: {' '.join(argv)}") from None
    text = out.decode(errors="replace")
    for line in text.splitlines():
        if line.startswith(SUMMARY_PREFIX):
            return WrkRun(json.loads(line[len(SUMMARY_PREFIX) :]), text, process.pid)
    raise RuntimeError(f"wrk printed no summary ({process.returncode}):\n{text}")


def capture_errors(
    url: str, body_path: Path, prefix: Path, *, connections: int, duration_s: float, timeout_s: int
) -> dict[str, Any]:
    """A short run with wrk_capture.lua: every status counted, the first non-200 answers
    (status and start of body) kept."""
    run = run_wrk(
        url,
        body_path,
        connections=connections,
        duration_s=duration_s,
        timeout_s=timeout_s,
        script="wrk_capture.lua",
        extra_args=[str(prefix)],
    )
    statuses: dict[str, int] = {}
    for line in run.output.splitlines():
        if line.startswith(CAPTURE_PREFIX):
            _, status, count = line.split()
            statuses[status] = statuses.get(status, 0) + int(count)
    samples = []
    for path in sorted(prefix.parent.glob(prefix.name + ".*")):
        for line in path.read_text(errors="replace").splitlines()[:5]:
            status, _, body = line.partition("\t")
            samples.append({"status": int(status), "body": body})
    return {"statuses": statuses, "wrk_errors": run.errors, "samples": samples[:10]}


def stop_children() -> None:
    """SIGTERM, by PID, any wrk that is still a child of this process (after an interrupt)."""
    me = os.getpid()
    with contextlib.suppress(OSError):
        children = Path(f"/proc/{me}/task/{me}/children").read_text().split()
        for pid in map(int, children):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "wrk":
                    os.kill(pid, signal.SIGTERM)
                    os.waitpid(pid, 0)
