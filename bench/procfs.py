"""CPU time and memory of processes and of the machine, read from /proc (one process's
memory: testing_support.processes)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from testing_support.processes import memory_kb

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (field 3 is index 0); None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def cpu_ticks(pid: int) -> int:
    """utime + stime of the whole process (all threads), in clock ticks; 0 if gone."""
    fields = _stat_fields(pid)
    return int(fields[11]) + int(fields[12]) if fields else 0


def start_time(pid: int) -> str:
    """Field 22 of /proc/PID/stat: with the PID, names one process for its whole life."""
    fields = _stat_fields(pid)
    return fields[19] if fields else ""


def memory_kb_sum(pids: Iterable[int]) -> dict[str, int]:
    """VmRSS and VmHWM added up over processes (those gone count 0)."""
    total: dict[str, int] = {}
    for pid in pids:
        for key, value in memory_kb(pid).items():
            total[key] = total.get(key, 0) + value
    return total


def machine_busy_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks over all CPUs since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return total - idle, total


def children_ticks() -> int:
    """CPU of this process's reaped children (the wrk runs), in clock ticks."""
    usage = os.times()
    return round((usage.children_user + usage.children_system) * CLK_TCK)


def loadavg() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


@dataclass(frozen=True)
class CpuUsage:
    """CPU spent between a CpuMeter's start and stop, in clock ticks."""

    groups: dict[str, int]  # per watched group, plus "wrk": the children reaped meanwhile
    ours: int  # every process of this run, this one and wrk included
    machine_busy: int  # all CPUs
    machine_elapsed: int  # all CPUs, busy or not

    def cores(self, ticks: int) -> float:
        return ticks / max(self.machine_elapsed, 1) * (os.cpu_count() or 1)

    @property
    def others_cores(self) -> float:
        """What processes not started by this run used: the machine is shared."""
        return self.cores(max(self.machine_busy - self.ours, 0))

    def ms_per_request(self, requests: int) -> dict[str, float]:
        return {name: t * 1000 / CLK_TCK / max(requests, 1) for name, t in self.groups.items()}


class CpuMeter:
    """CPU of groups of processes, of all of ours and of the machine, around one wrk run.

    The wrk run must be the only child reaped between start() and stop(): its CPU is
    the difference of this process's children times.
    """

    def __init__(self, groups: dict[str, list[int]], ours: Iterable[int] = ()) -> None:
        self.groups = groups
        self.ours = {os.getpid(), *ours, *(p for pids in groups.values() for p in pids)}
        self._before = self._read()

    def _read(self) -> tuple[dict[str, int], int, int, int, int]:
        groups = {name: sum(cpu_ticks(p) for p in pids) for name, pids in self.groups.items()}
        ours = sum(cpu_ticks(p) for p in self.ours)
        busy, total = machine_busy_ticks()
        return groups, ours, busy, total, children_ticks()

    def stop(self) -> CpuUsage:
        groups, ours, busy, total, children = self._read()
        groups0, ours0, busy0, total0, children0 = self._before
        wrk = children - children0
        return CpuUsage(
            groups={**{k: groups[k] - groups0[k] for k in groups}, "wrk": wrk},
            ours=ours - ours0 + wrk,
            machine_busy=busy - busy0,
            machine_elapsed=total - total0,
        )
