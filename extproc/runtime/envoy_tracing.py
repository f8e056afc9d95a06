"""Envoy's OpenTelemetry tracer in a config `extproc run --tracing` renders.

Every HTTP connection manager gets Envoy's OpenTelemetry tracer, sending over OTLP/gRPC
to an ``otel_collector`` cluster at the collector the OTEL_* environment names (the
same one the ext_proc workers export to). With a tracer on, Envoy starts a span per
request, a child span for its ext_proc gRPC call, and puts that span's W3C context
(``traceparent``) in the call's metadata: the ext_proc server's span joins the trace
there (extproc/service/tracing.py).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from typing import Any

from extproc.runtime.envoy_config import Upstream, dns_cluster

COLLECTOR_CLUSTER = "otel_collector"
DEFAULT_ENDPOINT = "http://localhost:4317"  # OpenTelemetry's default for OTLP/gRPC
_HCM = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_OTEL_CONFIG = "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig"
_HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def collector(environ: Mapping[str, str] = os.environ) -> Upstream:
    """The OTLP/gRPC collector the OTEL_* environment names (traces' own endpoint
    first), as OpenTelemetry's exporters read it; raises ValueError for a bad URL."""
    url = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or DEFAULT_ENDPOINT
    )
    return Upstream.from_url(url.rstrip("/"))


def with_tracing(
    config: dict[str, Any], endpoint: Upstream, service_name: str = "envoy"
) -> dict[str, Any]:
    """A copy of ``config`` whose connection managers trace to ``endpoint``."""
    config = copy.deepcopy(config)
    managers = [
        network_filter["typed_config"]
        for listener in config["static_resources"]["listeners"]
        for chain in listener.get("filter_chains", [])
        for network_filter in chain.get("filters", [])
        if str(network_filter.get("typed_config", {}).get("@type", "")).endswith(_HCM)
    ]
    if not managers:
        raise ValueError("the config has no HTTP connection manager to trace")
    for manager in managers:
        manager["tracing"] = {
            "provider": {
                "name": "envoy.tracers.opentelemetry",
                "typed_config": {
                    "@type": _OTEL_CONFIG,
                    "grpc_service": {
                        "envoy_grpc": {"cluster_name": COLLECTOR_CLUSTER},
                        "timeout": "1s",
                    },
                    "service_name": service_name,
                },
            }
        }
    clusters: list[dict[str, Any]] = config["static_resources"]["clusters"]
    if any(cluster["name"] == COLLECTOR_CLUSTER for cluster in clusters):
        raise ValueError(f"the config already has a {COLLECTOR_CLUSTER!r} cluster")
    cluster = dns_cluster(COLLECTOR_CLUSTER, endpoint)
    cluster["typed_extension_protocol_options"] = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": _HTTP_OPTIONS,
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }
    clusters.append(cluster)
    return config
