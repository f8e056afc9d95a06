"""Command line: `extproc serve | run | check-config | presets | health | probe | learn`,
`extproc shadow*`."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from extproc.commands import index_check as index_check_command
from extproc.commands import learn as learn_command
from extproc.commands import probe as probe_command
from extproc.commands import shadow as shadow_command
from extproc.commands.options import (
    LAUNCHER_FIELDS,
    add_envoy_options,
    add_workers_option,
    flag_values,
    upstream_of,
    upstream_values,
)
from extproc.core.policy.model import InstructionUse, ModelPolicy
from extproc.core.policy.presets import presets
from extproc.runtime.cpu_count import cpus_available
from extproc.runtime.envoy_config import DEFAULT_TEMPLATE, ExtProcTls, Upstream
from extproc.runtime.serve_command import (
    add_serve_arguments,
    reload_settings,
    serve,
    server_tls_or_report,
)
from extproc.runtime.server_options import (
    SHIPPED_POLICY,
    add_file_options,
    add_policy_options,
    add_reload_option,
    add_server_options,
    add_server_tls_options,
    add_tokenizer_option,
    add_tracing_option,
    tracing_unavailable,
)
from extproc.runtime.starting_contract import load_contract_or_report
from extproc.service.reload import policy_stamp
from extproc.service.tls import TlsError, TlsSettings, check_ca, check_key_pair, read_file

if TYPE_CHECKING:
    import grpc

COMMANDS_STARTING_ENVOY = ("run", "shadow")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command in COMMANDS_STARTING_ENVOY and not _envoy_found(args.command):
        return 2
    handler = {
        "serve": serve,
        "run": _run,
        "check-config": _check_config,
        "presets": _presets,
        "health": _health,
        "probe": probe_command.run,
        "learn": learn_command.run,
        "index-check": index_check_command.run,
        "shadow-compare": shadow_command.run_compare,
        "shadow-report": shadow_command.run_report,
        "shadow": shadow_command.run_shadow,
    }[args.command]
    return handler(args)


def _envoy_found(command: str) -> bool:
    """Before any work: a command that starts Envoy stops at once, in one line, without one."""
    from extproc.runtime.envoy_process import envoy_binary

    try:
        envoy_binary()
    except FileNotFoundError as exc:
        print(f"error: extproc {command} needs an Envoy binary: {exc}", file=sys.stderr)
        return False
    return True


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="extproc", description=__doc__)
    parser.add_argument(
        "--log-level",
        default=os.environ.get("EXTPROC_LOG_LEVEL", "info"),
        choices=["debug", "info", "warning", "error"],
    )
    sub = parser.add_subparsers(dest="command", required=True)

    add_serve_arguments(
        sub.add_parser("serve", help="the gRPC ext_proc server, for Envoy or a mesh")
    )

    run = sub.add_parser("run", help="ext_proc plus a real Envoy in front of --upstream")
    run.add_argument(
        "--upstream",
        default=None,
        help="the Dynamo/vLLM frontend, e.g. http://127.0.0.1:8000 (default: plain vLLM "
        "started here on the CPU, serving all-MiniLM-L6-v2 with its policy; prepared once, "
        "several minutes the first time)",
    )
    run.add_argument(
        "--legacy",
        default=None,
        metavar="URL",
        help="split migration: send every path but the embeddings endpoint to this "
        "server, untouched and streamed (e.g. the legacy server's http://127.0.0.1:9000)",
    )
    run.add_argument(
        "--rerank-upstream",
        default=None,
        metavar="URL",
        help="where the policy's rerank paths go: a vLLM serving the reranker "
        "(--runner pooling) or Dynamo's SGLang frontend (default: --upstream)",
    )
    run.add_argument("--listen", default="127.0.0.1:8080", help="where clients connect")
    add_envoy_options(run)
    run.add_argument(
        "--envoy-template",
        type=Path,
        default=DEFAULT_TEMPLATE,
        metavar="FILE",
        help="Envoy config to render (default: the shipped standalone.yaml; "
        "envoy/single-filter.yaml is the one-filter variant meshes use)",
    )
    add_policy_options(run)
    # Resolved in _run: the default depends on whether --upstream was given.
    run.set_defaults(config=None)
    add_reload_option(run)
    add_server_options(run, metrics_env="EXTPROC_METRICS", grace_s=30.0)
    add_workers_option(run)
    add_tracing_option(run)
    add_server_tls_options(run)
    envoy_tls = run.add_argument_group("how Envoy talks to the TLS ext_proc port (with --tls-cert)")
    add_file_options(
        envoy_tls,
        (
            (
                "--envoy-ca",
                None,
                "CA that Envoy trusts for the ext_proc server certificate "
                "(required with --tls-cert)",
            ),
            (
                "--envoy-client-cert",
                None,
                "client certificate Envoy presents (required with --tls-client-ca)",
            ),
            ("--envoy-client-key", None, "its private key"),
        ),
    )
    envoy_tls.add_argument(
        "--envoy-server-name",
        default="localhost",
        metavar="NAME",
        help="name (or IP) Envoy requires in the server certificate's SANs and sends as SNI "
        "(default: localhost)",
    )

    check = sub.add_parser("check-config", help="validate a policy file (and load its tokenizers)")
    check.add_argument("file", type=Path)
    add_tokenizer_option(check)
    check.add_argument("--no-tokenizers", action="store_true", help="skip loading tokenizers")

    sub.add_parser("presets", help="list the model-family presets")

    check_health = sub.add_parser("health", help="query a server's gRPC health service")
    check_health.add_argument(
        "--address",
        action="append",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the server (default 127.0.0.1:50051); repeat it, or list several, for "
        "every worker of `extproc run --workers N` (its ready line lists them): healthy "
        "when each one is",
    )
    check_health.add_argument("--service", default="", help="'' = the whole server")
    check_health.add_argument("--timeout", type=float, default=3.0)
    add_file_options(
        check_health,
        (
            ("--tls-ca", None, "connect with TLS, trusting this CA"),
            ("--tls-cert", None, "client certificate (mTLS servers)"),
            ("--tls-key", None, "its private key"),
        ),
    )
    check_health.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="name to verify in the server certificate (default: the address's host)",
    )

    probe_command.add_parser(sub)
    learn_command.add_parser(sub)
    index_check_command.add_parser(sub)
    shadow_command.add_parsers(sub)
    return parser


def envoy_tls_from_flags(args: argparse.Namespace, server: TlsSettings | None) -> ExtProcTls | None:
    """Envoy's side of the TLS hop for `extproc run`; raises TlsError on a mismatch
    with the server's side or an unusable file."""
    ca, cert, key = args.envoy_ca, args.envoy_client_cert, args.envoy_client_key
    if server is None:
        if ca or cert or key:
            raise TlsError("--envoy-ca/--envoy-client-* need --tls-cert and --tls-key")
        return None
    if ca is None:
        raise TlsError("--tls-cert needs --envoy-ca: the CA Envoy trusts for that certificate")
    read_file(ca, "certificate")
    check_ca(ca)
    if server.mutual and (cert is None or key is None):
        raise TlsError(
            "--tls-client-ca needs --envoy-client-cert and --envoy-client-key "
            "(the certificate Envoy presents)"
        )
    if not server.mutual and (cert or key):
        raise TlsError("--envoy-client-cert/--envoy-client-key need --tls-client-ca")
    if cert is not None and key is not None:
        read_file(cert, "certificate")
        read_file(key, "private key")
        check_key_pair(cert, key)
        # Envoy reads the files itself, from its own working directory.
        cert, key = cert.resolve(), key.resolve()
    return ExtProcTls(ca.resolve(), args.envoy_server_name, cert, key)


