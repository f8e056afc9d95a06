"""Give memory back to the OS after a very large request.

Parsing a multi-megabyte body (2,048 inputs, or a 25 MB response) makes glibc grow
its heaps; the memory is freed but stays mapped, so RSS ratchets up after the first
worst-case request and never comes down. ``malloc_trim(0)`` returns the free pages.

Before it, a full garbage collection: grpc.aio leaves every finished call in a small
reference cycle (its method-handler lookup: ``_HandlerCallDetails``, the metadata
and a closure), which keeps the call's native buffers, a multi-megabyte message
among them, alive until the cycle is collected; it survives into the oldest
generation, whose collections a process with a large long-lived heap (the
tokenizers) rarely runs (docs/envoy-facts.md, "The server process's memory").

The collection holds the interpreter lock while it scans the heap, so it runs only
after bodies above a threshold; the much cheaper trim also once the process is idle
again after a burst of smaller ones (:class:`IdleTrim`).

And at start, :func:`fix_mmap_threshold`: glibc serves allocations above its mmap
threshold from their own mappings, returned whole when freed, but starts that
threshold at 128 KiB and raises it to the size of each such mapping freed (up to 32
MiB): after the first multi-megabyte body, later ones come from the heap and
fragment it, beyond what a trim can return.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

TRIM_AFTER_BYTES = 4 * 1024 * 1024
MMAP_THRESHOLD_BYTES = 1024 * 1024
_M_MMAP_THRESHOLD = -3  # glibc <malloc.h>


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def fix_mmap_threshold() -> bool:
    """Serve allocations of MMAP_THRESHOLD_BYTES and more from their own mappings
    for the life of the process (setting the threshold ends glibc's adjustment), so
    that bodies past the first large one do not fragment the heap. A threshold the
    operator chose (``MALLOC_MMAP_THRESHOLD_``, the ``glibc.malloc.mmap_threshold``
    tunable) is left alone. False when nothing was set (not glibc, or the
    operator's)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "mmap_threshold" in os.environ.get(
        "GLIBC_TUNABLES", ""
    ):
        return False
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:  # not glibc (musl, macOS)
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    libc = _libc()
    trim: Callable[[int], int] | None = getattr(libc, "malloc_trim", None)
    return trim  # None: not glibc (musl, macOS), nothing to do


def release_after(body_bytes: int) -> None:
    """After a body of ``body_bytes``: collect, then trim, when it was a large one."""
    if body_bytes < TRIM_AFTER_BYTES:
        return
    gc.collect()  # earlier calls' cycles (module doc); this call's is still in use
    trim_heap()


def trim_heap() -> None:
    """Return free heap pages to the OS: after a burst of smaller bodies,
    whose calls' cycles hold little and go with the ordinary collections."""
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
