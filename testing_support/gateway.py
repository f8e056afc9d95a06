"""The gateway as users run it, `extproc run` (ext_proc + the Envoy it starts), started
through the one process wrapper (testing_support/processes.py)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testing_support.http import Reply, http
from testing_support.processes import Process, free_port
from testing_support.qwen import REPO, SHIPPED_QWEN_POLICY, qwen_tokenizers

ENVOY_DIR = REPO / "envoy"
SHAPES = ("standalone", "single-filter")  # the two shipped Envoy shapes
READY_TIMEOUT_S = 90.0  # the tokenizer loads first
READY_PREFIX = "extproc ready:"
# The launcher's log line for each worker process it starts (extproc/runtime/worker_pool.py).
WORKER_STARTED = re.compile(r"worker (\d+) started \(pid (\d+), 127\.0\.0\.1:(\d+)\)")
EXTPROC = (sys.executable, "-m", "extproc")  # this checkout's command


@dataclass
class Gateway:
    """A running `extproc run`: its URLs, its process and its ready line."""

    url: str
    metrics_url: str
    process: Process
    ready_line: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def embeddings(self, body: bytes | dict[str, Any], **kwargs: Any) -> Reply:
        return http("POST", f"{self.url}/v1/embeddings", body, **kwargs)

    def metrics(self) -> str:
        """Its /metrics (every worker's, added up), as text."""
        return http("GET", f"{self.metrics_url}/metrics").body.decode()

    def log(self, since: int = 0) -> str:
        """Its log (``since``: from that offset, a :meth:`log_mark` taken before)."""
        return self.process.log(since)

    def log_mark(self) -> int:
        """Where its log ends now: what a shared gateway logs from here on is
        ``log(since=mark)``."""
        return self.process.log_mark()

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def admin_url(self) -> str:
        match = re.search(r"admin (127\.0\.0\.1:\d+)", self.ready_line)
        assert match, self.ready_line
        return f"http://{match.group(1)}"

    @property
    def envoy_pid(self) -> int:
        match = re.search(r"envoy pid (\d+)", self.ready_line)
        assert match, self.ready_line
        return int(match.group(1))

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

    def stop(self, timeout: float | None = None) -> int:
        return self.process.stop(timeout)

    def stop_cleanly(self) -> None:
        """Stop it: it must exit 0 and have logged no traceback."""
        self.process.stop_cleanly()


@dataclass(frozen=True)
class GatewaySpec:
    """What a gateway (`extproc run`: Envoy + ext_proc) is made of. Equal specs make the
    same gateway, so a spec is also the key under which a pool shares one.

    ``shape``: a shipped Envoy shape's name in envoy/ ("standalone", the launcher's
    default, or "single-filter") or an Envoy template file. ``policy``: a policy file,
    or policy text (written to ``policy.yaml`` beside the gateway's log); None is the
    launcher's default (the shipped Qwen3 policy). ``tokenizers``: the
    ``NAME=DIR,...`` overrides (default: the real Qwen3 tokenizer for QWEN_MODEL).
    ``legacy``: the split migration's legacy server (``--legacy``). ``args``: more
    `extproc run` options; ``env``: more environment variables."""

    upstream: str
    shape: str | Path = "standalone"
    policy: Path | str | None = SHIPPED_QWEN_POLICY
    tokenizers: str | None = field(default_factory=qwen_tokenizers)
    workers: int = 1
    legacy: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # set in the gateway's environment

    def argv(self, folder: Path) -> list[str]:
        """`extproc run`'s options for this gateway (listen and metrics ports aside);
        policy text is written into ``folder``."""
        argv = ["--upstream", self.upstream, "--workers", str(self.workers)]
        if self.shape != "standalone":
            template = (
                self.shape if isinstance(self.shape, Path) else ENVOY_DIR / f"{self.shape}.yaml"
            )
            argv += ["--envoy-template", str(template)]
        argv += policy_options(self.policy, folder)
        if self.legacy is not None:
            argv += ["--legacy", self.legacy]
        return [*argv, *self.args]


def policy_options(policy: Path | str | None, folder: Path) -> list[str]:
    """``--config`` for a policy file, or for policy text written to ``folder``."""
    if isinstance(policy, str):
        (folder / "policy.yaml").write_text(policy, encoding="utf-8")
        return ["--config", str(folder / "policy.yaml")]
    return [] if policy is None else ["--config", str(policy)]


def start_gateway(
    spec: GatewaySpec | str,
    log_dir: Path,
    *,
    config: Path | None = None,
    tokenizer_overrides: str | None = None,
    extra_args: Sequence[str] = (),
    workers: int = 1,
    grace_s: int = 5,
    extproc: Sequence[str] = EXTPROC,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    die_with_parent: bool = False,
    timeout: float = READY_TIMEOUT_S,
) -> Gateway:
    """``extproc run`` as ``spec`` says, logging into ``log_dir``; returns once it
        logged its ready line. ``extproc`` is the command to start it with (this
        checkout's by default), with ``env`` (default: this process's) from ``cwd``, ready
    within ``timeout`` s.

        An upstream URL in place of a spec, with ``config``, ``tokenizer_overrides``,
        ``extra_args`` and ``workers``, is the same gateway spelled as `extproc run`'s
        options (bench/ tools start theirs so)."""
    if isinstance(spec, str):
        spec = GatewaySpec(
            spec,
            policy=config,
            tokenizers=tokenizer_overrides,
            workers=workers,
            args=tuple(extra_args),
        )
    listen_port, metrics_port = free_port(), free_port()
    argv = [
        *extproc,
        "run",
        *("--listen", f"127.0.0.1:{listen_port}"),
        *("--metrics", f"127.0.0.1:{metrics_port}"),
        *("--grace", str(grace_s)),
        *spec.argv(log_dir),
    ]
    environment = dict(os.environ if env is None else env)
    if spec.tokenizers:
        environment["EXTPROC_TOKENIZER_OVERRIDES"] = spec.tokenizers
    environment.update(spec.env)
    process = Process.start(
        argv,
        log_dir / f"gateway-{listen_port}.log",
        env=environment,
        cwd=cwd,
        name="extproc run",
        die_with_parent=die_with_parent,
    )
    url, metrics_url = f"http://127.0.0.1:{listen_port}", f"http://127.0.0.1:{metrics_port}"
    gateway = Gateway(url, metrics_url, process)
    try:
        gateway.ready_line = process.wait_line(READY_PREFIX, timeout)
    except BaseException:
        process.stop()
        raise
    return gateway