def _run(args: argparse.Namespace) -> int:
    from extproc.runtime.extproc_servers import launcher_contract
    from extproc.runtime.gateway_launcher import RunOptions, main_run

    try:
        upstream = upstream_of(args, "upstream")
        upstreams = upstream_values(args, "legacy", "rerank_upstream")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.envoy_template.is_file():
        print(f"error: --envoy-template: no such file {args.envoy_template}", file=sys.stderr)
        return 2
    if args.tracing and (why := tracing_unavailable()):
        print(f"error: {why}", file=sys.stderr)
        return 2
    if args.tracing:
        from extproc.runtime.envoy_tracing import collector

        try:
            collector()
        except ValueError as exc:
            print(f"error: the OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT): {exc}", file=sys.stderr)
            return 2
    ok, server_tls = server_tls_or_report(args)
    if not ok:
        return 2
    try:
        envoy_tls = envoy_tls_from_flags(args, server_tls)
    except TlsError as exc:
        print(f"error: TLS: {exc}", file=sys.stderr)
        return 2

    workers = args.workers or cpus_available()

    def serve_in_front_of(target: Upstream, on_ready: Callable[[str], None] | None) -> int:
        started_from = policy_stamp(args.config)
        contract = launcher_contract(
            functools.partial(load_contract_or_report, args.config, args.tokenizer), workers
        )
        if contract is None:
            return 2
        options = RunOptions(
            upstream=target,
            server_tls=server_tls,
            envoy_tls=envoy_tls,
            reload=reload_settings(args, started_from),
            on_ready=on_ready,
            workers=workers,
            **upstreams,
            **flag_values(args, *LAUNCHER_FIELDS, "envoy_template", "tracing"),
        )
        return main_run(contract, options)

    if upstream is not None:
        if args.config is None:
            args.config = Path(os.environ.get("EXTPROC_CONFIG", SHIPPED_POLICY))
        return serve_in_front_of(upstream, None)
    return _run_with_default_upstream(args, serve_in_front_of)


