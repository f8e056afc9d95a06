"""Give memory back to the OS after a very large request.

Parsing a multi-megabyte body (2,048 inputs, or a 25 MB response) makes glibc grow
its heaps; the memory is freed but stays mapped, so RSS ratchets up after the first
worst-case request and never comes down. ``malloc_trim(0)`` returns the free pages.
It costs about a millisecond, so it runs only after bodies above a threshold, and
once the process is idle again after a burst of smaller ones (:class:`IdleTrim`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

TRIM_AFTER_BYTES = 4 * 1024 * 1024


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to do
        return None
    return trim


def release_after(body_bytes: int) -> None:
    if body_bytes < TRIM_AFTER_BYTES:
        return
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@dataclass
class IdleTrim:
    """Decides when to trim after a burst: many mid-size requests at once leave as
    much freed heap mapped as one huge body, but no single one crosses the per-body
    threshold. Due when no admitted work is left in flight and at least
    ``threshold`` bytes of work passed since the last trim."""

    threshold: int = TRIM_AFTER_BYTES
    pending: int = 0

    def note(self, work_bytes: int) -> None:
        self.pending += work_bytes

    def due(self, in_flight_bytes: int) -> bool:
        if in_flight_bytes > 0 or self.pending < self.threshold:
            return False
        self.pending = 0
        return True
