"""A worker's own side of `extproc run --workers N`: ``python -m
extproc.runtime.worker_process SERVE-ARGS...`` (:func:`main`) is `extproc serve
SERVE-ARGS` (:mod:`extproc.runtime.serve_command`) in this process made one of the
launcher's workers first.

A worker (started by extproc/runtime/worker_pool.py, never by hand) differs from a
plain `extproc serve` in three ways that only make sense under a launcher:

- it gets SIGTERM (and so drains) when the launcher dies, even by SIGKILL
  (``PR_SET_PDEATHSIG``), and exits at once if the launcher is already gone;
- SIGHUP is ignored until the server installs its own handler (the default action
  would end the process; the launcher delivers a SIGHUP that came meanwhile once the
  worker is ready);
- its log lines name it (``worker 2:``), since every worker logs to the launcher's
  output.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Mapping

from extproc.runtime.serve_command import add_serve_arguments, serve
from extproc.runtime.worker_pool import LAUNCHER_PID_ENV, LOG_LEVEL_ENV, WORKER_INDEX_ENV

_PR_SET_PDEATHSIG = 1


def die_with_launcher(launcher_pid: int) -> bool:
    """SIGTERM when the launcher dies; False if it already has (we were re-parented)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    return os.getppid() == launcher_pid


def become_worker(environ: Mapping[str, str] = os.environ) -> str | None:
    """Make this process the worker its environment (worker_pool.worker_env) names, and
    return the log level its server runs at; None when the launcher is already gone."""
    index = environ.get(WORKER_INDEX_ENV, "?")
    launcher = environ.get(LAUNCHER_PID_ENV)
    if launcher is not None and not die_with_launcher(int(launcher)):
        return None
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    level = environ.get(LOG_LEVEL_ENV, "info")
    # Configured before anything logs: the worker's own format, at the launcher's level.
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s worker {index}: %(name)s: %(message)s",
    )
    return level


def main(argv: list[str] | None = None) -> int:
    """Become the worker the environment names, then serve as `extproc serve` does with
    ``argv`` (default: this process's arguments); 1 when the launcher is already gone."""
    if become_worker() is None:
        return 1
    parser = argparse.ArgumentParser(prog="extproc serve")
    add_serve_arguments(parser)
    return serve(parser.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
