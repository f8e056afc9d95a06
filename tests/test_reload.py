"""Live policy reload (extproc/service/reload.py).

Through a real Envoy and `extproc run` (tests/harness.py), in front of the fake
Dynamo, with one ext_proc process and with two workers (`--workers 2`: each worker
watches the file and gets SIGHUP, and reloads on its own, so every count and log line
comes once per worker): a model added to the watched file answers within 10 s; a broken file (bad
YAML, unknown field, unloadable tokenizer) is refused with one log line and the
running policy keeps answering; a Kubernetes ConfigMap symlink swap is picked up even
when the new file has the old one's size and mtime; a policy that needs larger Envoy
limits, or other precheck markers, is served but flagged; with --no-watch, SIGHUP
reloads. Hostile files: a file caught half-written is never served; a path that
leads to a FIFO, a device, a directory or nowhere is refused once, blocks nothing
(SIGHUP included) and keeps requests at their latency; a default instruction that
leaves no room for the input is refused at start and on reload. Each reload logs
what changed. In-process, over gRPC: a stream that started before a reload finishes
on the old policy. The decisions (when a file has settled) are tested as pure
functions.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
import pytest_asyncio
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from extproc.core.contract import Contract
from extproc.core.policy import load_policy_text
from extproc.runtime.envoy_config import (
    DEFAULT_TEMPLATE,
    load_template,
    rendered_precheck_markers,
    template_path,
)
from extproc.service.contract_loading import load_contract
from extproc.service.net import free_port
from extproc.service.policy_file import load_policy_file
from extproc.service.reload import (
    NOT_APPLIED_SETTINGS,
    Action,
    ContractHolder,
    EnvoyLimits,
    FileStamp,
    FixedAtStart,
    Now,
    PolicyReloader,
    ReloadSettings,
    WatchState,
    after_load,
    after_poll,
    after_race,
    policy_stamp,
)
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import Gateway, GatewaySpec
from testing_support.http import metric_value
from testing_support.qwen import QWEN_MODEL
from tests.ext_proc_server import serving
from tests.harness import Gateways
from tests.recorded_metrics import RecordedPolicyReloads, RecordedServerMetrics
from tests.test_policy_reading import NOT_REGULAR_FILES

ADDED = "qwen-added"  # a model name only the new files serve
RELOAD_DEADLINE_S = 10.0
STEP_TIMEOUT_S = 10.0


SWAPPED = "qwen-swapd"  # as long as ADDED: the swapped-in file keeps the old size


def policy_yaml(*names: str, limits: str = "") -> str:
    lines = [limits] if limits else []
    lines.append("models:")
    for name in names:
        lines += [
            f"  - name: {name}",
            "    preset: qwen3-embedding-0.6b",
            f"    upstream_model: {QWEN_MODEL}",
            "    max_tokens: 1024",
            "    encoding_profile: LEGACY",
            "    upstream_flavour: DYNAMO",
        ]
    return "\n".join(lines) + "\n"


def write_in_place(path: Path, text: str) -> None:
    """Same inode: a `kubectl cp` or an editor. Never blocks: a FIFO left behind by a
    failed test is an error here (ENXIO), not a writer waiting for a reader."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(text)


def reloads(gw: Gateway, outcome: str) -> float:
    return metric_value(gw.metrics(), "extproc_policy_reloads_total", outcome=outcome)


def workers(gw: Gateway) -> int:
    return len(gw.extproc_addresses)


def wait_for_count(gw: Gateway, outcome: str, before: float) -> None:
    """Until every worker has counted one more ``outcome`` reload than ``before``."""
    deadline = time.monotonic() + RELOAD_DEADLINE_S
    while reloads(gw, outcome) < before + workers(gw):
        assert time.monotonic() < deadline, f"no {outcome} reload within 10 s:\n{gw.log()}"
        time.sleep(0.1)
    assert reloads(gw, outcome) == before + workers(gw)


def reloaded_by(gw: Gateway, since: int) -> set[str]:
    """Who logged "policy reloaded" among the log's lines from ``since`` on: each
    worker names itself ("worker 2"); one process, "server"."""
    found = set()
    for line in gw.log().splitlines()[since:]:
        match = re.search(r" INFO (worker \d+: )?extproc\.service\.reload: policy reloaded", line)
        if match:
            found.add(match.group(1)[:-2] if match.group(1) else "server")
    return found


def everyone(gw: Gateway) -> set[str]:
    return {"server"} if workers(gw) == 1 else {f"worker {i}" for i in range(1, workers(gw) + 1)}


def embed(gw: Gateway, model: str) -> int:
    return gw.embeddings({"model": model, "input": "hello"}, timeout=30).status


def wait_until_answered(gw: Gateway, model: str, since: float) -> float:
    """Seconds from ``since`` until ``model`` gets a 200 (bounded)."""
    while (status := embed(gw, model)) != 200:
        assert status == 404, status
        assert time.monotonic() - since < RELOAD_DEADLINE_S, f"{model} not served:\n{gw.log()}"
        time.sleep(0.05)
    return time.monotonic() - since


def serve_file(gw: Gateway, path: Path, text: str) -> None:
    """Make ``text`` the running policy (written in place, waited for)."""
    if not path.is_file() or path.read_text() != text:
        count = reloads(gw, "reloaded")
        write_in_place(path, text)
        wait_for_count(gw, "reloaded", count)


def rejected_lines(gw: Gateway) -> list[str]:
    return [line for line in gw.log().splitlines() if "policy reload rejected" in line]