def _run_with_default_upstream(
    args: argparse.Namespace,
    serve_in_front_of: Callable[[Upstream, Callable[[str], None] | None], int],
) -> int:
    """No --upstream: plain vLLM on this CPU (extproc/runtime/default_upstream.py),
    with the MiniLM policy unless --config names another; the demonstration request
    once the gateway is ready; vLLM stopped when the gateway stops."""
    from extproc.runtime import default_upstream as default

    default.note(
        f"no --upstream: starting plain vLLM on the CPU serving {default.SERVED_MODEL} "
        "(its environment is prepared once: several minutes and ~2.6 GB the first time)"
    )
    # A SIGTERM before the gateway's own handlers are in place must still stop vLLM.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        environment = default.prepare()
        if args.config is None:
            args.config = default.POLICY
        args.tokenizer = [*args.tokenizer, f"{default.SERVED_MODEL}={environment.model_dir}"]
        with default.running_vllm(environment) as vllm:
            default.note(
                f"vLLM starting on {vllm.url} (pid {vllm.process.pid}, log {vllm.log_path})"
            )
            took = vllm.wait_ready()
            default.note(f"vLLM ready in {took:.0f} s")

            def demo(gateway_url: str) -> None:
                default.show_demo(vllm.url, gateway_url)

            return serve_in_front_of(Upstream.from_url(vllm.url), demo)
    except default.DefaultUpstreamError as exc:
        print(f"error: default upstream: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _check_config(args: argparse.Namespace) -> int:
    contract = load_contract_or_report(args.file, args.tokenizer, tokenizers=not args.no_tokenizers)
    if contract is None:
        return 1
    policy = contract.policy
    for older in policy.older_spellings:
        print(f"warning: {policy.source}: {older.field}: {older.replacement}", file=sys.stderr)
    limits = policy.limits
    print(
        f"{args.file}: OK, {len(policy.models)} model(s); limits: "
        f"{limits.max_request_bytes} bytes, {limits.max_inputs} inputs, "
        f"{limits.max_input_chars} characters per input, "
        f"{limits.max_total_chars} characters in all (prompts included); "
        f"tokenizes at most {limits.max_tokenize_bytes} bytes in {limits.max_tokenize_ms} ms "
        "per request"
    )
    for model in policy.models.values():
        dims = model.dimensions_rule()
        print(
            f"  {model.name}: upstream {model.upstream.kind} as {model.upstream_model!r}, "
            f"max {model.max_tokens} tokens, dimensions {dims}, "
            f"{_encoding_summary(model)}, "
            f"tokenizer {model.tokenizer.describe()}"
        )
        behaviours = _legacy_behaviours(model)
        if behaviours:
            print(f"    legacy: {'; '.join(behaviours)}")
    if not policy.errors.is_openai:
        statuses = ", ".join(f"{k.value} {v}" for k, v in policy.errors.statuses.items())
        print(
            f"  errors: {policy.errors.shape.name} bodies" + (f"; {statuses}" if statuses else "")
        )
    return 0


def _legacy_behaviours(model: ModelPolicy) -> list[str]:
    """What the model's entry says beyond prompts, limits and sizes (the defaults unsaid)."""
    p, t, m = model.prompts, model.truncation, model.matryoshka
    out = []
    if p.instruction is not InstructionUse.TASK:
        out.append(f"instruction {p.instruction.name}")
    if p.default_input_type is not None:
        out.append(f"inputs without input_type get {p.default_input_type!r}")
    if p.aliases:
        out.append("own prompts for " + ", ".join(sorted(p.aliases)))
    if p.input_types:
        out.append("input_type only " + ", ".join(sorted(p.input_types)))
    if t.refuse:
        out.append(f"inputs over {model.max_tokens} tokens refused")
    elif not t.is_default:
        lost = "" if t.keep_special_tokens else ", special tokens cut too"
        out.append(f"cut from the {t.side.value}{lost}")
    if m is not None and not m.renormalise:
        out.append("cuts not re-normalised")
    return out


def _encoding_summary(model: ModelPolicy) -> str:
    profile = model.encoding_profile
    if profile is not None:
        return f"encoding profile {profile.value}"
    lax = "lax integers" if model.leniency.integers else "strict integers"
    bom = ", a BOM accepted" if model.leniency.bom else ""
    return f"base64 {'honoured' if model.honours_base64 else 'ignored'}, {lax}{bom}"


def _presets(args: argparse.Namespace) -> int:
    for name in sorted(presets()):
        print(name)
    return 0


def _health(args: argparse.Namespace) -> int:
    """Ask running servers' gRPC health service (for container HEALTHCHECKs): exit 0
    when every one of them is SERVING."""
    credentials = None
    if args.tls_ca or args.tls_cert or args.tls_key:
        try:
            from extproc.service.tls_credentials import channel_credentials

            credentials = channel_credentials(args.tls_ca, args.tls_cert, args.tls_key)
        except TlsError as exc:
            print(f"error: TLS: {exc}", file=sys.stderr)
            return 2
    given = args.address or ["127.0.0.1:50051"]
    addresses = [a.strip() for item in given for a in item.split(",") if a.strip()]
    healthy = True
    for address in addresses:
        status = _health_of(address, credentials, args)
        healthy = healthy and status == "SERVING"
        shown = status if len(addresses) == 1 else f"{address} {status}"
        # A status the server gave goes to stdout; a failed call, to stderr.
        print(shown, file=sys.stderr if status.startswith("unhealthy:") else sys.stdout)
    return 0 if healthy else 1


def _health_of(
    address: str, credentials: grpc.ChannelCredentials | None, args: argparse.Namespace
) -> str:
    """One server's status name, or "unhealthy: CODE" when the RPC failed."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if credentials is not None:
        options = (
            [("grpc.ssl_target_name_override", args.tls_server_name)]
            if args.tls_server_name
            else []
        )
        channel = grpc.secure_channel(address, credentials, options=options)
    else:
        channel = grpc.insecure_channel(address)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            return f"unhealthy: {exc.code().name}"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
