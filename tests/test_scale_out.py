"""Scale-out that really spreads load: Envoy's extproc cluster with two ext_proc
server processes as endpoints (round robin). Every HTTP request is its own gRPC
stream, and Envoy balances streams, not connections, across endpoints, so both
processes take a share (SO_REUSEPORT on one address would not: Envoy keeps one
HTTP/2 connection per worker; see docs/envoy-facts.md). This is how a Kubernetes
Service with several pods is used (an Envoy cluster of the pod IPs, e.g. STRICT_DNS
on a headless Service, or EDS from the mesh)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc.core.policy import GatewayPolicy
from extproc.runtime.envoy_config import EnvoySettings, Upstream, dump, load_template, render
from extproc.runtime.envoy_process import envoy_binary
from testing_support.fake_upstream import FakeUpstream
from testing_support.http import http, metric_value
from testing_support.processes import free_port
from testing_support.qwen import QWEN_MODEL, SHIPPED_QWEN_POLICY


def _up(url: str) -> bool:
    try:
        return http("GET", url, timeout=1).status == 200
    except OSError:
        return False


@pytest.fixture
def two_servers(qwen_dir: Path, tmp_path: Path) -> Iterator[list[tuple[int, int]]]:
    servers: list[tuple[subprocess.Popen[bytes], int, int]] = []
    try:
        for i in range(2):
            grpc_port, metrics_port = free_port(), free_port()
            with (tmp_path / f"extproc-{i}.log").open("wb") as log:
                process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "extproc",
                        "serve",
                        "--listen",
                        f"127.0.0.1:{grpc_port}",
                        "--metrics",
                        f"127.0.0.1:{metrics_port}",
                        "--config",
                        str(SHIPPED_QWEN_POLICY),
                        "--grace",
                        "2",
                        "--tokenizer",
                        f"{QWEN_MODEL}={qwen_dir}",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            servers.append((process, grpc_port, metrics_port))
        deadline = time.monotonic() + 60
        for process, _, metrics_port in servers:
            while not _up(f"http://127.0.0.1:{metrics_port}/metrics"):
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        yield [(g, m) for _, g, m in servers]
    finally:
        for process, _, _ in servers:
            process.terminate()
            process.wait(15)


def test_two_ext_proc_processes_share_the_streams(
    two_servers: list[tuple[int, int]], qwen_policy: GatewayPolicy, qwen_dir: Path, tmp_path: Path
) -> None:
    with FakeUpstream(tokenizer_dir=qwen_dir) as upstream:
        listen = free_port()
        settings = EnvoySettings(
            "127.0.0.1", listen, free_port(), two_servers[0][0], Upstream.from_url(upstream.url)
        )
        config = render(load_template(), settings, qwen_policy)
        (extproc,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "extproc"]
        extproc["lb_policy"] = "ROUND_ROBIN"
        extproc["load_assignment"]["endpoints"] = [
            {
                "lb_endpoints": [
                    {
                        "endpoint": {
                            "address": {"socket_address": {"address": "127.0.0.1", "port_value": g}}
                        }
                    }
                    for g, _ in two_servers
                ]
            }
        ]
        path = tmp_path / "envoy.yaml"
        path.write_text(dump(config))
        envoy = subprocess.Popen(
            [
                envoy_binary(),
                "-c",
                str(path),
                "--use-dynamic-base-id",
                "-l",
                "error",
                "--concurrency",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{listen}/v1/embeddings"
            deadline = time.monotonic() + 30
            while True:
                try:
                    if (
                        http("POST", url, {"model": QWEN_MODEL, "input": "warm"}, timeout=2).status
                        == 200
                    ):
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "Envoy did not come up"
                time.sleep(0.2)
            statuses = [
                http("POST", url, {"model": QWEN_MODEL, "input": f"doc {i}"}).status
                for i in range(40)
            ]
        finally:
            envoy.terminate()
            envoy.wait(15)
    assert statuses == [200] * 40
    shares = [
        metric_value(
            http("GET", f"http://127.0.0.1:{m}/metrics").body.decode(), "extproc_requests_total"
        )
        for _, m in two_servers
    ]
    print(f"\n[scale-out] requests per ext_proc process: {shares}")
    assert sum(shares) == 41  # 40 + the warm-up
    assert min(shares) >= 10, shares  # round robin over streams: both take a real share