def not_applied(gw: Gateway) -> dict[str, float]:
    text = gw.metrics()
    return {
        setting: metric_value(text, "extproc_policy_settings_not_applied", setting=setting)
        for setting in NOT_APPLIED_SETTINGS
    }


def log_since(gw: Gateway, lines: int) -> list[str]:
    return gw.log().splitlines()[lines:]


class Traffic:
    """Requests sent one after another from a thread while the block runs: each
    one's status and seconds."""

    def __init__(self, gw: Gateway, body: dict[str, Any]) -> None:
        self.results: list[tuple[int, float]] = []
        self._gw, self._body = gw, body
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send, daemon=True)

    def _send(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            status = self._gw.embeddings(self._body, timeout=30).status
            self.results.append((status, time.monotonic() - started))

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive()

    @property
    def statuses(self) -> Counter[int]:
        return Counter(status for status, _ in self.results)

    @property
    def seconds(self) -> list[float]:
        return [took for _, took in self.results]


LONG_INSTRUCTION = "Given" + " word" * 1100  # ~1,100 Qwen3 tokens, over max_tokens 1024


def with_long_instruction(text: str) -> str:
    """``text`` with the over-long default instruction on its last model."""
    return text + f"    prompts: {{default_instruction: {LONG_INSTRUCTION}}}\n"


# -- decisions ---------------------------------------------------------------------------


SETTLE_S = 2.0
WALL_S = 1_000_000.0  # the wall clock when the monotonic one reads 0


def stamp(version: str, *, mtime_s: float = WALL_S - 60, problem: str | None = None) -> FileStamp:
    """A ConfigMap version's file, written ``mtime_s`` (wall clock; a minute before the
    polls by default)."""
    mtime_ns = int(mtime_s * 1e9)
    if problem is not None:
        return FileStamp(f"/cm/..{version}/policy.yaml", problem=problem)
    return FileStamp(f"/cm/..{version}/policy.yaml", 1, len(version), 300, mtime_ns, mtime_ns)


def at(t: float, *, wall_s: float | None = None) -> Now:
    return Now(t, int(((WALL_S + t) if wall_s is None else wall_s) * 1e9))


def poll(
    state: WatchState, seen: FileStamp, t: float, *, wall_s: float | None = None, watch: bool = True
) -> tuple[WatchState, Action]:
    return after_poll(state, seen, at(t, wall_s=wall_s), settle_s=SETTLE_S, watch=watch)


STAMP_A, STAMP_B = stamp("a"), stamp("b")
MISSING = stamp("gone", problem="does not exist")
FIFO = stamp("fifo", problem="resolves to a FIFO (/cm/..fifo/policy.yaml), not a regular file")


def test_a_change_is_loaded_once_it_has_held_still_for_the_settle_time() -> None:
    state = WatchState(loaded=STAMP_A, seen=STAMP_A)
    state, action = poll(state, STAMP_B, 1.0)
    assert action is Action.WAIT  # just seen: maybe still being written
    state, action = poll(state, STAMP_B, 2.9)
    assert action is Action.WAIT  # 1.9 s still: not yet
    state, action = poll(state, STAMP_B, 3.0)
    assert action is Action.LOAD
    state = after_load(state, STAMP_B, ok=True)
    assert poll(state, STAMP_B, 4.0) == (state, Action.WAIT)


def test_a_file_caught_half_written_is_never_loaded() -> None:
    """The attack: a prefix that parses, then the rest 1.5 s later (under the settle time)."""
    half = stamp("a", mtime_s=WALL_S + 0.9)
    whole = replace(half, size=600, mtime_ns=int((WALL_S + 2.4) * 1e9))
    state = WatchState(loaded=STAMP_A, seen=STAMP_A)
    actions = []
    for t, seen in ((1.0, half), (2.0, half), (3.0, whole), (4.0, whole), (5.0, whole)):
        state, action = poll(state, seen, t)
        actions.append(action)
    assert actions == [Action.WAIT] * 4 + [Action.LOAD]


def test_a_recent_mtime_holds_a_file_back_even_when_the_polls_saw_it_still() -> None:
    """The polls' clock and the file's disagree (the wall clock was stepped back): the
    mtime must be at least the settle time old as well."""
    fresh = stamp("b", mtime_s=WALL_S - 0.5)
    state, _ = poll(WatchState(loaded=STAMP_A), fresh, 0.0, wall_s=WALL_S)
    assert poll(state, fresh, 2.5, wall_s=WALL_S + 1.0)[1] is Action.WAIT  # mtime 1.5 s old
    assert poll(state, fresh, 3.5, wall_s=WALL_S + 2.0)[1] is Action.LOAD


def test_a_file_dated_in_the_future_is_judged_by_the_polls_alone() -> None:
    future = stamp("b", mtime_s=WALL_S + 3600)
    state, _ = poll(WatchState(loaded=STAMP_A), future, 0.0)
    assert poll(state, future, 2.0)[1] is Action.LOAD


def test_a_refused_file_is_not_tried_again_until_it_changes() -> None:
    state = after_load(WatchState(STAMP_A, STAMP_B, 0.0), STAMP_B, ok=False)
    assert poll(state, STAMP_B, 5.0)[1] is Action.WAIT
    state, _ = poll(state, STAMP_A, 6.0)  # restored: a change from what was refused
    assert state.loaded == STAMP_A and poll(state, STAMP_A, 9.0)[1] is Action.WAIT


def test_a_missing_file_is_tolerated_mid_swap_and_reported_once_it_stays() -> None:
    state = WatchState(loaded=STAMP_A, seen=STAMP_A)
    state, action = poll(state, MISSING, 1.0)
    state, action2 = poll(state, STAMP_A, 1.5)  # back within the settle time
    assert (action, action2) == (Action.WAIT, Action.WAIT)
    state, _ = poll(state, MISSING, 2.0)
    state, action = poll(state, MISSING, 4.0)
    assert action is Action.REFUSE
    state = after_load(state, MISSING, ok=False)
    assert poll(state, MISSING, 5.0)[1] is Action.WAIT  # once per distinct state
    state, _ = poll(state, FIFO, 6.0)
    assert poll(state, FIFO, 8.0)[1] is Action.REFUSE  # another state: reported too


def test_sighup_acts_as_soon_as_the_file_has_settled_whatever_was_loaded() -> None:
    state = WatchState(loaded=STAMP_A, seen=STAMP_A, seen_at=0.0, hangup=True)
    state, action = poll(state, STAMP_A, 5.0, watch=False)
    assert action is Action.LOAD  # the same file, read again now
    assert not after_load(state, STAMP_A, ok=True).hangup
    # A file changed moments ago: read once it has held still.
    state = WatchState(loaded=STAMP_A, seen=STAMP_B, seen_at=4.0, hangup=True)
    assert poll(state, STAMP_B, 5.0, watch=False)[1] is Action.WAIT
    assert poll(state, STAMP_B, 6.0, watch=False)[1] is Action.LOAD
    # A state already refused is refused again: SIGHUP always gets its answer.
    state = WatchState(loaded=STAMP_A, seen=FIFO, seen_at=0.0, refused=FIFO, hangup=True)
    assert poll(state, FIFO, 5.0)[1] is Action.REFUSE


def test_unwatched_the_polls_only_tell_when_the_file_settled() -> None:
    state, _ = poll(WatchState(loaded=STAMP_A, seen=STAMP_A), STAMP_B, 1.0, watch=False)
    assert poll(state, STAMP_B, 9.0, watch=False)[1] is Action.WAIT
    assert poll(replace(state, hangup=True), STAMP_B, 9.0, watch=False)[1] is Action.LOAD


def test_a_file_that_changed_while_read_must_settle_again() -> None:
    state = WatchState(loaded=STAMP_A, seen=STAMP_B, seen_at=0.0, hangup=True)
    state = after_race(state)
    assert state.hangup  # the SIGHUP still waits for it
    state, action = poll(state, STAMP_B, 5.0)
    assert action is Action.WAIT and state.seen_at == 5.0
    assert poll(state, STAMP_B, 7.0)[1] is Action.LOAD


@pytest.mark.parametrize("kind", NOT_REGULAR_FILES)
def test_the_stamp_of_what_is_no_regular_file_says_why_and_holds_still(
    tmp_path: Path, kind: str
) -> None:
    make, problem = NOT_REGULAR_FILES[kind]
    path = tmp_path / "policy.yaml"
    make(path)
    first = policy_stamp(path)
    assert first.problem is not None and problem in first.problem, first
    assert policy_stamp(path) == first


def test_what_a_reload_cannot_apply_is_named_per_setting(qwen_dir: Path) -> None:
    overrides = {QWEN_MODEL: qwen_dir}
    start = load_policy_text(policy_yaml(QWEN_MODEL), tokenizer_overrides=overrides)
    native = load_policy_text(
        policy_yaml(QWEN_MODEL) + "    upstream: {native: {dimensions: true}}\n",
        tokenizer_overrides=overrides,
    )
    standalone = load_template(DEFAULT_TEMPLATE)
    single = load_template(template_path("single-filter.yaml"))
    assert rendered_precheck_markers(standalone, start) == ("dimensions",)
    assert rendered_precheck_markers(standalone, native) == ()
    assert rendered_precheck_markers(single, start) is None  # no precheck to render
    run = FixedAtStart.for_policy(start, rendered_precheck_markers(standalone, start))
    assert run.not_applied(start) == {}
    (markers,) = run.not_applied(native).items()
    assert markers == (
        "precheck_markers",
        "precheck markers rendered into Envoy [dimensions], the policy needs [none]: "
        "a request naming them may cost one ext_proc message more",
    )
    assert FixedAtStart.for_policy(start, None).not_applied(native) == {}  # `serve`
    started_native = FixedAtStart.for_policy(native, ())
    assert (
        "take the second ext_proc stream" in started_native.not_applied(start)["precheck_markers"]
    )


def test_envoy_limits_name_each_one_a_policy_outgrows(qwen_dir: Path, tmp_path: Path) -> None:
    small = tmp_path / "small.yaml"
    small.write_text(policy_yaml(QWEN_MODEL))
    big = tmp_path / "big.yaml"
    big.write_text(policy_yaml(QWEN_MODEL, limits="limits: {max_request_bytes: 67108864}"))
    overrides = {QWEN_MODEL: qwen_dir}
    running = EnvoyLimits.for_policy(load_policy_file(small, tokenizer_overrides=overrides))
    needed = EnvoyLimits.for_policy(load_policy_file(big, tokenizer_overrides=overrides))
    short = running.shortfall_by_setting(needed)
    assert list(short) == ["request_body_buffer", "grpc_message"], short
    assert [s.rsplit(" ", 4)[0] for s in short.values()] == [
        "request body buffer",
        "gRPC message",
    ], short
    assert needed.shortfall_by_setting(running) == {}


def test_a_reload_reuses_unchanged_tokenizers_and_loads_replaced_ones(
    qwen_dir: Path, tmp_path: Path
) -> None:
    tokenizer_dir = tmp_path / "tokenizer"
    tokenizer_dir.mkdir()
    shutil.copy(qwen_dir / "tokenizer.json", tokenizer_dir)
    config = tmp_path / "policy.yaml"
    config.write_text(policy_yaml(QWEN_MODEL))
    overrides = {QWEN_MODEL: tokenizer_dir}  # also the hf_id of ADDED's preset

    def load(reuse: Contract | None) -> Contract:
        return load_contract(load_policy_file(config, tokenizer_overrides=overrides), reuse=reuse)

    first = load(None)
    config.write_text(policy_yaml(QWEN_MODEL, ADDED))
    second = load(first)
    assert second.tokenizers[QWEN_MODEL] is first.tokenizers[QWEN_MODEL]
    assert second.tokenizers[ADDED] is first.tokenizers[QWEN_MODEL]
    # A new tokenizer.json renamed over the old one (same path, same bytes): loaded again.
    shutil.copy(tokenizer_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    os.replace(tmp_path / "tokenizer.json", tokenizer_dir / "tokenizer.json")
    third = load(second)
    assert third.tokenizers[QWEN_MODEL] is not second.tokenizers[QWEN_MODEL]
    assert third.tokenizers[ADDED] is third.tokenizers[QWEN_MODEL]


# -- what the reloader reports (in-process) -----------------------------------------------


async def test_the_reloader_reports_each_reload_and_what_it_cannot_apply(
    qwen_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text(policy_yaml(QWEN_MODEL))
    overrides = {QWEN_MODEL: qwen_dir}
    start = load_contract(load_policy_file(config, tokenizer_overrides=overrides))
    fixed = FixedAtStart.for_policy(start.policy, None)
    metrics = RecordedPolicyReloads()
    reloader = PolicyReloader(
        ReloadSettings(config, overrides), ContractHolder(start), fixed, metrics
    )
    applied = [("setting_not_applied", setting, False) for setting in NOT_APPLIED_SETTINGS]
    assert metrics.events == [("envoy_limits_stale", False), *applied]

    metrics.events.clear()
    config.write_text(policy_yaml(QWEN_MODEL, limits="limits: {max_request_bytes: 67108864}"))
    assert await reloader.reload(policy_stamp(config))
    assert metrics.events == [
        ("setting_not_applied", "request_body_buffer", True),
        ("setting_not_applied", "response_buffer", False),
        ("setting_not_applied", "grpc_message", True),
        ("setting_not_applied", "precheck_markers", False),
        ("envoy_limits_stale", True),
        ("reloaded",),
    ]

    metrics.events.clear()
    config.write_text("models: [")
    assert not await reloader.reload(policy_stamp(config))
    assert metrics.events == [("rejected",)]

    metrics.events.clear()
    config.write_text(policy_yaml(QWEN_MODEL))
    assert await reloader.reload(policy_stamp(config))
    assert metrics.events == [*applied, ("envoy_limits_stale", False), ("reloaded",)]


# -- a stream in flight keeps its policy (in-process, over gRPC) --------------------------


@dataclass
class ReloadingServer:
    channel: grpc.aio.Channel
    config: Path
    metrics: RecordedServerMetrics

    def reloads(self) -> int:
        return len(self.metrics.policy_reloads.named("reloaded"))


@pytest_asyncio.fixture(loop_scope="function")
async def reloading_server(qwen_dir: Path, tmp_path: Path) -> AsyncIterator[ReloadingServer]:
    config = tmp_path / "policy.yaml"
    config.write_text(policy_yaml(QWEN_MODEL))
    overrides = {QWEN_MODEL: qwen_dir}
    started_from = policy_stamp(config)
    contract = load_contract(load_policy_file(config, tokenizer_overrides=overrides))
    metrics = RecordedServerMetrics()
    reload = ReloadSettings(
        config, overrides, interval_s=0.1, settle_s=0.3, started_from=started_from
    )
    async with serving(contract, metrics, reload=reload) as port:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            yield ReloadingServer(channel, config, metrics)
        finally:
            await channel.close()


def _headers() -> ep.ProcessingRequest:
    message = ep.ProcessingRequest()
    message.request_headers.headers.headers.add(key=":method", raw_value=b"POST")
    message.request_headers.headers.headers.add(key="content-type", raw_value=b"application/json")
    return message


def _body(model: str) -> ep.ProcessingRequest:
    message = ep.ProcessingRequest()
    message.request_body.body = orjson.dumps({"model": model, "input": "hello"})
    message.request_body.end_of_stream = True
    return message


async def _exchange(call: Any, message: ep.ProcessingRequest) -> ep.ProcessingResponse:
    await asyncio.wait_for(call.write(message), STEP_TIMEOUT_S)
    reply = await asyncio.wait_for(call.read(), STEP_TIMEOUT_S)
    assert reply is not grpc.aio.EOF
    return reply


async def _answer_to(channel: grpc.aio.Channel, model: str) -> str | None:
    """'request_body' when the request is forwarded, else the gateway's own status."""
    call = ep_grpc.ExternalProcessorStub(channel).Process(timeout=30)
    try:
        await _exchange(call, _headers())
        reply = await _exchange(call, _body(model))
    finally:
        call.cancel()
    if reply.WhichOneof("response") == "immediate_response":
        return str(reply.immediate_response.status.code)
    return reply.WhichOneof("response")


async def test_a_stream_in_flight_finishes_on_the_policy_it_started_with(
    reloading_server: ReloadingServer,
) -> None:
    channel, config = reloading_server.channel, reloading_server.config
    in_flight = ep_grpc.ExternalProcessorStub(channel).Process(timeout=30)
    try:
        await _exchange(in_flight, _headers())  # the stream exists: it has its contract
        before = reloading_server.reloads()
        write_in_place(config, policy_yaml(ADDED))  # the old model is gone from the file
        deadline = time.monotonic() + RELOAD_DEADLINE_S
        while reloading_server.reloads() <= before:
            assert time.monotonic() < deadline, "no reload within 10 s"
            await asyncio.sleep(0.05)
        reply = await _exchange(in_flight, _body(QWEN_MODEL))
        assert reply.WhichOneof("response") == "request_body", reply  # forwarded, old rules
    finally:
        in_flight.cancel()
    assert await _answer_to(channel, QWEN_MODEL) == "404"  # new streams: the new policy
    assert await _answer_to(channel, ADDED) == "request_body"


# -- through a real Envoy ------------------------------------------------------------------


class ConfigMapVolume:
    """A Kubernetes ConfigMap volume: ``policy.yaml -> ..data/policy.yaml``, ``..data ->
    ..<version>``; an update writes a new version directory and re-points ``..data``
    atomically (a rename), then deletes the old one."""

    def __init__(self, root: Path, text: str) -> None:
        self.root = root
        self.version = 0
        self._write_version(text)
        (root / "..data").symlink_to(self._version_dir().name)
        (root / "policy.yaml").symlink_to("..data/policy.yaml")

    @property
    def path(self) -> Path:
        return self.root / "policy.yaml"

    def _version_dir(self) -> Path:
        return self.root / f"..2026_12_01_{self.version:02d}"

    def _write_version(self, text: str) -> None:
        directory = self._version_dir()
        directory.mkdir()
        (directory / "policy.yaml").write_text(text, encoding="utf-8")

    def update(self, text: str, *, mtime_ns: int | None = None) -> None:
        def write(path: Path) -> None:
            path.write_text(text, encoding="utf-8")
            if mtime_ns is not None:
                os.utime(path, ns=(mtime_ns, mtime_ns))

        self.update_entry(write)

    def update_entry(self, make: Callable[[Path], object]) -> None:
        """A new version whose ``policy.yaml`` is what ``make`` puts at that path (a
        file, a FIFO, a symlink...), swapped in as the kubelet does."""
        old = self._version_dir()
        self.version += 1
        self._version_dir().mkdir()
        make(self._version_dir() / "policy.yaml")
        (self.root / "..data_tmp").symlink_to(self._version_dir().name)
        os.replace(self.root / "..data_tmp", self.root / "..data")
        shutil.rmtree(old)


# The watch is the same code in every ext_proc process: a test runs with two workers
# (`--workers 2`: each worker reloads on its own, and the test also checks that every
# worker did, once, with one line each) where what it checks concerns the workers, and
# once with the single in-process server otherwise.
ONE_SERVER = pytest.mark.parametrize("watched", [1], ids=["1-worker"], indirect=True)
EVERY_WORKER = pytest.mark.parametrize("watched", [2], ids=["2-workers"], indirect=True)


@pytest.fixture(scope="module", params=[1, 2], ids=["1-worker", "2-workers"])
def watched(
    request: pytest.FixtureRequest,
    upstream: FakeUpstream,
    gateways: Gateways,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Gateway, ConfigMapVolume]]:
    root = tmp_path_factory.mktemp("configmap")
    volume = ConfigMapVolume(root, policy_yaml(QWEN_MODEL))
    with gateways.own(GatewaySpec(upstream.url, policy=volume.path, workers=request.param)) as gw:
        yield gw, volume


def test_a_model_added_to_the_file_answers_within_10_seconds(
    watched: tuple[Gateway, ConfigMapVolume],
) -> None:
    gw, volume = watched
    assert embed(gw, ADDED) == 404
    before, lines = reloads(gw, "reloaded"), len(gw.log().splitlines())
    written = time.monotonic()
    write_in_place(volume.path, policy_yaml(QWEN_MODEL, ADDED))
    latency = wait_until_answered(gw, ADDED, written)
    print(f"reload latency (file written -> new model answers): {latency:.2f} s")
    wait_for_count(gw, "reloaded", before)  # every worker reloaded it, once
    assert reloaded_by(gw, lines) == everyone(gw)
    for _ in range(4 * workers(gw)):
        assert embed(gw, ADDED) == 200 and embed(gw, QWEN_MODEL) == 200


@pytest.mark.parametrize(
    ("watched", "text", "field", "reason"),
    [
        (2, "models: [\n", "<yaml>", "expected the node content"),
        (1, policy_yaml(QWEN_MODEL) + "    colour: red\n", "models[0]", '"colour"'),
        # A tokenizer.json that exists but does not parse: found only by loading it.
        (
            1,
            policy_yaml(QWEN_MODEL, "qwen-bad") + "    tokenizer: {path: BAD_DIR}\n",
            "tokenizer",
            "cannot be loaded",
        ),
    ],
    ids=["2-workers-bad-yaml", "1-worker-unknown-field", "1-worker-unloadable-tokenizer"],
    indirect=["watched"],
)
def test_a_broken_file_is_refused_and_the_running_policy_keeps_answering(
    watched: tuple[Gateway, ConfigMapVolume], text: str, field: str, reason: str
) -> None:
    gw, volume = watched
    bad_dir = volume.root.parent / "bad-tokenizer"
    bad_dir.mkdir(exist_ok=True)
    (bad_dir / "tokenizer.json").write_text("{bad", encoding="utf-8")
    serve_file(gw, volume.path, policy_yaml(QWEN_MODEL, ADDED))
    rejected, lines = reloads(gw, "rejected"), len(rejected_lines(gw))
    write_in_place(volume.path, text.replace("BAD_DIR", str(bad_dir)))
    wait_for_count(gw, "rejected", rejected)
    assert embed(gw, ADDED) == 200 and embed(gw, QWEN_MODEL) == 200
    time.sleep(2.5)  # more polls of the same broken file: no second line, no second count
    new_lines = rejected_lines(gw)[lines:]
    assert len(new_lines) == workers(gw), new_lines  # one per worker
    for line in new_lines:
        assert f"{volume.path}: {field}: " in line and reason in line, line
    assert reloads(gw, "rejected") == rejected + workers(gw)


@ONE_SERVER
def test_a_configmap_swap_is_seen_even_with_the_same_size_and_mtime(
    watched: tuple[Gateway, ConfigMapVolume],
) -> None:
    gw, volume = watched
    serve_file(gw, volume.path, policy_yaml(QWEN_MODEL, ADDED))
    old = volume.path.stat()
    swapped = policy_yaml(QWEN_MODEL, SWAPPED)
    assert len(swapped.encode()) == old.st_size  # only the inode and target tell
    before = reloads(gw, "reloaded")
    written = time.monotonic()
    volume.update(swapped, mtime_ns=old.st_mtime_ns)
    assert volume.path.stat().st_mtime_ns == old.st_mtime_ns
    latency = wait_until_answered(gw, SWAPPED, written)
    print(f"reload latency (ConfigMap swap -> new model answers): {latency:.2f} s")
    wait_for_count(gw, "reloaded", before)
    for _ in range(2 * workers(gw)):
        assert embed(gw, ADDED) == 404  # the swapped-in file no longer has it


@EVERY_WORKER
def test_a_policy_needing_larger_envoy_limits_is_flagged(
    watched: tuple[Gateway, ConfigMapVolume],
) -> None:
    gw, volume = watched
    count = reloads(gw, "reloaded")
    volume.update(policy_yaml(QWEN_MODEL, limits="limits: {max_request_bytes: 67108864}"))
    wait_for_count(gw, "reloaded", count)
    assert metric_value(gw.metrics(), "extproc_policy_envoy_limits_stale") == 1
    assert not_applied(gw) == {
        "request_body_buffer": 1,
        "response_buffer": 0,
        "grpc_message": 1,
        "precheck_markers": 0,
    }
    warnings = [line for line in gw.log().splitlines() if "needs larger limits" in line]
    assert len(warnings) == workers(gw), warnings
    for warning in warnings:
        assert "request body buffer 67108864 bytes > 8388608" in warning, warning
    volume.update(policy_yaml(QWEN_MODEL))
    wait_for_count(gw, "reloaded", count + workers(gw))
    assert metric_value(gw.metrics(), "extproc_policy_envoy_limits_stale") == 0
    assert set(not_applied(gw).values()) == {0}


def unwatched(upstream: FakeUpstream, tmp_path: Path, worker_count: int = 1) -> GatewaySpec:
    """`extproc run --no-watch` on a policy file of its own (QWEN_MODEL only)."""
    config = tmp_path / "policy.yaml"
    config.write_text(policy_yaml(QWEN_MODEL))
    return GatewaySpec(upstream.url, policy=config, workers=worker_count, args=("--no-watch",))


@pytest.mark.parametrize("worker_count", [1, 2], ids=["1-worker", "2-workers"])
def test_sighup_reloads_an_unwatched_file(
    upstream: FakeUpstream, gateways: Gateways, tmp_path: Path, worker_count: int
) -> None:
    spec = unwatched(upstream, tmp_path, worker_count)
    config = spec.policy
    assert isinstance(config, Path)
    with gateways.own(spec) as gw:
        write_in_place(config, policy_yaml(QWEN_MODEL, ADDED))
        time.sleep(2.5)  # the watch would have loaded it by now
        assert embed(gw, ADDED) == 404
        assert reloads(gw, "reloaded") == 0
        sent = time.monotonic()
        gw.process.signal(signal.SIGHUP)  # to `extproc run`: it reaches every worker
        latency = wait_until_answered(gw, ADDED, sent)
        print(f"reload latency (SIGHUP -> new model answers): {latency:.2f} s")
        wait_for_count(gw, "reloaded", 0)
        assert gw.log().count("SIGHUP: reloading") == worker_count
        assert reloaded_by(gw, 0) == everyone(gw)
        for _ in range(4 * worker_count):
            assert embed(gw, ADDED) == 200


@ONE_SERVER
def test_a_half_written_file_is_never_served(watched: tuple[Gateway, ConfigMapVolume]) -> None:
    """The attack: a writer pauses after the `preset` line (what was written parses:
    the preset's OPENAI profile and 32,768 tokens fill in the rest), then completes
    the file. No request may meet the preset's defaults in between: under the file's
    LEGACY profile `"dimensions": "256"` is accepted, under OPENAI it is a 400."""
    gw, volume = watched
    serve_file(gw, volume.path, policy_yaml(QWEN_MODEL))
    complete = policy_yaml(QWEN_MODEL, ADDED)
    half = complete.split("    max_tokens", maxsplit=1)[0]
    body = {"model": QWEN_MODEL, "input": "hello", "dimensions": "256"}
    assert gw.embeddings(body).status == 200
    count, lines = reloads(gw, "reloaded"), len(gw.log().splitlines())
    with Traffic(gw, body) as traffic:
        with volume.path.open("w", encoding="utf-8") as writer:
            writer.write(half)
            writer.flush()
            time.sleep(1.5)  # over a poll, under the settle time
            writer.write(complete[len(half) :])
        completed = time.monotonic()
        latency = wait_until_answered(gw, ADDED, completed)
    print(
        f"half-written file: {len(traffic.results)} requests, none saw the preset's defaults; "
        f"the completed file answered {latency:.2f} s after its last write"
    )
    assert traffic.statuses.keys() == {200}, traffic.statuses
    assert len(traffic.results) >= 10
    wait_for_count(gw, "reloaded", count)  # one worker's answer does not mean all
    changes = [line for line in log_since(gw, lines) if "policy change:" in line]
    said = [line.split("policy change: ", 1)[1] for line in changes]
    assert said == [f"models added: {ADDED}"] * workers(gw)


@ONE_SERVER
@pytest.mark.alone  # requests keep their latency
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "dangling-symlink"])
def test_a_path_that_is_no_regular_file_is_refused_once_and_blocks_nothing(
    watched: tuple[Gateway, ConfigMapVolume], kind: str
) -> None:
    """A ConfigMap version whose policy.yaml is a FIFO, a device, a directory or a
    dangling symlink: refused with one line and one count once it has settled, not
    again at the next polls; SIGHUP gets its answer at once; requests keep their
    latency; the next regular file is loaded as usual."""
    gw, volume = watched
    make, phrase = NOT_REGULAR_FILES[kind]
    if embed(gw, ADDED) != 200:  # a policy that serves ADDED (the kind before left one)
        serve_file(gw, volume.path, policy_yaml(QWEN_MODEL, ADDED))
    body = {"model": ADDED, "input": "hello"}
    with Traffic(gw, body) as before:
        time.sleep(1.5)
    rejected, lines = reloads(gw, "rejected"), len(rejected_lines(gw))
    with Traffic(gw, body) as during:
        swapped = time.monotonic()
        volume.update_entry(make)
        wait_for_count(gw, "rejected", rejected)
        noticed = time.monotonic() - swapped
        time.sleep(2.5)  # more polls of the same state: no second line, no second count
        assert reloads(gw, "rejected") == rejected + workers(gw)
        new_lines = rejected_lines(gw)[lines:]
        assert len(new_lines) == workers(gw), new_lines
        for line in new_lines:
            assert f"{volume.path}: <file>: " in line and phrase in line, line
        sent = time.monotonic()
        gw.process.signal(signal.SIGHUP)
        wait_for_count(gw, "rejected", rejected + workers(gw))
        answered = time.monotonic() - sent
    assert during.statuses.keys() == {200}, during.statuses
    usual, worst = statistics.median(before.seconds), max(during.seconds)
    print(
        f"{kind}: refused {noticed:.2f} s after the swap, SIGHUP refused in {answered:.3f} s; "
        f"requests: median {usual * 1000:.1f} ms before, {statistics.median(during.seconds) * 1000:.1f} "
        f"ms during (worst {worst * 1000:.1f} ms, {len(during.results)} requests)"
    )
    assert answered < 2.0
    assert statistics.median(during.seconds) < 3 * usual + 0.05
    assert worst < 2.0
    count, after = reloads(gw, "reloaded"), f"qwen-after-{kind}"
    assert embed(gw, after) == 404
    volume.update(policy_yaml(QWEN_MODEL, ADDED, after))
    wait_for_count(gw, "reloaded", count)
    assert embed(gw, after) == 200


