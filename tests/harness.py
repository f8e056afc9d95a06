"""Start and stop a real gateway (`extproc run`: ext_proc + Envoy) for tests,
and a small HTTP client. Loopback only; every wait is bounded; the gateway is
stopped by its own PID."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from extproc.service.net import free_port

READY_TIMEOUT_S = 90.0
# The launcher's log line for each worker process it starts (extproc/commands/workers.py).
WORKER_STARTED = re.compile(r"worker (\d+) started \(pid (\d+), 127\.0\.0\.1:(\d+)\)")


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


def http(
    method: str,
    url: str,
    body: bytes | dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> Reply:
    data = orjson.dumps(body) if isinstance(body, dict) else body
    all_headers = {"content-type": "application/json"} if data is not None else {}
    all_headers.update(headers or {})
    request = urllib.request.Request(url, data=data, method=method, headers=all_headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Reply(
                response.status,
                {k.lower(): v for k, v in response.headers.items()},
                response.read(),
            )
    except urllib.error.HTTPError as error:
        return Reply(error.code, {k.lower(): v for k, v in error.headers.items()}, error.read())


@dataclass
class Gateway:
    url: str
    metrics_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    ready_line: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def embeddings(self, body: bytes | dict[str, Any], **kwargs: Any) -> Reply:
        return http("POST", f"{self.url}/v1/embeddings", body, **kwargs)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def admin_url(self) -> str:
        match = re.search(r"admin (127\.0\.0\.1:\d+)", self.ready_line)
        assert match, self.ready_line
        return f"http://{match.group(1)}"

    @property
    def extproc_addresses(self) -> list[str]:
        """The ext_proc server's address, or each worker's, from the ready line."""
        match = re.search(r"ext_proc ([\d.:,]+)", self.ready_line)
        assert match, self.ready_line
        return [address for address in match.group(1).split(",") if address]

    def worker_pids(self) -> dict[int, int]:
        """Each worker's current PID (the last started), by its number (1..N)."""
        return {int(m[1]): int(m[2]) for m in WORKER_STARTED.finditer(self.log())}

    def streams_per_worker(self, stat: str = "rq_total") -> dict[str, int]:
        """Envoy's count of ext_proc streams sent to each address of its cluster
        (``rq_active``: those open now)."""
        text = http("GET", f"{self.admin_url}/clusters", timeout=5).body.decode()
        counts = {}
        for line in text.splitlines():
            name, _, rest = line.partition("::")
            address, _, value = rest.partition("::")
            if name == "extproc" and value.startswith(f"{stat}::"):
                counts[address] = int(value.rpartition("::")[2])
        return counts

    def stop(self, timeout: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return int(self.process.returncode)


def start_gateway(
    upstream_url: str,
    log_dir: Path,
    *,
    config: Path | None = None,
    tokenizer_overrides: str | None = None,
    extra_args: list[str] | None = None,
    extproc: Sequence[str] = (sys.executable, "-m", "extproc"),
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    workers: int = 1,
) -> Gateway:
    """``extproc run`` (``extproc`` is the command to start it with: this checkout's
    by default) with ``env`` (default: this process's) from ``cwd``. One ext_proc
    server process (in `extproc run`'s own) unless ``workers`` asks for more: the
    default would follow the machine's CPUs, and the suite starts many gateways."""
    listen_port, metrics_port = free_port(), free_port()
    argv = [
        *extproc,
        "run",
        "--upstream",
        upstream_url,
        "--listen",
        f"127.0.0.1:{listen_port}",
        "--metrics",
        f"127.0.0.1:{metrics_port}",
        "--grace",
        "5",
        "--workers",
        str(workers),
        *(["--config", str(config)] if config else []),
        *(extra_args or []),
    ]
    env = dict(os.environ if env is None else env)
    if tokenizer_overrides:
        env["EXTPROC_TOKENIZER_OVERRIDES"] = tokenizer_overrides
    log_path = log_dir / f"gateway-{listen_port}.log"
    log_file = log_path.open("wb")
    process = subprocess.Popen(
        argv, stdout=log_file, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL, cwd=cwd
    )
    log_file.close()
    gateway = Gateway(
        f"http://127.0.0.1:{listen_port}", f"http://127.0.0.1:{metrics_port}", process, log_path
    )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        for line in gateway.log().splitlines():
            if line.startswith("extproc ready:"):
                gateway.ready_line = line
                return gateway
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited with {process.returncode}:\n{gateway.log()}")
        time.sleep(0.1)
    gateway.stop()
    raise TimeoutError(f"gateway not ready in {READY_TIMEOUT_S} s:\n{gateway.log()}")


def metric_value(metrics_text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_part = head.partition("{")
        if metric != name:
            continue
        found = dict(
            item.split("=", 1) for item in label_part.rstrip("}").split(",") if "=" in item
        )
        if all(found.get(k, "").strip('"') == v for k, v in labels.items()):
            total += float(value)
    return total


def start_shipped_gateway(
    upstream_url: str,
    log_dir: Path,
    tokenizer_dir: Path,
    shape: str,
    extra_args: list[str] | None = None,
) -> Gateway:
    """`extproc run` with the shipped Qwen3 policy, the real Qwen3 tokenizer from
    ``tokenizer_dir`` and the shipped Envoy shape ``shape`` (a name in envoy/)."""
    from tests.conftest import QWEN_MODEL, REPO, SHIPPED_QWEN_POLICY

    return start_gateway(
        upstream_url,
        log_dir,
        config=SHIPPED_QWEN_POLICY,
        tokenizer_overrides=f"{QWEN_MODEL}={tokenizer_dir}",
        extra_args=[*(extra_args or []), "--envoy-template", str(REPO / "envoy" / f"{shape}.yaml")],
    )
