"""Scale-out that really spreads load: Envoy's extproc cluster with two ext_proc
server processes as endpoints (round robin). Every HTTP request is its own gRPC
stream, and Envoy balances streams, not connections, across endpoints, so both
processes take a share (SO_REUSEPORT on one address would not: Envoy keeps one
HTTP/2 connection per worker; see docs/envoy-facts.md). This is how a Kubernetes
Service with several pods is used (an Envoy cluster of the pod IPs, e.g. STRICT_DNS
on a headless Service, or EDS from the mesh)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from extproc.core.policy import GatewayPolicy
from testing_support.envoy import EnvoySpec, loopback_settings, rendered
from testing_support.fake_upstream import FakeUpstream
from testing_support.http import http, metric_value
from testing_support.qwen import QWEN_MODEL
from testing_support.serve import Serve, ServeSpec
from tests.harness import Envoys, Servers


@pytest.fixture
def two_servers(servers: Servers) -> Iterator[list[Serve]]:
    spec = ServeSpec(metrics=True, grace=2)
    with servers.own(spec) as first, servers.own(spec) as second:
        yield [first, second]


def test_two_ext_proc_processes_share_the_streams(
    two_servers: list[Serve], qwen_policy: GatewayPolicy, upstream: FakeUpstream, envoys: Envoys
) -> None:
    settings = loopback_settings(upstream.url, two_servers[0].port)
    config = rendered(settings, qwen_policy)
    (extproc,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "extproc"]
    extproc["lb_policy"] = "ROUND_ROBIN"
    extproc["load_assignment"]["endpoints"] = [
        {
            "lb_endpoints": [
                {
                    "endpoint": {
                        "address": {
                            "socket_address": {"address": "127.0.0.1", "port_value": s.port}
                        }
                    }
                }
                for s in two_servers
            ]
        }
    ]
    with envoys.own(EnvoySpec.of(config, "scale-out")) as envoy:
        # Envoy connects to ext_proc on demand: the first request proves the path.
        warm = {"model": QWEN_MODEL, "input": "warm"}
        envoy.process.wait_until(
            lambda: http("POST", envoy.embeddings_url, warm, timeout=2).status == 200, 30
        )
        statuses = [
            http("POST", envoy.embeddings_url, {"model": QWEN_MODEL, "input": f"doc {i}"}).status
            for i in range(40)
        ]
    assert statuses == [200] * 40
    shares = [metric_value(s.metrics(), "extproc_requests_total") for s in two_servers]
    print(f"\n[scale-out] requests per ext_proc process: {shares}")
    assert sum(shares) == 41  # 40 + the warm-up
    assert min(shares) >= 10, shares  # round robin over streams: both take a real share
