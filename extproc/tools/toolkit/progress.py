"""Progress: the one-line notes a tool prints while it works. They go to stderr, so
that stdout carries only the report, and are flushed at once (a tool's requests can
take minutes)."""

from __future__ import annotations

import sys
from collections.abc import Callable

Progress = Callable[[str], None]


def to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
