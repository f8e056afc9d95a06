"""How many CPUs this process may use: the default number of `extproc run` workers.

The smallest of the CPUs the scheduler lets the process run on
(``os.sched_getaffinity``) and the cgroup's CPU quota (v2 ``cpu.max``, v1
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), rounded down, at least 1. A container
limited to 1.5 CPUs on a 32-core host gets 1; a 1-CPU box gets 1.

:func:`usable_cpus` is pure (file contents in, a count out); :func:`cpus_available`
reads the files. The cgroup files are looked for under the process's own cgroup (the
path ``/proc/self/cgroup`` names), then at the mount's root: inside a container the
root is usually the container's own cgroup, while ``/proc/self/cgroup`` may name a
host path that does not exist there.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 mounts the cpu controller alone or together with cpuacct.
_V1_CPU_DIRS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


@dataclass(frozen=True)
class CgroupCpu:
    """The contents of the cgroup files that limit CPU (None: absent)."""

    cpu_max: str | None = None  # v2: "max 100000" or "<quota> <period>"
    cfs_quota_us: str | None = None  # v1: "-1" (no limit) or microseconds per period
    cfs_period_us: str | None = None  # v1: microseconds


def quota_cpus(files: CgroupCpu) -> float | None:
    """The CPUs a cgroup quota allows (may be fractional), or None without a quota
    (or with files that do not parse: no limit is assumed rather than a wrong one)."""
    if files.cpu_max is not None:
        parts = files.cpu_max.split()
        if len(parts) == 2 and parts[0] != "max":
            return _ratio(parts[0], parts[1])
        return None
    if files.cfs_quota_us is not None and files.cfs_period_us is not None:
        return _ratio(files.cfs_quota_us.strip(), files.cfs_period_us.strip())
    return None


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def usable_cpus(affinity: int, files: CgroupCpu) -> int:
    """min(CPUs allowed by affinity, the cgroup quota), rounded down, at least 1."""
    cpus = max(affinity, 1)
    quota = quota_cpus(files)
    if quota is not None:
        cpus = min(cpus, int(quota))
    return max(cpus, 1)


# -- reading the files ---------------------------------------------------------------


def cpus_available() -> int:
    """:func:`usable_cpus` for this process."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        affinity = os.cpu_count() or 1
    return usable_cpus(affinity, read_cgroup_cpu())


def read_cgroup_cpu(root: Path = CGROUP_ROOT, self_cgroup: str | None = None) -> CgroupCpu:
    """The cgroup CPU files of this process (v2 first), as text."""
    if self_cgroup is None:
        self_cgroup = _read(Path("/proc/self/cgroup")) or ""
    v2_path, v1_path = _cgroup_paths(self_cgroup)
    cpu_max = _first(root, [v2_path], "cpu.max")
    if cpu_max is not None:
        return CgroupCpu(cpu_max=cpu_max)
    for directory in _V1_CPU_DIRS:
        quota = _first(root / directory, [v1_path], "cpu.cfs_quota_us")
        if quota is not None:
            period = _first(root / directory, [v1_path], "cpu.cfs_period_us")
            return CgroupCpu(cfs_quota_us=quota, cfs_period_us=period)
    return CgroupCpu()


def _cgroup_paths(text: str) -> tuple[str, str]:
    """(v2 path, v1 cpu controller path) from /proc/self/cgroup ("" when absent)."""
    v2 = v1 = ""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _first(mount: Path, paths: list[str], name: str) -> str | None:
    """The file ``name`` under the cgroup ``path`` of ``mount``, else at its root."""
    for candidate in [*(mount / p.lstrip("/") / name for p in paths if p.strip("/")), mount / name]:
        text = _read(candidate)
        if text is not None:
            return text
    return None


def _read(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return path.read_text(encoding="ascii", errors="replace")
    return None
