"""Render the shipped shadow configs (envoy/shadow.yaml, envoy/shadow-reverse.yaml). Pure.

The shipped files are complete configs that validate on their own; here they are
loaded and only addresses, the shadowed share (the ``runtime_fraction`` of the
primary listener's ``embeddings-shadowed`` route), the noise replica's share,
timeouts and size limits are patched, by listener, cluster and route names, so what
runs is what CI validated; with a rerank candidate, the policy's rerank routes are
added (``rerank-shadowed``, and the gateway's rerank route); for a policy whose models
serve embeddings dialects' paths, those paths' routes (``dialects-shadowed``, and the
gateway's dialects route to the candidate).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple

from extproc.core.policy.model import GatewayPolicy
from extproc.runtime.envoy_config import (
    DEFAULT_TEMPLATE,
    LEGACY_CLUSTER,
    PASSTHROUGH_ROUTE,
    Upstream,
    add_dialects_route,
    add_rerank_route,
    dialect_path_pattern,
    legacy_cluster,
    point_cluster,
    rerank_path_pattern,
)

ENVOY_DIR: Final = DEFAULT_TEMPLATE.parent
SHADOW_TEMPLATE: Final = ENVOY_DIR / "shadow.yaml"
REVERSE_TEMPLATE: Final = ENVOY_DIR / "shadow-reverse.yaml"
# The gateway the shadow files embed, verbatim but for the upstream cluster's name
# (tests/test_shadow_core.py checks it): one ext_proc filter, as meshes use it.
EMBEDDED_GATEWAY: Final = ENVOY_DIR / "single-filter.yaml"
TAP_FILTER: Final = "shadow.tap"
RERANK_SHADOWED_ROUTE: Final = "rerank-shadowed"
DIALECTS_SHADOWED_ROUTE: Final = "dialects-shadowed"
_EXT_PROC: Final = ".ext_proc.v3.ExternalProcessor"
_BUFFER: Final = ".buffer.v3.Buffer"
_TLS_CONTEXT: Final = (
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
)
_LOOPBACK: Final = "127.0.0.1"


def template_path(*, reverse: bool) -> Path:
    return REVERSE_TEMPLATE if reverse else SHADOW_TEMPLATE


@dataclass(frozen=True)
class ShadowEnvoySettings:
    listen_host: str
    listen_port: int
    admin_port: int
    shadow_port: int  # loopback listener the mirror goes to
    noise_port: int  # loopback listener of the noise mirror
    extproc_port: int  # the contract gateway's ext_proc server
    compare: tuple[tuple[str, int], ...]  # comparator replicas (gRPC)
    baseline: Upstream
    candidate: Upstream
    noise: Upstream | None = None
    percent: float = 100.0
    candidate_gateway_port: int = 0  # config B only: the gateway's loopback listener
    upstream_timeout_s: float = 300.0
    # Split migration: the clients' non-embeddings paths go to this server untouched.
    legacy: Upstream | None = None
    # The candidate's reranker: the policy's rerank paths are shadowed too, the legacy
    # side answered by the server that answers them today (``legacy``, else baseline).
    rerank_candidate: Upstream | None = None


def adopt_gateway(config: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a shadow config) with its contract-gateway parts taken from
    ``gateway`` (a shipped gateway config: single-filter.yaml, standalone.yaml): the
    gateway listener's routes, local replies and HTTP filters (kept after the tap),
    the client-facing local replies of the reverse config, and every cluster of
    ``gateway`` but its ``upstream`` (which is the shadow config's ``candidate``)."""
    config = copy.deepcopy(config)
    (source,) = gateway["static_resources"]["listeners"]
    source_hcm = hcm_of(source)
    route_config = copy.deepcopy(source_hcm["route_config"])
    for route in hcm_routes({"route_config": route_config}):
        if route.get("route", {}).get("cluster") == "upstream":
            route["route"]["cluster"] = "candidate"
    for listener in config["static_resources"]["listeners"]:
        hcm = hcm_of(listener)
        clusters = {route.get("route", {}).get("cluster") for route in hcm_routes(hcm)}
        if "candidate" in clusters:  # the gateway's listener
            taps = [f for f in hcm["http_filters"] if f["name"] == TAP_FILTER]
            hcm["http_filters"] = taps + copy.deepcopy(source_hcm["http_filters"])
            hcm["route_config"] = copy.deepcopy(route_config)
        if clusters & {"candidate", "candidate_gateway"}:  # what clients of it see
            if "local_reply_config" in source_hcm:
                hcm["local_reply_config"] = copy.deepcopy(source_hcm["local_reply_config"])
            else:
                hcm.pop("local_reply_config", None)
    clusters = config["static_resources"]["clusters"]
    index = {cluster["name"]: i for i, cluster in enumerate(clusters)}
    for cluster in gateway["static_resources"]["clusters"]:
        if cluster["name"] == "upstream":
            continue
        if cluster["name"] in index:
            clusters[index[cluster["name"]]] = copy.deepcopy(cluster)
        else:
            clusters.append(copy.deepcopy(cluster))
    return config


