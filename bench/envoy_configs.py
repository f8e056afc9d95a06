"""The Envoy configs of the cases: each rendered from a shipped template, then adjusted.

- S: envoy/standalone.yaml as ``render`` makes it (the shipped gateway).
- B: envoy/single-filter.yaml without the ext_proc filter, its per-route entries and its
  cluster: the same listener, routes and limits, so B differs from the others only by
  ext_proc.
- N: envoy/single-filter.yaml with every phase sent and both bodies buffered on every
  request (the naive gateway).
- S-n, F-n (with a ``NativeTarget``): S and F rendered with the native policy, in
  front of the upstream's native port (it cuts ``dimensions`` itself); S-n's
  ext_proc is the server started with that policy.
- T: S without its `precheck` filter: the previous emulated-rewrite pattern, two
  one-message streams (the request's; then the response's, opened after a re-route).
- F, Z, U: S, N and T pointed at the do-nothing floor processor.
- L: S pointed at the floor processor's library-work listener (bench/library_floor.py).
- S2, S-n2 (with worker ports): S and S-n whose ext_proc cluster lists two `extproc
  serve` processes, as `extproc run --workers 2` renders it (``with_extproc_workers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.workloads import REPO
from extproc.runtime.envoy_config import (
    EnvoySettings,
    Upstream,
    load_template,
    render,
    with_extproc_workers,
)
from extproc.service.net import free_port
from extproc.service.policy_file import load_policy_file

EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
PRECHECK_FILTER = "precheck"
FLOORS = ("F", "Z", "U", "F-n")


@dataclass(frozen=True)
class NativeTarget:
    """What S-n and F-n point at: the upstream's native port, the ext_proc server
    started with the native policy, that policy, and the floor's native port."""

    upstream_port: int
    extproc_port: int
    policy_path: Path
    floor_port: int = 0
    worker_ports: tuple[int, ...] = ()  # S-n2's `extproc serve` processes


def envoy_configs(
    upstream_port: int,
    extproc_port: int,
    policy_path: Path,
    floor_port: int = 0,
    native: NativeTarget | None = None,
    *,
    library_port: int = 0,
    worker_ports: tuple[int, ...] = (),
) -> dict[str, tuple[dict[str, Any], int, int]]:
    """B, N, S, T (and F, Z, U with a floor port; L with a library port; S-n, F-n with
    ``native``; S2 with worker ports, S-n2 with ``native``'s): (config, listen port,
    admin port) each."""
    policies = {False: load_policy_file(policy_path)}
    if native is not None:
        policies[True] = load_policy_file(native.policy_path)
    shipped = load_template()
    single = load_template(REPO / "envoy" / "single-filter.yaml")
    names = ["B", "N", "S", "T", *(("F", "Z", "U") if floor_port else ())]
    names += ["L"] if library_port else []
    names += ["S2"] if worker_ports else []
    if native is not None:
        names += ["S-n", *(("F-n",) if floor_port else ())]
        names += ["S-n2"] if native.worker_ports else []
    configs = {}
    for name in names:
        is_native = name.startswith("S-n") or name == "F-n"
        to_upstream = native.upstream_port if native and is_native else upstream_port
        to_extproc = native.extproc_port if native and is_native else extproc_port
        to_floor = native.floor_port if native and is_native else floor_port
        settings = EnvoySettings(
            listen_host="127.0.0.1",
            listen_port=free_port(),
            admin_port=free_port(),
            extproc_port=(
                library_port if name == "L" else to_floor if name in FLOORS else to_extproc
            ),
            upstream=Upstream("127.0.0.1", to_upstream, tls=False),
        )
        template = single if name in ("B", "N", "Z") else shipped
        config = render(template, settings, policies[is_native])
        if name == "S2":
            config = with_extproc_workers(config, worker_ports)
        elif name == "S-n2" and native is not None:
            config = with_extproc_workers(config, native.worker_ports)
        elif name in ("T", "U"):
            strip_precheck(config)
        elif name == "B":
            strip_ext_proc(config)
        elif name in ("N", "Z"):
            make_naive(config)
        configs[name] = (config, settings.listen_port, settings.admin_port)
    return configs


def _hcm(config: dict[str, Any]) -> dict[str, Any]:
    (listener,) = config["static_resources"]["listeners"]
    hcm: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm


def make_naive(config: dict[str, Any]) -> None:
    """Every phase sent, both bodies buffered, on every request; no mode_override."""
    for http_filter in _hcm(config)["http_filters"]:
        if http_filter["name"] == EXT_PROC_FILTER:
            typed = http_filter["typed_config"]
            typed["processing_mode"] = {
                "request_header_mode": "SEND",
                "request_body_mode": "BUFFERED",
                "response_header_mode": "SEND",
                "response_body_mode": "BUFFERED",
                "request_trailer_mode": "SKIP",
                "response_trailer_mode": "SKIP",
            }
            typed["allow_mode_override"] = False
            return
    raise ValueError("no ext_proc filter in the template")


def strip_precheck(config: dict[str, Any]) -> None:
    """The shipped config as it was before the precheck: every rewrite is noticed by
    extproc.request only, and its response gets a second stream."""
    hcm = _hcm(config)
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != PRECHECK_FILTER]
    for vhost in hcm["route_config"]["virtual_hosts"]:
        for route in vhost["routes"]:
            route.get("typed_per_filter_config", {}).pop(PRECHECK_FILTER, None)


def strip_ext_proc(config: dict[str, Any]) -> None:
    """Envoy alone: the same listener, routes and limits, without ext_proc."""
    hcm = _hcm(config)
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != EXT_PROC_FILTER]
    for vhost in hcm["route_config"]["virtual_hosts"]:
        for route in vhost["routes"]:
            per_filter = route.get("typed_per_filter_config", {})
            per_filter.pop(EXT_PROC_FILTER, None)
            if not per_filter:
                route.pop("typed_per_filter_config", None)
    resources = config["static_resources"]
    resources["clusters"] = [c for c in resources["clusters"] if c["name"] != "extproc"]