def test_sighup_with_a_fifo_returns_at_once_and_the_gateway_still_stops(
    upstream: FakeUpstream, gateways: Gateways, tmp_path: Path
) -> None:
    spec = unwatched(upstream, tmp_path)
    config = spec.policy
    assert isinstance(config, Path)
    with gateways.own(spec) as gw:
        os.mkfifo(tmp_path / "fifo")
        (tmp_path / "link").symlink_to(tmp_path / "fifo")
        os.replace(tmp_path / "link", config)  # the policy path now leads to a FIFO
        sent = time.monotonic()
        gw.process.signal(signal.SIGHUP)
        while "SIGHUP: reloading" not in gw.log():
            assert time.monotonic() - sent < 5, gw.log()
            time.sleep(0.01)
        heard = time.monotonic() - sent
        wait_for_count(gw, "rejected", 0)
        refused = time.monotonic() - sent
        assert embed(gw, QWEN_MODEL) == 200
        (line,) = rejected_lines(gw)
        assert f"{config}: <file>: resolves to a FIFO" in line, line
        stopping = time.monotonic()
        assert gw.stop() == 0, gw.log()
        stopped = time.monotonic() - stopping
    print(
        f"SIGHUP with a FIFO: logged after {heard:.3f} s, refused after {refused:.2f} s "
        f"(the settle time); the gateway stopped in {stopped:.2f} s"
    )
    assert stopped < 15


