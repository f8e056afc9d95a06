"""``python -m extproc.commands.worker SERVE-ARGS...``: one worker of `extproc run
--workers N`, started by extproc/runtime/worker_pool.py, never by hand.

It is ``extproc serve SERVE-ARGS`` in a process made a worker of its launcher first
(extproc/runtime/worker_process.py: it dies with the launcher, holds SIGHUP until it
serves, and names itself in its log lines).
"""

from __future__ import annotations

import sys

from extproc.commands.cli import main as cli_main
from extproc.runtime.worker_process import become_worker


def main(argv: list[str] | None = None) -> int:
    serve_args = sys.argv[1:] if argv is None else argv
    level = become_worker()
    if level is None:
        return 1
    return cli_main(["--log-level", level, "serve", *serve_args])


if __name__ == "__main__":
    sys.exit(main())
