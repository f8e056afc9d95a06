"""Where a run ran: the machine, the versions of the pieces, and the result file's head."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

from bench import wrk
from bench.procfs import loadavg
from bench.workloads import REPO
from extproc.runtime.envoy_process import envoy_binary


def _output(argv: list[str], timeout: float = 10, stderr: bool = False) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    return done.stderr if stderr else done.stdout


def versions() -> dict[str, str]:
    out: dict[str, str] = {"python": platform.python_version(), "wrk": wrk.version()}
    with contextlib.suppress(Exception):
        text = _output([envoy_binary(), "--version"], timeout=20)
        match = re.search(r"version: \S+/(\d+\.\d+\.\d+)", text)
        out["envoy"] = match.group(1) if match else text.strip()[:120]
    with contextlib.suppress(Exception):
        out["nginx"] = _output(["nginx", "-v"], stderr=True).strip().split("/")[-1]
    with contextlib.suppress(Exception):
        import grpc

        out["grpcio"] = grpc.__version__
    with contextlib.suppress(Exception):
        git = ["git", "-C", str(REPO)]
        rev = _output([*git, "rev-parse", "--short", "HEAD"]).strip()
        dirty = _output([*git, "status", "--porcelain", "--untracked-files=no"]).strip()
        out["repo"] = rev + ("+dirty" if dirty else "")
    return out


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "kernel": platform.release(),
        "loadavg_at_start": loadavg(),
    }


def utc_stamp(started_wall: float) -> str:
    """The run's start as a file name: 20260101T120000Z."""
    return dt.datetime.fromtimestamp(started_wall, dt.UTC).strftime("%Y%m%dT%H%M%SZ")


def result_head(started_wall: float) -> dict[str, Any]:
    """The first fields of a result file: schema, start time, machine, versions."""
    return {
        "schema": 1,
        "started_utc": dt.datetime.fromtimestamp(started_wall, dt.UTC).isoformat(),
        "machine": machine(),
        "versions": versions(),
    }
