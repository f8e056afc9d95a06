"""`extproc serve`, the ext_proc server alone (Envoy runs elsewhere), started through the
one process wrapper (testing_support/processes.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testing_support.gateway import EXTPROC, policy_options
from testing_support.http import http
from testing_support.processes import Process, free_port, log_file
from testing_support.qwen import SHIPPED_QWEN_POLICY, qwen_tokenizers

READY_TIMEOUT_S = 90.0  # the tokenizer loads first
READY_LINE = "ext_proc serving on port"  # logged once its health service says SERVING


@dataclass(frozen=True)
class ServeSpec:
    """What an `extproc serve` is made of; equal specs make the same server (the key
    under which a pool shares one).

    ``policy``: a policy file, or policy text (written beside its log); None: the
    command's default. ``tokenizers``: ``NAME=DIR,...`` (``--tokenizer`` each; default:
    the real Qwen3 tokenizer). ``metrics``: serve /metrics on a port of its own.
    ``grace``: its ``--grace``. ``args``: more options."""

    policy: Path | str | None = SHIPPED_QWEN_POLICY
    tokenizers: str | None = field(default_factory=qwen_tokenizers)
    metrics: bool = False
    grace: float = 1
    args: tuple[str, ...] = ()

    def argv(self, folder: Path, port: int, metrics_port: int | None) -> list[str]:
        argv = ["serve", "--listen", f"127.0.0.1:{port}", "--grace", f"{self.grace:g}"]
        if metrics_port is not None:
            argv += ["--metrics", f"127.0.0.1:{metrics_port}"]
        argv += policy_options(self.policy, folder)
        for tokenizer in (self.tokenizers or "").split(","):
            if tokenizer:
                argv += ["--tokenizer", tokenizer]
        return [*argv, *self.args]


@dataclass
class Serve:
    """A running `extproc serve` on 127.0.0.1:``port``."""

    process: Process
    port: int
    metrics_port: int | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        assert self.metrics_port is not None, "started without metrics"
        return f"http://127.0.0.1:{self.metrics_port}"

    def metrics(self) -> str:
        """Its /metrics, as text."""
        return http("GET", f"{self.metrics_url}/metrics").body.decode()

    def ready(self) -> bool:
        return READY_LINE in self.process.log()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> float:
        """Until it serves; the seconds it took."""
        return self.process.wait_until(self.ready, timeout, "extproc serve serving")

    def log(self, since: int = 0) -> str:
        return self.process.log(since)

    def stop(self, timeout: float | None = None) -> int:
        return self.process.stop(timeout)

    def stop_cleanly(self) -> None:
        self.process.stop_cleanly()


def start_serve(
    spec: ServeSpec,
    folder: Path,
    *,
    port: int | None = None,
    wait: bool = True,
    extproc: Sequence[str] = EXTPROC,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    die_with_parent: bool = False,
    name: str = "",
) -> Serve:
    """`extproc serve` as ``spec`` says on ``port`` (default: a free one), logging into
    ``folder``; with ``wait``, returns once it serves (else call ``wait_ready``).
    ``extproc`` is the command to start it with (this checkout's by default), with
    ``env`` (default: this process's) from ``cwd``."""
    port = port or free_port()
    metrics_port = free_port() if spec.metrics else None
    process = Process.start(
        [*extproc, *spec.argv(folder, port, metrics_port)],
        log_file(folder, f"{name or 'extproc-serve'}-{port}"),
        env=env,
        cwd=cwd,
        name=name or "extproc serve",
        die_with_parent=die_with_parent,
    )
    serve = Serve(process, port, metrics_port)
    if wait:
        try:
            serve.wait_ready()
        except BaseException:
            process.stop()
            raise
    return serve
