"""Every spelling of the embeddings endpoint's path (tests/hostile_corpus.py,
PATH_SPELLINGS) through a real Envoy with the shipped configs, in the split migration
(`--legacy`): each goes through the contract (the Dynamo fake gets the rewritten
request at /v1/embeddings, the client the contract's answer) or is a 404 envelope;
the legacy stand-in never sees one. The legacy server's own paths still reach it, a
`%2F` in them decoded once. Over HTTP/1.1 (raw bytes on the socket: a backslash, the
absolute form) and h2c, in four shapes:

- ``standalone`` and ``single-filter``: `extproc run --envoy-template envoy/<shape>.yaml
  --legacy`.
- ``istio-gateway``: the ingress gateway EnvoyFilter's patches applied, as istiod
  applies them, to a listener shaped like istiod's with its default path
  normalisation (tests/test_deploy_artifacts.py, ``istio_bootstrap``), routed as
  envoy/istio/gateway.yaml's VirtualService routes (embeddings to Dynamo, the rest to
  the legacy server), with the real ext_proc server (`extproc serve`). A control run
  without the patch's path fields shows what it prevents.
- ``envoy-gateway``: single-filter.yaml with what Envoy Gateway makes of
  envoy/gateway/: the HCM path fields its translator derives from the
  ClientTrafficPolicy's ``spec.path``, and the embeddings HTTPRoute's regex as the
  ext_proc route's match; the pass-through route goes to the legacy server.

Plus the HTTP codec's refusal of a Transfer-Encoding it cannot read: a 400 with a
client error code, never Envoy's 501 through a 5xx mapper (the rest of the codec's
refusals: tests/test_hostile_input.py and, for the Istio shapes,
tests/test_deploy_artifacts.py), in every shape.
"""

from __future__ import annotations

import copy
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import orjson
import pytest
import yaml

from extproc.runtime.envoy_config import LEGACY_CLUSTER, Upstream, legacy_cluster
from testing_support.envoy import EnvoySpec
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import GatewaySpec
from testing_support.http import envelope_error
from testing_support.processes import free_port
from testing_support.qwen import QWEN_MODEL, REPO
from testing_support.serve import ServeSpec
from tests.harness import Envoys, Gateways, Servers
from tests.hostile_corpus import LEGACY_PATHS, PATH_SPELLINGS, PathOutcome, PathSpelling
from tests.legacy_stand_in import LegacyStandIn
from tests.test_deploy_artifacts import envoy_filters, istio_bootstrap, load_all
from tests.test_hostile_input import WireReply, exchange

WAIT_S = 30.0
QUERY = {
    "model": QWEN_MODEL,
    "input": "What is the capital city of France?",
    "input_type": "query",
}
INSTRUCTION = b"Instruct: Given a web search query"
RERANK = orjson.dumps({"model": "bge-reranker", "query": "capital", "documents": ["Paris"]})
SHAPES = ["standalone", "single-filter", "istio-gateway", "envoy-gateway"]
PROTOCOLS = ["http1", "h2c"]
# Envoy Gateway's translator: ClientTrafficPolicy spec.path.escapedSlashesAction -> HCM.
ESCAPED_SLASHES_ACTIONS = {
    "KeepUnchanged": "KEEP_UNCHANGED",
    "RejectRequest": "REJECT_REQUEST",
    "UnescapeAndRedirect": "UNESCAPE_AND_REDIRECT",
    "UnescapeAndForward": "UNESCAPE_AND_FORWARD",
}
ENVOY_GATEWAY_DEFAULT_ACTION = "UnescapeAndRedirect"


@dataclass(frozen=True)
class Reply:
    status: int | None
    body: bytes

    def envelope(self) -> dict[str, Any]:
        return envelope_error(self.body)


# -- clients ---------------------------------------------------------------------------


def send_http1(port: int, method: str, target: str, body: bytes | None) -> Reply:
    """One request, its target written on the request line exactly as given."""
    head = f"{method} {target} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    wire = (head + "\r\n").encode("latin-1") + (body or b"")
    reply: WireReply = exchange(port, wire, timeout=WAIT_S)
    return Reply(reply.status, reply.body)


