"""The test session's processes, each started one way: the gateway (`extproc run`,
:class:`Gateways`), `extproc serve` (:class:`Servers`), a bare Envoy on a given
bootstrap (:class:`Envoys`), the shadow comparator (:func:`start_comparator`) and a
fake server in a process of its own (:func:`start_stand_in`), all through
testing_support (its one process wrapper, :class:`testing_support.processes.Process`,
for anything else a test runs).

A pool's ``shared(spec)`` starts the process of ``spec`` once and keeps it to the end
of the session, for every test that only reads from it (sends requests, reads metrics
as deltas): what it points at must live as long (a session fixture's). A test that
stops, signals, reloads or reconfigures its process takes ``own(spec)``, started for
it alone and stopped when it is done. Either way a process must stop with exit 0 and
no traceback in its log (``clean_exit=False`` for one the test kills on purpose)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from testing_support.envoy import Envoy, EnvoySpec, start_envoy
from testing_support.gateway import Gateway, GatewaySpec, start_gateway
from testing_support.http import http
from testing_support.processes import Process, free_port, log_file
from testing_support.qwen import REPO
from testing_support.serve import Serve, ServeSpec, start_serve

COMPARATOR_READY_S = 60.0
STAND_IN_READY = "stand-in ready:"  # tests/stand_in.py's line, then its URL
STAND_IN_READY_S = 60.0


class Running(Protocol):
    @property
    def process(self) -> Process: ...


SpecT = TypeVar("SpecT", bound=Hashable)
RunningT = TypeVar("RunningT", bound=Running)


class Pool(Generic[SpecT, RunningT]):
    """Processes of one kind, started on demand by ``start(spec, folder)``, each
    logging into a folder of its own under ``root``."""

    kind = "process"

    def __init__(self, root: Path, start: Callable[[SpecT, Path], RunningT]) -> None:
        self._root = root
        self._start = start
        self._shared: dict[SpecT, RunningT] = {}

    def _folder(self) -> Path:
        self._root.mkdir(parents=True, exist_ok=True)
        folder = self._root / f"{self.kind}-{len(list(self._root.iterdir()))}"
        folder.mkdir()
        return folder

    def shared(self, spec: SpecT) -> RunningT:
        if spec not in self._shared:
            self._shared[spec] = self._start(spec, self._folder())
        running = self._shared[spec]
        assert running.process.alive(), (
            f"a shared {self.kind} was stopped:\n{running.process.log()}"
        )
        return running

    @contextlib.contextmanager
    def own(
        self, spec: SpecT, *, folder: Path | None = None, clean_exit: bool = True
    ) -> Iterator[RunningT]:
        """One for the caller alone (logging into ``folder``, default: a new one)."""
        running = self._start(spec, folder or self._folder())
        try:
            yield running
        except BaseException:
            running.process.stop()
            raise
        if clean_exit:
            running.process.stop_cleanly()
        else:
            running.process.stop()

    def stop_all(self) -> None:
        shared, self._shared = list(self._shared.values()), {}
        for running in shared:
            running.process.stop_cleanly()


class Gateways(Pool[GatewaySpec, Gateway]):
    """`extproc run` gateways (the ``gateways`` fixture of tests/conftest.py)."""

    kind = "gateway"

    def __init__(self, root: Path) -> None:
        super().__init__(root, start_gateway)


class Servers(Pool[ServeSpec, Serve]):
    """`extproc serve` servers (the ``servers`` fixture)."""

    kind = "serve"

    def __init__(self, root: Path) -> None:
        super().__init__(root, start_serve)


class Envoys(Pool[EnvoySpec, Envoy]):
    """Bare Envoys on given bootstraps (the ``envoys`` fixture)."""

    kind = "envoy"

    def __init__(self, root: Path) -> None:
        super().__init__(root, start_envoy)


@contextlib.contextmanager
def start_stand_in(kind: str, tokenizer_dir: Path, folder: Path) -> Iterator[str]:
    """FakeLegacy (``legacy``) or the fake Dynamo (``dynamo``) in a process of its own
    (tests/stand_in.py), logging into ``folder``: its URL, while the block runs."""
    process = Process.start(
        [sys.executable, "-m", "tests.stand_in", kind, str(tokenizer_dir)],
        log_file(folder, f"stand-in-{kind}"),
        cwd=REPO,
        name=f"stand-in {kind}",
    )
    try:
        yield process.wait_line(STAND_IN_READY, STAND_IN_READY_S).split()[-1]
    except BaseException:
        process.stop()
        raise
    process.stop_cleanly()


@dataclass
class Comparator:
    """A running `extproc shadow-compare`: its gRPC port (the taps') and HTTP port."""

    process: Process
    grpc_port: int
    http_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def summary(self) -> dict[str, Any]:
        doc: dict[str, Any] = http("GET", f"{self.url}/summary", timeout=10).json()
        return doc

    def metrics(self) -> str:
        return http("GET", f"{self.url}/metrics", timeout=10).body.decode()


def start_comparator(folder: Path, *, extra: Sequence[str] = ()) -> Comparator:
    """`extproc shadow-compare` on free ports (pairs kept 20 s), logging into
    ``folder``; returns once it is ready. The caller stops its process."""
    grpc_port, http_port = free_port(), free_port()
    listen, http_address = f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}"
    options = ["--listen", listen, "--http", http_address, "--ttl", "20", "--grace", "1"]
    argv = [sys.executable, "-m", "extproc", "shadow-compare", *options, *extra]
    process = Process.start(argv, log_file(folder, f"compare-{grpc_port}"), name="shadow-compare")
    try:
        process.wait_line("shadow-compare ready", COMPARATOR_READY_S)
    except BaseException:
        process.stop()
        raise
    return Comparator(process, grpc_port, http_port)
