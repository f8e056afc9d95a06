"""A bare Envoy on a given bootstrap, started through the one process wrapper
(testing_support/processes.py) as the launchers start it (``envoy_argv``), and the
configs the tests give it: a shipped template rendered for loopback."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from extproc.core.policy import GatewayPolicy
from extproc.runtime.envoy_config import (
    DEFAULT_TEMPLATE,
    EnvoySettings,
    Upstream,
    dump,
    load_template,
    render,
)
from extproc.runtime.envoy_process import envoy_argv, envoy_binary
from testing_support.http import answers_ok, http, metric_value
from testing_support.processes import Process, free_port, log_file

READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class EnvoySpec:
    """An Envoy: its bootstrap (YAML text: equal specs make the same Envoy, the key under
    which a pool shares one), a name for its files, its log level and concurrency (None:
    Envoy's default, one worker thread per core)."""

    config: str
    name: str = "envoy"
    log_level: str = "warning"
    concurrency: int | None = 1

    @classmethod
    def of(cls, config: dict[str, Any], name: str = "envoy", **options: Any) -> EnvoySpec:
        return cls(dump(config), name, **options)

    def bootstrap(self) -> dict[str, Any]:
        doc: dict[str, Any] = yaml.safe_load(self.config)
        return doc


def _port(socket_address: dict[str, Any]) -> int:
    return int(socket_address["socket_address"]["port_value"])


@dataclass
class Envoy:
    """A running Envoy: its first listener's port and its admin's."""

    process: Process
    config_path: Path
    port: int
    admin_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def embeddings_url(self) -> str:
        return f"{self.url}/v1/embeddings"

    @property
    def admin(self) -> str:
        """host:port of its admin (what Prometheus scrapes)."""
        return f"127.0.0.1:{self.admin_port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.admin}"

    def ready(self) -> bool:
        return answers_ok(f"{self.admin_url}/ready", timeout=1)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> float:
        """Until its admin says ready; the seconds it took."""
        return self.process.wait_until(self.ready, timeout, f"{self.process.name} ready")

    def series(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` on its /stats/prometheus."""
        text = http("GET", f"{self.admin_url}/stats/prometheus", timeout=5).body.decode()
        return metric_value(text, name, **labels)

    def log(self) -> str:
        return self.process.log()

    def stop(self, timeout: float | None = None) -> int:
        return self.process.stop(timeout)


def start_envoy(
    spec: EnvoySpec, folder: Path, *, wait: bool = True, die_with_parent: bool = False
) -> Envoy:
    """Envoy on ``spec``'s bootstrap (written into ``folder``, its log beside it); with
    ``wait``, returns once its admin says ready (else call ``wait_ready``)."""
    bootstrap = spec.bootstrap()
    path = folder / f"{spec.name}.yaml"
    path.write_text(spec.config)
    process = Process.start(
        envoy_argv(path, spec.log_level, spec.concurrency),
        log_file(folder, spec.name),
        name=f"envoy {spec.name}",
        die_with_parent=die_with_parent,
    )
    listener = bootstrap["static_resources"]["listeners"][0]
    envoy = Envoy(process, path, _port(listener["address"]), _port(bootstrap["admin"]["address"]))
    if wait:
        try:
            envoy.wait_ready()
        except BaseException:
            process.stop()
            raise
    return envoy


def loopback_settings(
    upstream_url: str, extproc_port: int = 0, *, legacy: str | None = None
) -> EnvoySettings:
    """Envoy settings on 127.0.0.1 with free listen and admin ports, in front of
    ``upstream_url``, its ext_proc cluster at ``extproc_port`` (0: a free port nothing
    listens on)."""
    return EnvoySettings(
        "127.0.0.1",
        free_port(),
        free_port(),
        extproc_port or free_port(),
        Upstream.from_url(upstream_url),
        legacy=Upstream.from_url(legacy) if legacy else None,
    )


def rendered(
    settings: EnvoySettings, policy: GatewayPolicy, template: Path | None = None
) -> dict[str, Any]:
    """A shipped template (default: envoy/standalone.yaml) rendered as `extproc run`
    renders it."""
    return render(load_template(template or DEFAULT_TEMPLATE), settings, policy)


def envoy_validate(
    config: dict[str, Any] | Path, folder: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`envoy --mode validate` on a bootstrap file, or a dict written into ``folder``."""
    if isinstance(config, dict):
        assert folder is not None, "where to write the bootstrap"
        path = folder / f"bootstrap-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
    else:
        path = config
    return subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "-l", "error"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