def send_h2c(port: int, method: str, path: str, body: bytes | None) -> Reply:
    """One request over h2c (prior knowledge), `:path` exactly as given (the h2
    library's own header checks are off: a backslash must reach Envoy as sent)."""
    config = h2.config.H2Configuration(
        client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False
    )
    conn = h2.connection.H2Connection(config=config)
    conn.initiate_connection()
    headers = [(":method", method), (":scheme", "http"), (":path", path), (":authority", "gw")]
    if body is not None:
        headers += [("content-type", "application/json"), ("content-length", str(len(body)))]
    conn.send_headers(1, headers, end_stream=body is None)
    if body is not None:
        conn.send_data(1, body, end_stream=True)
    status: int | None = None
    data = b""
    deadline = time.monotonic() + WAIT_S
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(conn.data_to_send())
        ended = False
        while not ended and time.monotonic() < deadline:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            chunk = sock.recv(65536)
            if not chunk:
                break
            for event in conn.receive_data(chunk):
                if isinstance(event, h2.events.ResponseReceived):
                    status = int(dict(event.headers)[b":status"])
                elif isinstance(event, h2.events.DataReceived):
                    data += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, 1)
                elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                    ended = True
            sock.sendall(conn.data_to_send())
    return Reply(status, data)


def send(protocol: str, port: int, method: str, target: str, body: bytes | None) -> Reply:
    return (send_http1 if protocol == "http1" else send_h2c)(port, method, target, body)


# -- the shapes --------------------------------------------------------------------------


@dataclass
class Shape:
    name: str
    port: int


def envoy_gateway_template(folder: Path) -> Path:
    """single-filter.yaml as Envoy Gateway would run envoy/gateway/: its translator
    always sets normalize_path, merges slashes unless ``disableMergeSlashes`` and maps
    ``escapedSlashesAction`` (default UnescapeAndRedirect) to the HCM's enum; the
    ext_proc route matches as the `embeddings` HTTPRoute does."""
    docs = [d for p in sorted((REPO / "envoy" / "gateway").glob("*.yaml")) for d in load_all(p)]
    policy = next(d for d in docs if d["kind"] == "ClientTrafficPolicy")
    route = next(
        d for d in docs if d["kind"] == "HTTPRoute" and d["metadata"]["name"] == "embeddings"
    )
    config = yaml.safe_load((REPO / "envoy" / "single-filter.yaml").read_text())
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]
    path = policy["spec"].get("path", {})
    for field in ("normalize_path", "merge_slashes", "path_with_escaped_slashes_action"):
        hcm.pop(field, None)
    hcm["normalize_path"] = True
    hcm["merge_slashes"] = not path.get("disableMergeSlashes", False)
    action = path.get("escapedSlashesAction", ENVOY_GATEWAY_DEFAULT_ACTION)
    hcm["path_with_escaped_slashes_action"] = ESCAPED_SLASHES_ACTIONS[action]
    (match,) = route["spec"]["rules"][0]["matches"]
    assert match["path"]["type"] == "RegularExpression"
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    (embeddings,) = [r for r in routes if r["name"] == "embeddings"]
    embeddings["match"] = {"safe_regex": {"regex": match["path"]["value"]}}
    template = folder / "envoy-gateway.yaml"
    template.write_text(yaml.safe_dump(config, sort_keys=False))
    return template