def start_command(command: str, config: Path) -> list[str]:
    return {
        "check-config": ["check-config", str(config)],
        "serve": ["serve", "--config", str(config), "--listen", "127.0.0.1:0"],
        "run": [
            "run",
            "--config",
            str(config),
            "--upstream",
            "http://127.0.0.1:9",
            "--listen",
            f"127.0.0.1:{free_port()}",
        ],
    }[command]


def start_fails(command: str, config: Path, qwen_dir: Path) -> tuple[str, float]:
    """The one error line of a start that must fail, and how long it took."""
    env = {**os.environ, "EXTPROC_TOKENIZER_OVERRIDES": f"{QWEN_MODEL}={qwen_dir}"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "extproc", *start_command(command, config)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    took = time.monotonic() - started
    assert done.returncode == (1 if command == "check-config" else 2), done
    (line,) = [line for line in done.stderr.splitlines() if line.strip()]
    return line, took


@pytest.mark.parametrize("command", ["check-config", "serve", "run"])
def test_an_over_long_default_instruction_is_refused_at_start(
    command: str, qwen_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text(with_long_instruction(policy_yaml(QWEN_MODEL)))
    line, _ = start_fails(command, config, qwen_dir)
    assert line.startswith(
        f"error: {config}: models[0].prompts.default_instruction: model '{QWEN_MODEL}': "
        "the query prompt with its default instruction is "
    ), line
    assert "leaves no token for the input, at least 16 are needed" in line, line


@pytest.mark.parametrize(
    ("make", "phrase"),
    [
        (os.mkfifo, "resolves to a FIFO"),
        (lambda p: p.symlink_to("/dev/zero"), "resolves to a character device (/dev/zero)"),
        (lambda p: p.write_text("#" * (1024 * 1024 + 1)), "is 1,048,577 bytes"),
    ],
    ids=["fifo", "dev-zero", "over-1-mib"],
)
@pytest.mark.parametrize("command", ["check-config", "serve", "run"])
def test_a_start_on_what_is_no_policy_file_fails_fast(
    command: str, make: Callable[[Path], object], phrase: str, qwen_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "policy.yaml"
    make(config)
    line, took = start_fails(command, config, qwen_dir)
    print(f"{command} on {phrase}: failed in {took:.2f} s")
    assert line.startswith(f"error: {config}: <file>: ") and phrase in line, line


@ONE_SERVER
def test_an_over_long_default_instruction_is_refused_on_reload(
    watched: tuple[Gateway, ConfigMapVolume],
) -> None:
    gw, volume = watched
    serve_file(gw, volume.path, policy_yaml(QWEN_MODEL, ADDED))
    rejected, lines = reloads(gw, "rejected"), len(rejected_lines(gw))
    write_in_place(volume.path, with_long_instruction(policy_yaml(QWEN_MODEL, ADDED)))
    wait_for_count(gw, "rejected", rejected)
    new_lines = rejected_lines(gw)[lines:]
    assert len(new_lines) == workers(gw), new_lines
    for line in new_lines:
        assert (
            f"{volume.path}: models[1].prompts.default_instruction: model '{ADDED}': "
            "the query prompt with its default instruction is "
        ) in line, line
        assert LONG_INSTRUCTION[:40] not in line  # the text itself is not logged
    assert embed(gw, ADDED) == 200  # the running policy stays


@ONE_SERVER
def test_each_reload_says_what_changed_or_that_nothing_did(
    watched: tuple[Gateway, ConfigMapVolume],
) -> None:
    gw, volume = watched
    serve_file(gw, volume.path, policy_yaml(QWEN_MODEL, ADDED))
    count, lines = reloads(gw, "reloaded"), len(gw.log().splitlines())
    # The preset's profile and max_tokens, a smaller admission budget, ADDED gone.
    changed = (
        "limits: {max_inflight_bytes: 16777216}\n"
        f"models:\n  - name: {QWEN_MODEL}\n    preset: qwen3-embedding-0.6b\n"
        "    upstream_flavour: DYNAMO\n"
    )
    write_in_place(volume.path, changed)
    wait_for_count(gw, "reloaded", count)
    said = [
        line.split("policy change: ", 1)[1]
        for line in log_since(gw, lines)
        if "policy change: " in line
    ]
    assert Counter(said) == Counter(
        [
            f"{QWEN_MODEL}: encoding_profile LEGACY -> OPENAI, max_tokens 1024 -> 32768",
            f"models removed: {ADDED}",
            "limits: max_inflight_bytes 50331648 -> 16777216",
        ]
        * workers(gw)
    )
    lines = len(gw.log().splitlines())
    write_in_place(
        volume.path, changed.replace("upstream_flavour: DYNAMO", "upstream: {kind: dynamo}")
    )
    wait_for_count(gw, "reloaded", count + workers(gw))
    reloaded = [line for line in log_since(gw, lines) if "policy reload" in line]
    assert len(reloaded) == workers(gw), reloaded
    for line in reloaded:
        assert "nothing changed in effect" in line, line
    serve_file(gw, volume.path, policy_yaml(QWEN_MODEL, ADDED))


@EVERY_WORKER
def test_a_policy_needing_other_precheck_markers_is_flagged(
    watched: tuple[Gateway, ConfigMapVolume],
) -> None:
    """`extproc run` rendered Envoy's precheck for the starting policy (`dimensions`:
    the gateway cuts them). A policy whose upstream cuts them itself needs none: served,
    but the difference is named and counted until a restart renders it."""
    gw, volume = watched
    serve_file(gw, volume.path, policy_yaml(QWEN_MODEL))
    count, lines = reloads(gw, "reloaded"), len(gw.log().splitlines())
    volume.update(policy_yaml(QWEN_MODEL) + "    upstream: {native: {dimensions: true}}\n")
    wait_for_count(gw, "reloaded", count)
    assert not_applied(gw) == {
        "request_body_buffer": 0,
        "response_buffer": 0,
        "grpc_message": 0,
        "precheck_markers": 1,
    }
    warnings = [line for line in log_since(gw, lines) if "WARNING" in line]
    assert len(warnings) == workers(gw), warnings
    for warning in warnings:
        assert (
            "precheck markers rendered into Envoy [dimensions], the policy needs [none]" in warning
        ), warning
    assert "policy change: " + f"{QWEN_MODEL}: upstream.native.dimensions false -> true" in gw.log()
    volume.update(policy_yaml(QWEN_MODEL))
    wait_for_count(gw, "reloaded", count + workers(gw))
    assert set(not_applied(gw).values()) == {0}
