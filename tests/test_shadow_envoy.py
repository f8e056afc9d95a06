"""Shadow mode through a real Envoy with mirroring.

The set-up, all on loopback:

- baseline: ``FakeLegacy`` (``tests/fake_legacy.py``), the seed's legacy server: the same
  made-up vector model as the fake Dynamo, with the Qwen3 instruction, truncation and
  Matryoshka ``dimensions`` applied natively;
- candidate: ``FakeUpstream`` (fake Dynamo 1.6.1) behind the shipped rewrite filter,
  served by ``extproc serve`` with the shipped Qwen3 policy and the real tokenizer;
- the comparator: ``extproc shadow-compare`` (``python -m extproc``);
- Envoy with the shipped ``envoy/shadow.yaml`` (or ``shadow-reverse.yaml``) rendered
  by :func:`extproc.tools.shadow.envoy_render.render_shadow`.

Every process is started and stopped here by its own PID; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from extproc.core.policy import GatewayPolicy
from extproc.runtime.envoy_config import DEFAULT_TEMPLATE as STANDALONE_TEMPLATE
from extproc.runtime.envoy_config import Upstream, load_template
from extproc.tools.shadow.envoy_render import (
    REVERSE_TEMPLATE,
    SHADOW_TEMPLATE,
    ShadowEnvoySettings,
    render_shadow,
)
from testing_support.envoy import Envoy, EnvoySpec
from testing_support.fake_upstream import FakeUpstream
from testing_support.http import Reply, http
from testing_support.processes import Process, free_port, wait_until
from testing_support.qwen import QWEN_MODEL, REPO
from testing_support.serve import ServeSpec
from tests.harness import Comparator, Envoys, Servers, start_comparator, start_stand_in
from tests.test_shadow_core import without_rewrite, without_shadow

READY_TIMEOUT_S = 60.0
PAIRS_TIMEOUT_S = 30.0
CORPUS = REPO / "extproc" / "data" / "corpus.jsonl"
LATENCY_REQUESTS = 200


# --------------------------------------------------------------------------- processes


def shadow_envoy(config: dict[str, Any], name: str) -> EnvoySpec:
    return EnvoySpec.of(config, name, concurrency=None)


def settings_for(
    *,
    baseline: str,
    candidate: str,
    rewrite_port: int,
    compare: int,
    noise: str | None = None,
    reverse: bool = False,
    percent: float = 100.0,
) -> ShadowEnvoySettings:
    return ShadowEnvoySettings(
        listen_host="127.0.0.1",
        listen_port=free_port(),
        admin_port=free_port(),
        shadow_port=free_port(),
        noise_port=free_port(),
        extproc_port=rewrite_port,
        compare=(("127.0.0.1", compare),),
        baseline=Upstream.from_url(baseline),
        candidate=Upstream.from_url(candidate),
        noise=Upstream.from_url(noise) if noise else None,
        candidate_gateway_port=free_port() if reverse else 0,
        upstream_timeout_s=30,
        percent=percent,
    )


def primary_url(settings: ShadowEnvoySettings) -> str:
    return f"http://127.0.0.1:{settings.listen_port}/v1/embeddings"


# --------------------------------------------------------------------------- traffic


def corpus() -> list[dict[str, Any]]:
    return [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line]


def workload() -> list[dict[str, Any]]:
    """Requests a legacy client sends: batches of 8 documents, single documents,
    queries (input_type and instruction), dimensions, base64, a long input, and a
    client mistake."""
    items = corpus()
    docs = [d["text"] for d in items if d.get("kind") == "document"]
    queries = [d["text"] for d in items if d.get("kind") != "document"] or docs[:4]
    requests: list[dict[str, Any]] = [
        {"model": QWEN_MODEL, "input": docs[i : i + 8]} for i in range(0, 24, 8)
    ]
    requests += [{"model": QWEN_MODEL, "input": doc} for doc in docs[24:28]]
    requests += [
        {"model": QWEN_MODEL, "input": queries[:3], "input_type": "query"},
        {"model": QWEN_MODEL, "input": queries[3 % len(queries)], "input_type": "query"},
        {
            "model": QWEN_MODEL,
            "input": queries[:2],
            "instruction": "Given a question, retrieve passages that answer it",
        },
        {"model": QWEN_MODEL, "input": docs[:2], "dimensions": 256},
        {"model": QWEN_MODEL, "input": docs[2:4], "encoding_format": "base64"},
        {"model": QWEN_MODEL, "input": "shadow traffic " * 900},  # over 1,024 tokens
        {"model": QWEN_MODEL, "input": docs[0], "dimensions": 0},  # a client mistake: 400
    ]
    return requests


def answers(url: str, requests: list[dict[str, Any]]) -> list[Reply]:
    return [http("POST", url, body, timeout=30) for body in requests]


def same_answer(a: Reply, b: Reply) -> bool:
    """The same status and the same JSON (the primary path passes bytes through)."""
    return a.status == b.status and a.json() == b.json()


def same_contract(a: Reply, b: Reply) -> bool:
    """The same status class; for 2xx, the same vectors (to float32 rounding: the
    gateway re-normalises Matryoshka cuts in float32, the legacy server in float64)
    and the same token usage."""
    if a.status // 100 != b.status // 100:
        return False
    if a.status // 100 != 2:
        return True
    doc_a, doc_b = a.json(), b.json()
    vectors_a = [np.asarray(d["embedding"], dtype=np.float32) for d in doc_a["data"]]
    vectors_b = [np.asarray(d["embedding"], dtype=np.float32) for d in doc_b["data"]]
    return (
        len(vectors_a) == len(vectors_b)
        and all(
            x.shape == y.shape and np.allclose(x, y, rtol=0, atol=1e-6)
            for x, y in zip(vectors_a, vectors_b, strict=True)
        )
        and doc_a["usage"]["prompt_tokens"] == doc_b["usage"]["prompt_tokens"]
    )


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shadow")


@dataclass(frozen=True)
class World:
    """What every shadow set-up here shares."""

    baseline: str  # FakeLegacy's URL
    candidate: str  # FakeUpstream's URL
    rewrite_port: int  # `extproc serve`, the candidate's contract gateway
    policy: GatewayPolicy
    logs: Path

    def settings(
        self,
        compare: int,
        *,
        candidate: str | None = None,
        noise: str | None = None,
        reverse: bool = False,
        percent: float = 100.0,
    ) -> ShadowEnvoySettings:
        return settings_for(
            baseline=self.baseline,
            candidate=candidate or self.candidate,
            rewrite_port=self.rewrite_port,
            compare=compare,
            noise=noise,
            reverse=reverse,
            percent=percent,
        )

    def config(
        self,
        settings: ShadowEnvoySettings,
        *,
        reverse: bool = False,
        gateway: Path | None = None,
    ) -> dict[str, Any]:
        template = load_template(REVERSE_TEMPLATE if reverse else SHADOW_TEMPLATE)
        other = load_template(gateway) if gateway else None
        return render_shadow(template, settings, self.policy, gateway=other)


@pytest.fixture(scope="module")
def world(
    qwen_dir: Path, qwen_policy: GatewayPolicy, logs: Path, servers: Servers
) -> Iterator[World]:
    """FakeLegacy and fake Dynamo in processes of their own, and `extproc serve`."""
    with (
        start_stand_in("legacy", qwen_dir, logs) as baseline,
        start_stand_in("dynamo", qwen_dir, logs) as candidate,
    ):
        rewrite = servers.shared(ServeSpec())
        yield World(baseline, candidate, rewrite.port, qwen_policy, logs)


@pytest.fixture(scope="module")
def reference(world: World) -> list[Reply]:
    """The no-shadow answers: the baseline asked directly."""
    return answers(f"{world.baseline}/v1/embeddings", workload())


class Stack:
    def __init__(self, settings: ShadowEnvoySettings, envoy: Envoy, comparator: Comparator) -> None:
        self.settings = settings
        self.envoy = envoy
        self.comparator = comparator

    @property
    def url(self) -> str:
        return primary_url(self.settings)

    def wait_pairs(self, n: int) -> dict[str, Any]:
        summary: dict[str, Any] = {}

        def done() -> bool:
            nonlocal summary
            summary = self.comparator.summary()
            return int(summary["pairs"]) >= n and summary["pending_halves"] == 0

        try:
            wait_until(done, PAIRS_TIMEOUT_S, f"{n} pairs")
        except TimeoutError:
            raise AssertionError(json.dumps(summary, indent=1)[:4000]) from None
        return summary


@pytest.fixture(scope="module")
def stack(world: World, envoys: Envoys) -> Iterator[Stack]:
    """Config A with the rewrite on, one comparator behind the tap cluster."""
    with ExitStack() as cleanup:
        comparator = start_comparator(world.logs)
        cleanup.callback(comparator.process.stop)
        settings = world.settings(comparator.grpc_port)
        envoy = cleanup.enter_context(envoys.own(shadow_envoy(world.config(settings), "shadow")))
        yield Stack(settings, envoy, comparator)


def report(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "extproc", "shadow-report", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# --------------------------------------------------------------------------- tests


def test_parity_with_the_rewrite_on(stack: Stack, reference: list[Reply]) -> None:
    requests = workload()
    replies = answers(stack.url, requests)
    for request, got, expected in zip(requests, replies, reference, strict=True):
        assert same_answer(got, expected), (request.keys(), got.status, expected.status)

    summary = stack.wait_pairs(len(requests))
    assert summary["pairs"] == len(requests)
    assert summary["expired_halves"] == 0, summary["halves"]
    documents, queries = summary["inputs"]["document"], summary["inputs"]["query"]
    assert documents["compared"] >= 30 and queries["compared"] >= 5
    assert documents["cosine"]["min"] > 0.9999
    assert queries["cosine"]["min"] > 0.9999
    assert summary["status"]["mismatches"] == 0, summary["status"]
    assert summary["status"]["pairs"].get("4xx/4xx") == 1  # the client mistake, on both sides
    assert summary["shape"]["dimension_mismatches"] == 0
    assert summary["request_mismatches"] == 0
    assert summary["tokens"]["different"] == 0
    assert summary["verdict"]["verdict"] == "ready", summary["verdict"]
    metrics = stack.comparator.metrics()
    assert f'extproc_shadow_halves_total{{role="candidate"}} {len(requests)}.0' in metrics
    assert 'extproc_shadow_pairs_total{baseline_class="4xx",candidate_class="4xx"} 1.0' in metrics

    result = report(stack.comparator.url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Verdict: ready" in result.stdout
    assert "| Cosine similarity per document" in result.stdout
    print("\n" + result.stdout)


def test_the_silent_failure_is_caught_with_the_rewrite_off(world: World, envoys: Envoys) -> None:
    """Candidate = raw fake Dynamo on the shadow listener (no rewrite filter): what a
    plain address swap gives. A second baseline replica (here: the same baseline,
    mirrored to the noise listener) gives the noise; it explains none of this."""
    with ExitStack() as cleanup:
        comparator = start_comparator(world.logs, extra=["--noise"])
        cleanup.callback(comparator.process.stop)
        settings = world.settings(comparator.grpc_port, noise=world.baseline)
        config = without_rewrite(world.config(settings))
        envoy = cleanup.enter_context(envoys.own(shadow_envoy(config, "no-rewrite")))
        stack = Stack(settings, envoy, comparator)

        requests = workload()
        answers(stack.url, requests)
        summary = stack.wait_pairs(len(requests))

    assert summary["pairs_with_noise"] == len(requests)
    documents, queries = summary["inputs"]["document"], summary["inputs"]["query"]
    # Documents without any extra field: Dynamo embeds them as the legacy server did.
    assert documents["cosine"]["min"] > 0.9999
    assert documents["min_unexplained_cosine"] > 0.9999
    # Queries: the instruction is silently dropped - 200 on both sides, far-off vectors.
    assert queries["compared"] >= 5
    assert queries["cosine"]["max"] < 0.9
    assert queries["mismatches"] == queries["compared"]
    assert queries["explained_by_noise"] == 0
    # dimensions and the long input: 200 from the legacy contract, 500 from Dynamo.
    assert summary["status"]["mismatch_pairs"].get("2xx/5xx", 0) >= 2, summary["status"]
    assert summary["verdict"]["verdict"] == "not ready"
    failed = {c["name"] for c in summary["verdict"]["checks"] if not c["ok"]}
    assert {"queries", "status classes"} <= failed
    worst = summary["worst"]
    assert worst and worst[0]["kind"] == "query" and worst[0]["cosine"] < 0.9

    rendered = report_from(summary)
    assert "Verdict: not ready" in rendered
    print("\n" + rendered)


def report_from(summary: dict[str, Any]) -> str:
    from extproc.tools.shadow.shadow_report import render_report

    return render_report(summary)


@pytest.mark.alone  # the mirrored half settles between two polls
def test_reverse_config_after_the_cut_over_half_shadowed(
    world: World, reference: list[Reply], envoys: Envoys
) -> None:
    """Config B: clients get the candidate through the gateway (here the optimised
    envoy/standalone.yaml gateway, adopted with --gateway-template); the legacy server
    is the shadow. The mirror carries the client's own bytes (not the rewritten ones).
    At 50 %, only the shadowed half is tapped: every tapped request has its pair."""
    with ExitStack() as cleanup:
        comparator = start_comparator(world.logs)
        cleanup.callback(comparator.process.stop)
        settings = world.settings(comparator.grpc_port, reverse=True, percent=50)
        config = world.config(settings, reverse=True, gateway=STANDALONE_TEMPLATE)
        cleanup.enter_context(envoys.own(shadow_envoy(config, "reverse")))

        requests = workload() * 3
        replies = answers(primary_url(settings), requests)
        last: list[Any] = []

        def settled() -> bool:
            summary = comparator.summary()
            received = summary["halves"]["received"]
            now = [summary["pairs"], received.get("baseline"), received.get("candidate")]
            done = now == last and summary["pending_halves"] == 0
            last[:] = now
            return done and now[0] == now[1] == now[2]

        wait_until(settled, PAIRS_TIMEOUT_S, "the shadowed half to pair", interval=0.1)
        time.sleep(0.5)
        summary = comparator.summary()

    # Clients get the legacy contract from the candidate (the gateway's whole point).
    for request, got, expected in zip(requests, replies, reference * 3, strict=True):
        assert same_contract(got, expected), (request.keys(), got.status, expected.status)
    assert 0 < summary["pairs"] < len(requests)
    assert summary["expired_halves"] == 0, summary["halves"]
    assert summary["request_mismatches"] == 0
    assert summary["status"]["mismatches"] == 0
    assert summary["verdict"]["verdict"] == "ready", summary["verdict"]


@pytest.mark.alone  # the primary path's bound while the candidate sleeps
def test_a_dead_or_hung_comparator_and_a_slow_or_dead_candidate_change_nothing(
    world: World, qwen_dir: Path, reference: list[Reply], envoys: Envoys
) -> None:
    requests = workload()
    with ExitStack() as cleanup:
        slow = cleanup.enter_context(FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir))
        slow.fault = "slow"
        slow.slow_seconds = 3.0
        comparator = start_comparator(world.logs)
        cleanup.callback(comparator.process.stop)
        settings = world.settings(comparator.grpc_port, candidate=slow.url)
        envoy = cleanup.enter_context(envoys.own(shadow_envoy(world.config(settings), "faults")))
        url = primary_url(settings)

        def check(situation: str) -> None:
            for request, expected in zip(requests, reference, strict=True):
                started = time.monotonic()
                got = http("POST", url, request, timeout=30)
                took = time.monotonic() - started
                assert same_answer(got, expected), (situation, request.keys(), got.status)
                assert took < 1.5, (situation, took)  # the candidate sleeps 3 s

        # 1. The comparator is hung (SIGSTOP: it accepts connections, reads nothing)
        #    and the candidate answers after 3 s.
        comparator.process.signal(signal.SIGSTOP)
        check("hung comparator, slow candidate")
        # 2. The comparator is gone and the candidate too.
        comparator.process.stop()
        slow.stop()
        check("dead comparator, dead candidate")
        assert envoy.process.alive()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _timed(
    urls: dict[str, str], body: dict[str, Any], n: int, *, pause_s: float = 0.0, block: int = 1
) -> dict[str, list[float]]:
    """n requests to each URL, one at a time, alternating between them every ``block``
    requests (fine alternation cancels the drift of other load on the machine)."""
    timings: dict[str, list[float]] = {name: [] for name in urls}
    names = list(urls)
    for round_ in range(n // block):
        for name in names if round_ % 2 == 0 else names[::-1]:
            for _ in range(block):
                started = time.perf_counter()
                reply = http("POST", urls[name], body)
                timings[name].append(time.perf_counter() - started)
                assert reply.status == 200
                if pause_s:
                    time.sleep(pause_s)
    return timings


def describe_latency(label: str, timings: dict[str, list[float]]) -> str:
    stats = {
        name: (statistics.median(values) * 1000, _percentile(values, 0.99) * 1000)
        for name, values in timings.items()
    }
    return (
        f"{label}, {len(timings['shadow'])} requests each: "
        f"no shadow p50 {stats['plain'][0]:.2f} ms / p99 {stats['plain'][1]:.2f} ms; "
        f"shadow p50 {stats['shadow'][0]:.2f} ms / p99 {stats['shadow'][1]:.2f} ms; "
        f"added p50 {stats['shadow'][0] - stats['plain'][0]:+.2f} ms, "
        f"p99 {stats['shadow'][1] - stats['plain'][1]:+.2f} ms"
    )


@pytest.mark.alone  # the latency the shadow adds
def test_latency_added_to_the_primary_path(stack: Stack, world: World, envoys: Envoys) -> None:
    """Batch-8 document requests, one at a time, through the shadow config (tap +
    100 % mirror to the rewrite and fake Dynamo, the comparator) and through the same
    config without tap and mirror (same baseline). Paced (50 ms apart, alternating
    request by request) the shadow work of one request is over before the next; back
    to back (blocks of 20) it overlaps the next one on this machine's cores. The
    figures are printed (docs/shadow.md); this machine's other load makes them noisy,
    so only the shadow path's own health is asserted."""
    plain_settings = world.settings(stack.comparator.grpc_port)
    plain_config = without_shadow(world.config(plain_settings))
    docs = [d["text"] for d in corpus() if d.get("kind") == "document"]
    body = {"model": QWEN_MODEL, "input": docs[:8]}
    with envoys.own(shadow_envoy(plain_config, "plain")):
        urls = {"shadow": stack.url, "plain": primary_url(plain_settings)}
        before = stack.wait_pairs(0)["pairs"]
        for url in urls.values():  # warm up connections and caches
            for _ in range(5):
                assert http("POST", url, body).status == 200
        paced = _timed(urls, body, LATENCY_REQUESTS // 2, pause_s=0.05)
        back_to_back = _timed(urls, body, LATENCY_REQUESTS, block=20)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        f"primary-path latency ({os.cpu_count()} CPUs, load average {load}; "
        "baseline, candidate, gateway, comparator and Envoy all on this machine)",
        describe_latency("paced, 50 ms apart", paced),
        describe_latency("back to back", back_to_back),
    ]
    print("\n" + "\n".join(lines))
    (world.logs / "latency.txt").write_text("\n".join(lines) + "\n")
    # Every mirrored request was still compared: the shadow path kept up.
    summary = stack.wait_pairs(before + 5 + LATENCY_REQUESTS + LATENCY_REQUESTS // 2)
    assert summary["expired_halves"] == 0
    assert summary["status"]["mismatches"] == 0


@pytest.mark.parametrize("workers", [1, 2], ids=["1-worker", "2-workers"])
def test_extproc_shadow_launcher(world: World, qwen_dir: Path, workers: int) -> None:
    """`extproc shadow` (here `python -m extproc shadow`): one command, one line; the
    gateway's ext_proc server in it, or two workers behind its Envoy."""
    listen, http_port = free_port(), free_port()
    proc = Process.start(
        [
            sys.executable,
            "-m",
            "extproc",
            "shadow",
            "--baseline",
            world.baseline,
            "--candidate",
            world.candidate,
            "--listen",
            f"127.0.0.1:{listen}",
            "--http",
            f"127.0.0.1:{http_port}",
            "--tokenizer",
            f"{QWEN_MODEL}={qwen_dir}",
            "--grace",
            "1",
            "--workers",
            str(workers),
        ],
        world.logs / f"launcher-{workers}.log",
        name="extproc shadow",
    )
    try:
        line = proc.wait_line("extproc shadow ready:", READY_TIMEOUT_S)
        assert f"http://127.0.0.1:{listen}/v1/embeddings -> baseline {world.baseline}" in line
        assert "/summary" in line
        requests = workload()[:6]
        for body in requests:
            assert http("POST", f"http://127.0.0.1:{listen}/v1/embeddings", body).status == 200
        comparator = Comparator(proc, 0, http_port)
        wait_until(lambda: comparator.summary()["pairs"] >= len(requests), PAIRS_TIMEOUT_S, "pairs")
        result = report(comparator.url)
        assert result.returncode == 0, result.stdout + result.stderr
        assert proc.log().count(" started (pid ") == (workers if workers > 1 else 0)
    finally:
        assert proc.stop() == 0, proc.log()
