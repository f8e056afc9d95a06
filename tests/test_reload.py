"""Live policy reload (extproc/service/reload.py).

Through a real Envoy and `extproc run` (tests/harness.py), in front of the fake
Dynamo, with one ext_proc process and with two workers (`--workers 2`: each worker
watches the file and gets SIGHUP, and reloads on its own, so every count and log line
comes once per worker): a model added to the watched file answers within 10 s; a broken file (bad
YAML, unknown field, unloadable tokenizer) is refused with one log line and the
running policy keeps answering; a Kubernetes ConfigMap symlink swap is picked up even
when the new file has the old one's size and mtime; a policy that needs larger Envoy
limits is served but flagged; with --no-watch, SIGHUP reloads. In-process, over
gRPC: a stream that started before a reload finishes on the old policy.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
import pytest_asyncio
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from prometheus_client import REGISTRY

from extproc.core.contract import Contract, load_contract
from extproc.core.policy import load_policy_file
from extproc.service.reload import (
    EnvoyLimits,
    ReloadSettings,
    WatchState,
    after_load,
    after_poll,
    policy_stamp,
)
from extproc.service.server import serve
from tests.conftest import QWEN_MODEL
from tests.fake_upstream import FakeUpstream
from tests.harness import Gateway, http, metric_value, start_gateway

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
    with path.open("w", encoding="utf-8") as f:  # same inode: a `kubectl cp` or an editor
        f.write(text)


def metrics(gw: Gateway) -> str:
    return http("GET", f"{gw.metrics_url}/metrics").body.decode()


def reloads(gw: Gateway, outcome: str) -> float:
    return metric_value(metrics(gw), "extproc_policy_reloads_total", outcome=outcome)


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
    if path.read_text() != text:
        count = reloads(gw, "reloaded")
        write_in_place(path, text)
        wait_for_count(gw, "reloaded", count)


def rejected_lines(gw: Gateway) -> list[str]:
    return [line for line in gw.log().splitlines() if "policy reload rejected" in line]


# -- decisions ---------------------------------------------------------------------------


STAMP_A = ("/cm/..2026_a/policy.yaml", 1, 10, 300, 5, 5)
STAMP_B = ("/cm/..2026_b/policy.yaml", 1, 11, 300, 5, 6)


def test_a_change_is_loaded_once_it_holds_still_for_one_poll() -> None:
    state = WatchState(loaded=STAMP_A, seen=STAMP_A)
    state, load = after_poll(state, STAMP_B)
    assert not load  # just seen: maybe still being written
    state, load = after_poll(state, STAMP_B)
    assert load
    assert after_poll(after_load(state, STAMP_B, ok=True), STAMP_B) == (
        WatchState(STAMP_B, STAMP_B),
        False,
    )


def test_a_refused_file_is_not_tried_again_until_it_changes() -> None:
    state = after_load(WatchState(STAMP_A, STAMP_B), STAMP_B, ok=False)
    assert after_poll(state, STAMP_B)[1] is False
    state, _ = after_poll(state, STAMP_A)  # restored: a change from what was refused
    assert state.loaded == STAMP_A and after_poll(state, STAMP_A)[1] is False
    assert after_poll(state, None)[1] is False  # missing mid-swap: keep serving


def test_envoy_limits_name_each_one_a_policy_outgrows(qwen_dir: Path, tmp_path: Path) -> None:
    small = tmp_path / "small.yaml"
    small.write_text(policy_yaml(QWEN_MODEL))
    big = tmp_path / "big.yaml"
    big.write_text(policy_yaml(QWEN_MODEL, limits="limits: {max_request_bytes: 67108864}"))
    overrides = {QWEN_MODEL: qwen_dir}
    running = EnvoyLimits.for_policy(load_policy_file(small, tokenizer_overrides=overrides))
    needed = EnvoyLimits.for_policy(load_policy_file(big, tokenizer_overrides=overrides))
    short = running.shortfalls(needed)
    assert [s.rsplit(" ", 4)[0] for s in short] == ["request body buffer", "gRPC message"], short
    assert needed.shortfalls(running) == ()


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


# -- a stream in flight keeps its policy (in-process, over gRPC) --------------------------


def _reloaded_count() -> float:
    return REGISTRY.get_sample_value("extproc_policy_reloads_total", {"outcome": "reloaded"}) or 0


@pytest_asyncio.fixture(loop_scope="function")
async def reloading_server(
    qwen_dir: Path, tmp_path: Path
) -> AsyncIterator[tuple[grpc.aio.Channel, Path]]:
    config = tmp_path / "policy.yaml"
    config.write_text(policy_yaml(QWEN_MODEL))
    overrides = {QWEN_MODEL: qwen_dir}
    started_from = policy_stamp(config)
    contract = load_contract(load_policy_file(config, tokenizer_overrides=overrides))
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve(
            contract,
            address="127.0.0.1:0",
            metrics_address=None,
            grace_seconds=1.0,
            stop=stop,
            on_ready=ready.set_result,
            reload=ReloadSettings(config, overrides, interval_s=0.1, started_from=started_from),
        )
    )
    await asyncio.wait_for(asyncio.shield(ready), 60)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{ready.result()}")
    try:
        yield channel, config
    finally:
        await channel.close()
        stop.set()
        await asyncio.wait_for(task, 30)


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
    reloading_server: tuple[grpc.aio.Channel, Path],
) -> None:
    channel, config = reloading_server
    in_flight = ep_grpc.ExternalProcessorStub(channel).Process(timeout=30)
    try:
        await _exchange(in_flight, _headers())  # the stream exists: it has its contract
        before = _reloaded_count()
        write_in_place(config, policy_yaml(ADDED))  # the old model is gone from the file
        deadline = time.monotonic() + RELOAD_DEADLINE_S
        while _reloaded_count() <= before:
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

    def _write_version(self, text: str) -> Path:
        directory = self._version_dir()
        directory.mkdir()
        (directory / "policy.yaml").write_text(text, encoding="utf-8")
        return directory / "policy.yaml"

    def update(self, text: str, *, mtime_ns: int | None = None) -> None:
        old = self._version_dir()
        self.version += 1
        new_file = self._write_version(text)
        if mtime_ns is not None:
            os.utime(new_file, ns=(mtime_ns, mtime_ns))
        (self.root / "..data_tmp").symlink_to(self._version_dir().name)
        os.replace(self.root / "..data_tmp", self.root / "..data")
        shutil.rmtree(old)


@pytest.fixture(scope="module", params=[1, 2], ids=["1-worker", "2-workers"])
def watched(
    request: pytest.FixtureRequest,
    upstream: FakeUpstream,
    qwen_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Gateway, ConfigMapVolume]]:
    root = tmp_path_factory.mktemp("configmap")
    volume = ConfigMapVolume(root, policy_yaml(QWEN_MODEL))
    gw = start_gateway(
        upstream.url,
        tmp_path_factory.mktemp("watched"),
        config=volume.path,
        tokenizer_overrides=f"{QWEN_MODEL}={qwen_dir}",
        workers=request.param,
    )
    yield gw, volume
    assert gw.stop() == 0, gw.log()


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
    ("text", "field", "reason"),
    [
        ("models: [\n", "<yaml>", "expected the node content"),
        (policy_yaml(QWEN_MODEL) + "    colour: red\n", "models[0]", '"colour"'),
        # A tokenizer.json that exists but does not parse: found only by loading it.
        (
            policy_yaml(QWEN_MODEL, "qwen-bad") + "    tokenizer: {path: BAD_DIR}\n",
            "tokenizer",
            "cannot be loaded",
        ),
    ],
    ids=["bad-yaml", "unknown-field", "unloadable-tokenizer"],
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


def test_a_policy_needing_larger_envoy_limits_is_flagged(
    watched: tuple[Gateway, ConfigMapVolume],
) -> None:
    gw, volume = watched
    count = reloads(gw, "reloaded")
    volume.update(policy_yaml(QWEN_MODEL, limits="limits: {max_request_bytes: 67108864}"))
    wait_for_count(gw, "reloaded", count)
    assert metric_value(metrics(gw), "extproc_policy_envoy_limits_stale") == 1
    warnings = [line for line in gw.log().splitlines() if "needs larger limits" in line]
    assert len(warnings) == workers(gw), warnings
    for warning in warnings:
        assert "request body buffer 67108864 bytes > 8388608" in warning, warning
    volume.update(policy_yaml(QWEN_MODEL))
    wait_for_count(gw, "reloaded", count + workers(gw))
    assert metric_value(metrics(gw), "extproc_policy_envoy_limits_stale") == 0


@pytest.mark.parametrize("worker_count", [1, 2], ids=["1-worker", "2-workers"])
def test_sighup_reloads_an_unwatched_file(
    upstream: FakeUpstream, qwen_dir: Path, tmp_path: Path, worker_count: int
) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text(policy_yaml(QWEN_MODEL))
    gw = start_gateway(
        upstream.url,
        tmp_path,
        config=config,
        tokenizer_overrides=f"{QWEN_MODEL}={qwen_dir}",
        extra_args=["--no-watch"],
        workers=worker_count,
    )
    try:
        write_in_place(config, policy_yaml(QWEN_MODEL, ADDED))
        time.sleep(2.5)  # the watch would have loaded it by now
        assert embed(gw, ADDED) == 404
        assert reloads(gw, "reloaded") == 0
        sent = time.monotonic()
        gw.process.send_signal(signal.SIGHUP)  # to `extproc run`: it reaches every worker
        latency = wait_until_answered(gw, ADDED, sent)
        print(f"reload latency (SIGHUP -> new model answers): {latency:.2f} s")
        wait_for_count(gw, "reloaded", 0)
        assert gw.log().count("SIGHUP: reloading") == worker_count
        assert reloaded_by(gw, 0) == everyone(gw)
        for _ in range(4 * worker_count):
            assert embed(gw, ADDED) == 200
    finally:
        assert gw.stop() == 0, gw.log()
