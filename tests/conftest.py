"""Shared fixtures: the real Qwen3 tokenizer, the shipped policy, the session's fake
upstreams, and (for the integration tier) the session's processes, started on demand
(tests/harness.py): gateways (real Envoy + ext_proc, `extproc run`), `extproc serve`
servers and bare Envoys."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from extproc.core.contract import Contract
from extproc.core.policy import GatewayPolicy
from extproc.service.contract_loading import load_contract
from extproc.service.policy_file import load_policy_file
from testing_support.fake_upstream import FakeUpstream
from testing_support.qwen import QWEN_MODEL, SHIPPED_QWEN_POLICY, qwen_tokenizer_dir
from tests.harness import Envoys, Gateways, Servers
from tests.legacy_stand_in import LegacyStandIn


@pytest.fixture(scope="session")
def qwen_dir() -> Path:
    return qwen_tokenizer_dir()


@pytest.fixture(scope="session")
def qwen_policy(qwen_dir: Path) -> GatewayPolicy:
    return load_policy_file(SHIPPED_QWEN_POLICY, tokenizer_overrides={QWEN_MODEL: qwen_dir})


@pytest.fixture(scope="session")
def qwen_contract(qwen_policy: GatewayPolicy) -> Contract:
    return load_contract(qwen_policy)


@pytest.fixture(scope="session")
def fake_dynamo(qwen_dir: Path) -> Iterator[FakeUpstream]:
    """The fake Dynamo 1.6.1 frontend of the whole session: the upstream of the
    shared gateways (``gateways.shared``)."""
    with FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir) as fake:
        yield fake


@pytest.fixture(scope="session")
def fake_vllm(qwen_dir: Path) -> Iterator[FakeUpstream]:
    """The fake plain vLLM 0.32 of the whole session."""
    with FakeUpstream(flavour="vllm", tokenizer_dir=qwen_dir) as fake:
        yield fake


@pytest.fixture(scope="session")
def legacy_stand_in() -> Iterator[LegacyStandIn]:
    """The session's stand-in for the legacy server of a split migration (``--legacy``)."""
    with LegacyStandIn() as stand_in:
        yield stand_in


@pytest.fixture(scope="module")
def upstream(fake_dynamo: FakeUpstream) -> FakeUpstream:
    """The session's fake Dynamo, as a module finds it: nothing received, no fault (a
    module that needs another upstream defines its own ``upstream`` fixture, which
    takes precedence)."""
    fake_dynamo.reset()
    return fake_dynamo


@pytest.fixture(scope="module")
def legacy(legacy_stand_in: LegacyStandIn) -> LegacyStandIn:
    """The session's legacy stand-in, as a module finds it: nothing seen."""
    legacy_stand_in.reset()
    return legacy_stand_in


@pytest.fixture(scope="session")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateways]:
    """Gateways (`extproc run`): ``shared(GatewaySpec)`` for the session, ``own(spec)``
    for one test or module (tests/harness.py)."""
    pool = Gateways(tmp_path_factory.mktemp("gateways"))
    yield pool
    pool.stop_all()


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """`extproc serve` servers: ``shared(ServeSpec)`` or ``own(spec)``."""
    pool = Servers(tmp_path_factory.mktemp("servers"))
    yield pool
    pool.stop_all()


@pytest.fixture(scope="session")
def envoys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Envoys]:
    """Bare Envoys: ``shared(EnvoySpec)`` or ``own(spec)``."""
    pool = Envoys(tmp_path_factory.mktemp("envoys"))
    yield pool
    pool.stop_all()


# -- running on several xdist workers (pyproject.toml: `-n 2`) -----------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "alone: timing-sensitive (latency, throughput or timeout bounds, admission waits, "
        "signals): no other test runs while it does",
    )


# What starts real engines (vLLM, Dynamo: ~2.4 GB each): the end-to-end tier, whose
# engines are session fixtures that must start once, and the installed wheel's
# default vLLM. One worker runs them all, one after the other.
REAL_ENGINES = ("tests/e2e/", "tests/test_wheel_install.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `alone` tests last, the order of the rest kept: an `alone` test waits for
    the test in progress on the other worker, and an end-to-end test (first out, on
    one worker) can take minutes. Everything else runs beside the end-to-end tier,
    the ordinary tests of a module that also has `alone` ones included, so that
    they never wait behind another worker's `alone` test."""
    items.sort(
        key=lambda item: (
            bool(item.get_closest_marker("alone")) and not item.nodeid.startswith(REAL_ENGINES)
        )
    )


class ModuleScheduling(LoadScopeScheduling):
    """Each run of one module's tests in collection order whole to one worker, so
    that its fixtures (its gateways) start once per run, and whatever starts real
    engines whole to one worker. A module with `alone` tests is two runs: its
    ordinary tests where the module stands, its `alone` ones at the end
    (pytest_collection_modifyitems). Runs go out in collection order: the
    end-to-end tier, the longest, first; the `alone` tests last."""

    _scopes: dict[str, str] | None = None

    def schedule(self) -> None:
        if self._scopes is None and self.collection_is_completed:
            self._scopes = runs_of_modules(next(iter(self.registered_collections.values())))
        super().schedule()

    def _split_scope(self, nodeid: str) -> str:
        assert self._scopes is not None, "scheduled before collection completed"
        return self._scopes[nodeid]


def module_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "real engines" if path.startswith(REAL_ENGINES) else path


def runs_of_modules(collection: list[str]) -> dict[str, str]:
    """Each test's scope: its module, and which of that module's runs (contiguous
    stretches of the collection) it is in."""
    scopes: dict[str, str] = {}
    runs: dict[str, int] = {}
    previous = None
    for nodeid in collection:
        module = module_of(nodeid)
        if module != previous:
            runs[module] = runs.get(module, 0) + 1
            previous = module
        scopes[nodeid] = f"{module} #{runs[module]}"
    return scopes


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> ModuleScheduling:
    config.option.loadscopereorder = False
    return ModuleScheduling(config, log)


class _Turns:
    """Who runs now, across the xdist workers of one run: any number of ordinary
    tests at once, or one `alone` test by itself. A file lock: shared for an ordinary
    test, exclusive for an `alone` one; an `alone` test that waits closes the gate,
    so that ordinary tests do not keep it waiting for ever."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._gate = (folder / "gate.lock").open("a")
        self._room = (folder / "room.lock").open("a")

    def close(self) -> None:
        """Done here: the other workers keep the lock files they opened."""
        self._gate.close()
        self._room.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    @contextlib.contextmanager
    def ordinary(self) -> Iterator[None]:
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        fcntl.flock(self._gate, fcntl.LOCK_UN)
        fcntl.flock(self._room, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(self._room, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._room, fcntl.LOCK_EX)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._room, fcntl.LOCK_UN)


_TURNS: list[_Turns] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Set-up, call and tear-down of each test (its module's fixtures included) in
    its turn; without xdist, every test is alone anyway."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        yield
        return
    if not _TURNS:
        folder = Path(tempfile.gettempdir()) / f"pytest-turns-{run}"
        folder.mkdir(exist_ok=True)
        _TURNS.append(_Turns(folder))
    turns = _TURNS[0]
    with turns.alone() if item.get_closest_marker("alone") else turns.ordinary():
        yield


def pytest_sessionfinish() -> None:
    while _TURNS:
        _TURNS.pop().close()
