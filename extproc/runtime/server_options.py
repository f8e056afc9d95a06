"""The command-line options of an ext_proc server process, each defined once: which
policy (``add_policy_options``), how it is reloaded (``add_reload_option``), the
server's metrics and grace (``add_server_options``), its tracing (``add_tracing_option``)
and its TLS (``add_server_tls_options``).

`extproc serve` and each worker of `extproc run --workers N` take them
(:mod:`extproc.runtime.serve_command`); `extproc run` and `extproc shadow` take the
same flags for the servers they run. A flag therefore means the same, with the same
default and environment variable, wherever it appears.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from pathlib import Path

SHIPPED_POLICY = Path(__file__).resolve().parents[1] / "policies" / "qwen3-embedding-0.6b.yaml"

# (flag, environment variable giving the default or None, help)
FileOption = tuple[str, str | None, str]

SERVER_TLS_FILES: tuple[FileOption, ...] = (
    (
        "--tls-cert",
        "EXTPROC_TLS_CERT",
        "server certificate chain, PEM (default: $EXTPROC_TLS_CERT; unset = plaintext)",
    ),
    (
        "--tls-key",
        "EXTPROC_TLS_KEY",
        "its private key, PEM, unencrypted (default: $EXTPROC_TLS_KEY)",
    ),
    (
        "--tls-client-ca",
        "EXTPROC_TLS_CLIENT_CA",
        "require client certificates signed by this CA (mTLS) (default: $EXTPROC_TLS_CLIENT_CA)",
    ),
)


def env_path(name: str | None) -> Path | None:
    value = os.environ.get(name) if name else None
    return Path(value) if value else None


def add_file_options(parser: argparse._ActionsContainer, options: Iterable[FileOption]) -> None:
    for flag, env, text in options:
        parser.add_argument(flag, type=Path, default=env_path(env), metavar="FILE", help=text)


def add_tokenizer_option(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--tokenizer",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="use the tokenizer.json in DIR for model (or tokenizer hf_id) NAME; "
        "repeatable; also $EXTPROC_TOKENIZER_OVERRIDES=NAME=DIR,...",
    )


def add_seconds_option(
    parser: argparse._ActionsContainer, flag: str, default: float, text: str
) -> None:
    """A duration in seconds (``text``: its help)."""
    parser.add_argument(flag, type=float, default=default, metavar="SECONDS", help=text)


def add_policy_options(parser: argparse._ActionsContainer) -> None:
    """--config and --tokenizer: which policy, with which tokenizer files."""
    parser.add_argument(
        "--config",
        type=Path,
        default=Path(os.environ.get("EXTPROC_CONFIG", SHIPPED_POLICY)),
        help="policy file (default: $EXTPROC_CONFIG, else the shipped Qwen3 policy)",
    )
    add_tokenizer_option(parser)


def add_reload_option(parser: argparse._ActionsContainer) -> None:
    """--no-watch: reload the policy on SIGHUP only (the default also watches the file)."""
    parser.add_argument(
        "--no-watch",
        action="store_true",
        help="do not reload the policy file when it changes; only on SIGHUP "
        "(default: new streams get a changed file ~3 s after its last write, "
        "once it has held still for 2 s)",
    )


def add_server_options(
    parser: argparse._ActionsContainer, *, metrics_env: str | None, grace_s: float
) -> None:
    """--metrics and --grace of the ext_proc server a command runs."""
    parser.add_argument(
        "--metrics",
        default=os.environ.get(metrics_env) if metrics_env else None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics here "
        + (f"(default: ${metrics_env}, else off)" if metrics_env else "(default: off)"),
    )
    text = f"seconds to let in-flight streams finish on SIGTERM (default {grace_s:g})"
    add_seconds_option(parser, "--grace", grace_s, text)


def add_server_tls_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "TLS on the ext_proc gRPC port (docs/tls.md); files are re-read when they change"
    )
    add_file_options(group, SERVER_TLS_FILES)


TRACING_EXTRA = "pip install 'embeddings-contract-gateway[tracing]'"


def add_tracing_option(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="one OpenTelemetry span per ext_proc stream, a child of Envoy's, exported "
        "over OTLP as the OTEL_* environment says (docs/operations.md, Tracing)",
    )


def tracing_unavailable() -> str | None:
    """Why --tracing cannot work here (the SDK or its OTLP exporter is missing), or
    None. Looked up without importing them."""
    import importlib.util

    for module in ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.grpc"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"--tracing needs OpenTelemetry ({module} is missing): {TRACING_EXTRA}"
    return otlp_protos_overwritten()


def otlp_protos_overwritten() -> str | None:
    """Why the OTLP exporter's message modules are not opentelemetry-proto's own, or
    None. xds-protos (Envoy's API, which the gateway needs) ships an older copy of the
    same files under the same names; whichever package pip writes last wins, and the
    older copy makes the exporter fail on import. Each module's hash is checked against
    the one opentelemetry-proto recorded at install, without importing anything."""
    import base64
    import hashlib
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution("opentelemetry-proto")
    except importlib.metadata.PackageNotFoundError:
        return f"--tracing needs OpenTelemetry (opentelemetry-proto is missing): {TRACING_EXTRA}"
    for record in dist.files or ():
        if not record.name.endswith("_pb2.py") or record.hash is None:
            continue
        try:
            digest = hashlib.new(record.hash.mode, record.read_binary()).digest()
        except (OSError, ValueError):
            digest = b""
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != record.hash.value:
            return (
                f"--tracing: {record} is not opentelemetry-proto's own (xds-protos ships "
                "an older copy of it); restore it with: pip install --force-reinstall "
                f"--no-deps 'opentelemetry-proto=={dist.version}'"
            )
    return None
