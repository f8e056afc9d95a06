"""A running Envoy seen through its admin interface: readiness and the listener's counters."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from testing_support.processes import Process

STAT_PREFIX = "http.embeddings."
MSGS_SENT = "ext_proc.stream_msgs_sent"


@dataclass
class Envoy:
    name: str
    process: Process  # Envoy's, or `extproc run`'s that started it
    port: int
    admin_port: int

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, int]:
        """Counters and gauges of the embeddings listener (ext_proc included)."""
        url = (
            f"http://127.0.0.1:{self.admin_port}/stats?format=json"
            f"&filter=^{re.escape(STAT_PREFIX)}(downstream_rq|ext_proc)"
        )
        with urllib.request.urlopen(url, timeout=5) as response:
            data = json.load(response)
        return {
            s["name"][len(STAT_PREFIX) :]: int(s["value"])
            for s in data.get("stats", [])
            if "value" in s
        }

    def is_ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.admin_port}/ready"
            with urllib.request.urlopen(url, timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout: float) -> None:
        self.process.wait_until(self.is_ready, timeout, f"Envoy {self.name} ready", 0.1)

    def wait_idle(self, timeout: float) -> None:
        """Until no downstream request is in flight (wrk may abandon some at its end)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.stats().get("downstream_rq_active", 0) == 0:
                return
            time.sleep(0.05)


@dataclass(frozen=True)
class StatsDelta:
    """How much each of an Envoy's counters moved over a measurement."""

    counters: dict[str, int]

    @classmethod
    def between(cls, before: dict[str, int], after: dict[str, int]) -> StatsDelta:
        return cls({k: after.get(k, 0) - before.get(k, 0) for k in after})

    @property
    def requests(self) -> int:
        """Requests Envoy counted, including those wrk abandoned at its end."""
        return self.counters.get("downstream_rq_total", 0)

    def msgs_per_request(self) -> float:
        return self.counters.get(MSGS_SENT, 0) / max(self.requests, 1)

    def response_codes(self) -> dict[str, int]:
        """{"2xx": n, ...}: the classes of the statuses Envoy answered, when non-zero."""
        return {
            k.removeprefix("downstream_rq_"): v
            for k, v in self.counters.items()
            if re.fullmatch(r"downstream_rq_[1-5]xx", k) and v
        }

    def ext_proc(self) -> dict[str, int]:
        return {
            k.removeprefix("ext_proc."): v
            for k, v in self.counters.items()
            if k.startswith("ext_proc.") and v
        }
