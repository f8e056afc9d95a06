"""The server's allocator setting at start (extproc/service/memory.py): glibc's mmap
threshold is fixed, unless the operator chose one, in a fresh interpreter each time
(it is process-wide and lasts)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CODE = "from extproc.service.memory import fix_mmap_threshold; print(fix_mmap_threshold())"


def fixed(**env: str) -> str:
    clean = {
        k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")
    }
    result = subprocess.run(
        [sys.executable, "-c", CODE],
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_mmap_threshold_is_fixed_unless_the_operator_chose_one() -> None:
    assert fixed() == "True"
    assert fixed(MALLOC_MMAP_THRESHOLD_="65536") == "False"
    assert fixed(GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536") == "False"
    assert fixed(GLIBC_TUNABLES="glibc.malloc.arena_max=2") == "True"  # another tunable
