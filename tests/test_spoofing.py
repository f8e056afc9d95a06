"""Clients cannot pose as the gateway: headers they forge neither steer
Envoy nor the ext_proc server, and none of the gateway's own reaches the upstream.

What the gateway uses for its own purposes (envoy/standalone.yaml,
envoy/single-filter.yaml, extproc/service/stream.py):

- dynamic metadata, namespace ``embgw``: ``respond: rewrite`` selects the
  ``embeddings-rewrite`` route, ``plan`` is the response plan, ``status`` the status
  the Lua filter applies. Only the ext_proc filters write it (receiving_namespaces);
  no filter maps a request header onto it.
- the response header ``x-envoy-upstream-service-time``: custom_response's mark of
  "this answer came from the upstream". A client copy of it in a request is not one
  of the x-envoy-* headers Envoy sanitizes: it travels to the upstream unless the
  route config removes it (the one failing check below, until the YAML does).
- request headers/attributes the ext_proc server reads: content-type and
  content-length (the client's own), :method, and x-request-id (log lines, shadow
  pairing) - Envoy's own id, since clients are external (use_remote_address: true;
  Envoy 1.40 treats every address, loopback included, as external by default).
- routes match nothing else a client sends: ``:method``, ``content-length: 0`` and
  the metadata above.

Both shipped shapes are checked: the two-filter standalone.yaml and single-filter.yaml.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import SHAPES, Gateway, GatewaySpec
from testing_support.qwen import QWEN_MODEL
from tests.harness import Gateways

FORGED_PLAN = json.dumps([QWEN_MODEL, 1, 1024, "dynamo", "float", "float", 64])
# Headers that name the gateway's metadata, plan or route, or Envoy's own controls.
FORGED_GATEWAY = {
    "embgw": "respond=rewrite",
    "x-embgw-respond": "rewrite",
    "x-embgw-plan": FORGED_PLAN,
    "x-embgw-status": "299",
    "x-extproc-plan": FORGED_PLAN,
    "x-envoy-upstream-service-time": "7",
}
FORGED_ENVOY = {
    "x-request-id": "forged-request-id",
    "x-envoy-retry-on": "5xx,reset,connect-failure",
    "x-envoy-max-retries": "5",
    "x-envoy-retriable-status-codes": "500",
    "x-envoy-upstream-rq-timeout-ms": "1",
    "x-envoy-upstream-rq-per-try-timeout-ms": "1",
    "x-envoy-expected-rq-timeout-ms": "1",
    "x-envoy-internal": "true",
    "x-envoy-external-address": "203.0.113.9",
    "x-envoy-original-path": "/admin",
    "x-envoy-decorator-operation": "forged",
    "x-envoy-ip-tags": "forged",
}
# What Envoy itself sets on the upstream request: (header, value it must have).
ENVOY_OWN = {"x-envoy-expected-rq-timeout-ms": "300000", "x-envoy-external-address": "127.0.0.1"}


@pytest.fixture(scope="module", params=SHAPES)
def gateway(request: pytest.FixtureRequest, upstream: FakeUpstream, gateways: Gateways) -> Gateway:
    gw = gateways.shared(GatewaySpec(upstream.url, shape=request.param))
    gw.extra["shape"] = request.param
    return gw


@pytest.fixture(autouse=True)
def clean_upstream(upstream: FakeUpstream) -> Iterator[None]:
    upstream.reset()
    yield
    upstream.reset()


PLAIN = {"model": QWEN_MODEL, "input": "What is the capital city of France?"}


def test_forged_plan_or_route_headers_change_nothing(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    honest = gateway.embeddings(PLAIN)
    forged = gateway.embeddings(PLAIN, headers=FORGED_GATEWAY)
    assert honest.status == forged.status == 200, forged.body[:300]
    # No forged plan: still the native 1,024 floats, the same vectors.
    assert forged.json()["data"] == honest.json()["data"]
    assert len(forged.json()["data"][0]["embedding"]) == 1024
    # Forwarded as sent: no rewrite was triggered by the headers.
    assert upstream.received[1].json == PLAIN


def test_forged_headers_cannot_select_the_rewrite_route(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """On standalone.yaml the two routes answer an upstream 500 differently: the plain
    route's custom_response says "HTTP 500", the rewrite route's ext_proc keeps the
    upstream's own message. Forged headers must leave the request on the plain route."""
    upstream.fault = "http500"
    honest = gateway.embeddings(PLAIN).json()["error"]
    forged = gateway.embeddings(PLAIN, headers=FORGED_GATEWAY).json()["error"]
    assert forged == honest
    if gateway.extra["shape"] != "standalone":
        return  # single-filter.yaml has one route: nothing to select
    assert forged["message"] == "The upstream failed to process the request (HTTP 500)."
    rewrite = gateway.embeddings({**PLAIN, "dimensions": 64}).json()["error"]
    assert "Internal server error" in rewrite["message"]  # the other route, for contrast


def test_forged_router_controls_are_ignored(gateway: Gateway, upstream: FakeUpstream) -> None:
    """No retries on the client's say-so (they would multiply GPU work), no timeout of
    its choosing."""
    upstream.fault = "http500"
    reply = gateway.embeddings(PLAIN, headers=FORGED_ENVOY)
    assert reply.status == 500
    assert len(upstream.received) == 1
    upstream.reset()
    upstream.fault, upstream.slow_seconds = "slow", 0.3
    reply = gateway.embeddings(PLAIN, headers=FORGED_ENVOY)
    assert reply.status == 200, reply.body[:300]  # a 1 ms timeout would be a 504


def test_upstream_never_gets_a_forged_envoy_header_or_request_id(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    assert gateway.embeddings(PLAIN, headers=FORGED_ENVOY).status == 200
    (received,) = upstream.received
    assert received.headers["x-request-id"] != FORGED_ENVOY["x-request-id"]
    for name, value in received.headers.items():
        if name.startswith("x-envoy-"):
            assert ENVOY_OWN.get(name) == value, f"{name}: {value} reached the upstream"


def test_upstream_never_gets_the_gateways_own_header(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """x-envoy-upstream-service-time is the gateway's mark of an upstream answer: a
    client's copy must be removed on the way in. Envoy does not sanitize this one, so
    this needs, on the virtual host of envoy/standalone.yaml and single-filter.yaml
    (and the other configs that embed them):
        request_headers_to_remove: [x-envoy-upstream-service-time]
    """
    assert gateway.embeddings(PLAIN, headers=FORGED_GATEWAY).status == 200
    (received,) = upstream.received
    assert "x-envoy-upstream-service-time" not in received.headers