def render_shadow(
    template: dict[str, Any],
    settings: ShadowEnvoySettings,
    policy: GatewayPolicy,
    *,
    gateway: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Patch a shadow config for these addresses and this policy; with ``gateway``, run
    that gateway config on the candidate side instead of the one the file embeds."""
    if not 0 <= settings.percent <= 100:
        raise ValueError("percent must be within 0..100")
    if not settings.compare:
        raise ValueError("at least one comparator address is needed")
    config = adopt_gateway(template, gateway) if gateway is not None else copy.deepcopy(template)
    config["admin"]["address"]["socket_address"] = _socket(_LOOPBACK, settings.admin_port)
    resources = config["static_resources"]
    listeners = {item["name"]: item for item in resources["listeners"]}
    clusters = {item["name"]: item for item in resources["clusters"]}
    reverse = "candidate_gateway" in clusters

    response_limit = policy.max_response_bytes()
    message_limit = policy.max_message_bytes()
    ports = {
        "primary": (settings.listen_host, settings.listen_port),
        "shadow": (_LOOPBACK, settings.shadow_port),
        "noise": (_LOOPBACK, settings.noise_port),
    }
    if reverse:
        if not settings.candidate_gateway_port:
            raise ValueError("the reverse config needs candidate_gateway_port")
        ports["candidate"] = (_LOOPBACK, settings.candidate_gateway_port)
    for name, (host, port) in ports.items():
        listeners[name]["address"]["socket_address"] = _socket(host, port)
    timeout = f"{settings.upstream_timeout_s:g}s"
    outer_timeout = f"{settings.upstream_timeout_s + 5:g}s"
    for listener in listeners.values():
        listener["per_connection_buffer_limit_bytes"] = response_limit
        hcm = hcm_of(listener)
        outer = reverse and listener["name"] == "primary"
        for route in hcm_routes(hcm):
            if "request_body_buffer_limit" in route:
                route["request_body_buffer_limit"] = policy.limits.max_request_bytes
            if "route" in route:
                route["route"]["timeout"] = outer_timeout if outer else timeout
            if "runtime_fraction" in route.get("match", {}):  # the shadowed share
                route["match"]["runtime_fraction"]["default_value"] = _fraction(settings.percent)
            for mirror in route.get("route", {}).get("request_mirror_policies", []):
                if "runtime_fraction" in mirror:  # the noise replica's share of it
                    share = 100.0 if settings.noise is not None else 0.0
                    mirror["runtime_fraction"]["default_value"] = _fraction(share)
        for http_filter in hcm["http_filters"]:
            typed = http_filter.get("typed_config", {})
            kind = str(typed.get("@type", ""))
            if kind.endswith(_EXT_PROC) and http_filter["name"] != TAP_FILTER:
                typed["grpc_service"]["envoy_grpc"]["max_receive_message_length"] = message_limit
            elif kind.endswith(_BUFFER):
                typed["max_request_bytes"] = policy.limits.max_request_bytes

    upstreams = {"baseline": settings.baseline, "candidate": settings.candidate}
    upstreams["noise"] = settings.noise or settings.baseline  # unused at 0 %
    for name, upstream in upstreams.items():
        cluster = clusters[name]
        cluster["per_connection_buffer_limit_bytes"] = response_limit
        point_cluster(cluster, [(upstream.host, upstream.port)])
        if upstream.tls:
            cluster["transport_socket"] = {
                "name": "envoy.transport_sockets.tls",
                "typed_config": {"@type": _TLS_CONTEXT, "sni": upstream.host},
            }
        else:
            cluster.pop("transport_socket", None)
    point_cluster(clusters["shadow_listener"], [(_LOOPBACK, settings.shadow_port)])
    point_cluster(clusters["noise_listener"], [(_LOOPBACK, settings.noise_port)])
    if reverse:
        point_cluster(clusters["candidate_gateway"], [(_LOOPBACK, settings.candidate_gateway_port)])
    for name in ("shadow_listener", "noise_listener", "candidate_gateway"):
        if name in clusters:
            clusters[name]["per_connection_buffer_limit_bytes"] = response_limit
    clusters["extproc"]["per_connection_buffer_limit_bytes"] = message_limit
    point_cluster(clusters["extproc"], [(_LOOPBACK, settings.extproc_port)])
    point_cluster(clusters["shadow_compare"], settings.compare)
    if settings.legacy is not None:
        _route_primary_passthrough_to_legacy(config, listeners["primary"], settings.legacy)
    if settings.rerank_candidate is not None:
        _shadow_rerank(config, listeners, policy, settings, reverse=reverse)
    _shadow_dialects(listeners, policy, settings, reverse=reverse)
    return config


def _shadow_rerank(
    config: dict[str, Any],
    listeners: dict[str, dict[str, Any]],
    policy: GatewayPolicy,
    settings: ShadowEnvoySettings,
    *,
    reverse: bool,
) -> None:
    """The policy's rerank paths (POST) shadowed as the embeddings endpoint is: on the
    clients' listener a ``rerank-shadowed`` route (the same ``shadow.percent`` share,
    tapped, mirrored to the shadow listener) before the pass-through, which takes the
    rest as before; the gateway's listener gets its rerank route to the candidate's
    reranker; in the reverse config the shadow listener sends the mirror to the legacy
    side, tapped."""
    pattern = rerank_path_pattern(policy)
    assert settings.rerank_candidate is not None
    if not pattern:
        return
    gateway = listeners["candidate" if reverse else "shadow"]
    add_rerank_route(
        hcm_of(gateway)["route_config"],
        config,
        policy,
        settings.rerank_candidate,
        base_cluster="candidate",
    )
    shadowed = Shadowed(pattern, RERANK_SHADOWED_ROUTE, "rerank")
    _shadow_paths(listeners, policy, settings, shadowed, reverse=reverse)


def _shadow_dialects(
    listeners: dict[str, dict[str, Any]],
    policy: GatewayPolicy,
    settings: ShadowEnvoySettings,
    *,
    reverse: bool,
) -> None:
    """The paths the models' ``serves`` add besides OpenAI's (POST) shadowed as the
    rerank paths are: ``dialects-shadowed`` on the clients' listener, the gateway's
    dialects route to the candidate (the ext_proc server asks it in OpenAI's terms),
    and in the reverse config the mirror's route to the legacy side. Nothing changes
    for a policy without such paths."""
    pattern = dialect_path_pattern(policy)
    if not pattern:
        return
    gateway = listeners["candidate" if reverse else "shadow"]
    add_dialects_route(hcm_of(gateway)["route_config"], policy, cluster="candidate")
    shadowed = Shadowed(pattern, DIALECTS_SHADOWED_ROUTE, "dialects")
    _shadow_paths(listeners, policy, settings, shadowed, reverse=reverse)


class Shadowed(NamedTuple):
    """Paths shadowed beside the embeddings endpoint, and the names of their routes."""

    pattern: str  # the paths, as a regex
    name: str  # the clients' listener's route
    back_name: str  # the shadow listener's route back to the legacy side (reverse)


def _shadow_paths(
    listeners: dict[str, dict[str, Any]],
    policy: GatewayPolicy,
    settings: ShadowEnvoySettings,
    shadowed: Shadowed,
    *,
    reverse: bool,
) -> None:
    """On the clients' listener a ``name`` route for ``pattern`` (POST; the same
    ``shadow.percent`` share, tapped, mirrored to the shadow listener) before the
    pass-through, to the legacy side (the candidate gateway in the reverse config); in
    the reverse config the shadow listener's ``back_name`` route sends the mirror to
    the legacy side, tapped."""
    pattern, name, back_name = shadowed
    legacy_side = LEGACY_CLUSTER if settings.legacy is not None else "baseline"
    match = {
        "safe_regex": {"regex": pattern},
        "headers": [{"name": ":method", "string_match": {"exact": "POST"}}],
    }
    routes = hcm_routes(hcm_of(listeners["primary"]))
    passthrough = next(r for r in routes if r.get("name") == PASSTHROUGH_ROUTE)
    (vhost,) = hcm_of(listeners["primary"])["route_config"]["virtual_hosts"]
    vhost["routes"].insert(
        vhost["routes"].index(passthrough),
        {
            "name": name,
            "match": {
                **match,
                "runtime_fraction": {
                    "default_value": _fraction(settings.percent),
                    "runtime_key": "shadow.percent",
                },
            },
            "route": {
                "cluster": "candidate_gateway" if reverse else legacy_side,
                "timeout": passthrough["route"]["timeout"],
                "request_mirror_policies": [{"cluster": "shadow_listener"}],
            },
            "request_body_buffer_limit": policy.limits.max_request_bytes,
        },
    )
    if reverse:
        (shadow_vhost,) = hcm_of(listeners["shadow"])["route_config"]["virtual_hosts"]
        timeout = shadow_vhost["routes"][0]["route"]["timeout"]
        route = {"cluster": legacy_side, "timeout": timeout}
        shadow_vhost["routes"].append({"name": back_name, "match": match, "route": route})


def _route_primary_passthrough_to_legacy(
    config: dict[str, Any], primary: dict[str, Any], legacy: Upstream
) -> None:
    """The clients' listener sends every non-embeddings path (``passthrough``) to the
    legacy server, untouched and streamed, as ``extproc run --legacy`` does: without it
    that route goes to the baseline (forward mode) or the candidate gateway (reverse)."""
    (route,) = [r for r in hcm_routes(hcm_of(primary)) if r.get("name") == PASSTHROUGH_ROUTE]
    route["route"]["cluster"] = LEGACY_CLUSTER
    config["static_resources"]["clusters"].append(legacy_cluster(legacy))


def _fraction(percent: float) -> dict[str, Any]:
    if float(percent).is_integer():
        return {"numerator": int(percent), "denominator": "HUNDRED"}
    return {"numerator": round(percent * 10_000), "denominator": "MILLION"}


def hcm_of(listener: dict[str, Any]) -> dict[str, Any]:
    typed: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return typed


def hcm_routes(hcm: dict[str, Any]) -> list[dict[str, Any]]:
    return [route for vhost in hcm["route_config"]["virtual_hosts"] for route in vhost["routes"]]


def _socket(host: str, port: int) -> dict[str, Any]:
    return {"address": host, "port_value": port}