def istio_gateway_config(
    *, listen: int, admin: int, dynamo: str, legacy: str, extproc_port: int, patched_paths: bool
) -> dict[str, Any]:
    """The ingress gateway EnvoyFilter applied to an istiod-like listener, routed as
    the VirtualService of envoy/istio/gateway.yaml routes. ``patched_paths=False``
    leaves out the patch's path fields: istiod's defaults stay."""
    doc = copy.deepcopy(
        next(
            d
            for _, d in envoy_filters()
            if d["spec"]["configPatches"][0]["match"]["context"] == "GATEWAY"
        )
    )
    if not patched_paths:
        for patch in doc["spec"]["configPatches"]:
            if patch["applyTo"] == "NETWORK_FILTER":
                typed = patch["patch"]["value"]["typed_config"]
                for field in (
                    "normalize_path",
                    "merge_slashes",
                    "path_with_escaped_slashes_action",
                ):
                    del typed[field]
    dynamo_port = int(dynamo.rsplit(":", 1)[1])
    bootstrap = istio_bootstrap(
        doc,
        listen_port=listen,
        admin_port=admin,
        upstream_port=dynamo_port,
        extproc_port=extproc_port,
    )
    (listener,) = bootstrap["static_resources"]["listeners"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    (vhost,) = hcm["route_config"]["virtual_hosts"]
    (default_route,) = vhost["routes"]
    dynamo_cluster = default_route["route"]["cluster"]
    virtual_service = next(
        d
        for d in load_all(REPO / "envoy" / "istio" / "gateway.yaml")
        if d["kind"] == "VirtualService"
    )
    routes: list[dict[str, Any]] = []
    for rule in virtual_service["spec"]["http"]:
        host = rule["route"][0]["destination"]["host"]
        cluster = dynamo_cluster if host.startswith("dynamo-frontend.") else LEGACY_CLUSTER
        for match in rule.get("match", [{"uri": {"prefix": "/"}}]):
            ((kind, value),) = match["uri"].items()
            routes.append(
                {
                    "match": {"path" if kind == "exact" else kind: value},
                    "route": {"cluster": cluster, "timeout": "300s"},
                }
            )
    vhost["routes"] = routes
    bootstrap["static_resources"]["clusters"].append(legacy_cluster(Upstream.from_url(legacy)))
    return bootstrap


@pytest.fixture(scope="module")
def dynamo(upstream: FakeUpstream) -> FakeUpstream:
    return upstream


@pytest.fixture(scope="module")
def extproc_server(servers: Servers) -> int:
    """`extproc serve` with the shipped policy, for the Istio shape: its port."""
    return servers.shared(ServeSpec()).port


def istio_envoy(
    dynamo: str, legacy: str, extproc_port: int, *, patched_paths: bool, name: str
) -> tuple[EnvoySpec, int]:
    """The Istio shape's Envoy (:func:`istio_gateway_config`) on free ports, and the
    port it listens on."""
    listen, admin = free_port(), free_port()
    bootstrap = istio_gateway_config(
        listen=listen,
        admin=admin,
        dynamo=dynamo,
        legacy=legacy,
        extproc_port=extproc_port,
        patched_paths=patched_paths,
    )
    return EnvoySpec.of(bootstrap, name, concurrency=None), listen


@pytest.fixture(scope="module", params=SHAPES)
def shape(
    request: pytest.FixtureRequest,
    dynamo: FakeUpstream,
    legacy: LegacyStandIn,
    gateways: Gateways,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Shape]:
    name = str(request.param)
    folder = tmp_path_factory.mktemp(name)
    if name == "istio-gateway":
        extproc_port = request.getfixturevalue("extproc_server")
        spec, listen = istio_envoy(
            dynamo.url, legacy.url, extproc_port, patched_paths=True, name=name
        )
        envoys: Envoys = request.getfixturevalue("envoys")
        with envoys.own(spec, folder=folder):
            yield Shape(name, listen)
        return
    if name == "envoy-gateway":
        spec = GatewaySpec(dynamo.url, shape=envoy_gateway_template(folder), legacy=legacy.url)
        with gateways.own(spec, folder=folder) as gw:
            yield Shape(name, gw.port)
        return
    # The shipped shapes: the split migration's gateways (tests/test_split_migration.py).
    gw = gateways.shared(GatewaySpec(dynamo.url, shape=name, legacy=legacy.url))
    yield Shape(name, gw.port)


@pytest.fixture(autouse=True)
def clean(dynamo: FakeUpstream, legacy: LegacyStandIn) -> None:
    dynamo.reset()
    legacy.reset()


# -- the spellings -------------------------------------------------------------------------

CASES = [
    pytest.param(case, protocol, id=f"{protocol}:{case.target}")
    for case in PATH_SPELLINGS
    for protocol in PROTOCOLS
    if protocol == "http1" or not case.http1_only
]


@pytest.mark.parametrize("case,protocol", CASES)
def test_each_spelling_goes_through_the_contract_or_is_refused(
    case: PathSpelling,
    protocol: str,
    shape: Shape,
    dynamo: FakeUpstream,
    legacy: LegacyStandIn,
) -> None:
    reply = send(protocol, shape.port, "POST", case.target, orjson.dumps(QUERY))
    assert legacy.state.seen == [], [s.target for s in legacy.state.seen]
    if case.outcome is PathOutcome.CONTRACT:
        assert reply.status == 200, reply
        (item,) = orjson.loads(reply.body)["data"]
        assert len(item["embedding"]) == 1024
        (received,) = dynamo.received
        assert received.path == "/v1/embeddings"
        assert INSTRUCTION in received.body and b"input_type" not in received.body
    else:
        assert reply.status == 404, reply
        error = reply.envelope()
        assert (error["type"], error["code"]) == ("invalid_request_error", "unknown_url"), error
        assert dynamo.received == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("target", list(LEGACY_PATHS))
def test_legacy_paths_still_reach_the_legacy_server(
    target: str, protocol: str, shape: Shape, dynamo: FakeUpstream, legacy: LegacyStandIn
) -> None:
    reply = send(protocol, shape.port, "POST", target, RERANK)
    assert reply.status in (200, 404), reply  # the stand-in's own answer
    assert [s.target for s in legacy.state.seen] == [LEGACY_PATHS[target]]
    assert dynamo.received == []


# -- the Istio patch, proven by its absence --------------------------------------------------


def test_without_the_patch_istio_sends_an_escaped_slash_to_the_legacy_server(
    dynamo: FakeUpstream,
    legacy: LegacyStandIn,
    extproc_server: int,
    envoys: Envoys,
) -> None:
    """istiod's default normalisation (BASE: normalize_path only) keeps `%2F`: the
    filter's matcher skips `/v1%2Fembeddings` and the catch-all route sends it to the
    legacy server as sent, whose uvicorn would serve it from its /v1/embeddings."""
    spec, listen = istio_envoy(
        dynamo.url, legacy.url, extproc_server, patched_paths=False, name="istio-unpatched"
    )
    with envoys.own(spec):
        reply = send_http1(listen, "POST", "/v1%2Fembeddings", orjson.dumps(QUERY))
        assert reply.status == 404  # the stand-in's answer: it has no such path
        assert [s.target for s in legacy.state.seen] == ["/v1%2Fembeddings"]
        assert dynamo.received == []


# -- the HTTP codec's refusals, in every shape -----------------------------------------------

TRANSFER_ENCODINGS = {
    "chunked, identity": "unsupported_transfer_encoding",
    "identity": "unsupported_transfer_encoding",
    "gzip, chunked": "unsupported_transfer_encoding",
}


@pytest.mark.parametrize("coding", list(TRANSFER_ENCODINGS))
def test_a_transfer_coding_envoy_cannot_read_is_a_client_error(
    coding: str, shape: Shape, dynamo: FakeUpstream, legacy: LegacyStandIn
) -> None:
    body = orjson.dumps(QUERY)
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    wire = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        f"Transfer-Encoding: {coding}\r\n\r\n"
    ).encode() + (chunked if "chunked" in coding else body)
    reply = exchange(shape.port, wire, timeout=WAIT_S)
    assert dynamo.received == [] and legacy.state.seen == []
    assert reply.status == 400, reply
    error = Reply(reply.status, reply.body).envelope()
    assert (error["type"], error["code"]) == ("invalid_request_error", TRANSFER_ENCODINGS[coding])
