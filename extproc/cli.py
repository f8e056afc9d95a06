"""Command line: `extproc serve | run | check-config | presets | health | probe | shadow*`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from extproc.contract import Contract, load_contract
from extproc.envoy_config import Upstream
from extproc.policy import PolicyError, load_policy_file
from extproc.policy.loader import parse_tokenizer_overrides
from extproc.policy.presets import PRESETS
from extproc.probe import command as probe_command
from extproc.shadow import command as shadow_command
from extproc.tokens import TokenizerLoadError

SHIPPED_POLICY = Path(__file__).resolve().parent / "policies" / "qwen3-embedding-0.6b.yaml"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handler = {
        "serve": _serve,
        "run": _run,
        "check-config": _check_config,
        "presets": _presets,
        "health": _health,
        "probe": probe_command.run,
        "shadow-compare": shadow_command.run_compare,
        "shadow-report": shadow_command.run_report,
        "shadow": shadow_command.run_shadow,
    }[args.command]
    return handler(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="extproc", description=__doc__)
    parser.add_argument(
        "--log-level",
        default=os.environ.get("EXTPROC_LOG_LEVEL", "info"),
        choices=["debug", "info", "warning", "error"],
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def policy_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--config",
            type=Path,
            default=Path(os.environ.get("EXTPROC_CONFIG", SHIPPED_POLICY)),
            help="policy file (default: $EXTPROC_CONFIG, else the shipped Qwen3 policy)",
        )
        p.add_argument(
            "--tokenizer",
            action="append",
            default=[],
            metavar="NAME=DIR",
            help="use the tokenizer.json in DIR for model (or tokenizer hf_id) NAME; "
            "repeatable; also $EXTPROC_TOKENIZER_OVERRIDES=NAME=DIR,...",
        )
        p.add_argument(
            "--metrics",
            default=os.environ.get("EXTPROC_METRICS"),
            metavar="HOST:PORT",
            help="serve Prometheus metrics here (default: off)",
        )
        p.add_argument(
            "--grace",
            type=float,
            default=30.0,
            help="seconds to let in-flight streams finish on SIGTERM",
        )

    serve = sub.add_parser("serve", help="the gRPC ext_proc server, for Envoy or a mesh")
    serve.add_argument("--listen", default=os.environ.get("EXTPROC_LISTEN", "0.0.0.0:50051"))
    policy_args(serve)

    run = sub.add_parser("run", help="ext_proc plus a real Envoy in front of --upstream")
    run.add_argument(
        "--upstream", required=True, help="the Dynamo/vLLM frontend, e.g. http://127.0.0.1:8000"
    )
    run.add_argument("--listen", default="127.0.0.1:8080", help="where clients connect")
    run.add_argument(
        "--upstream-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long Envoy waits for the upstream's answer (then 504)",
    )
    run.add_argument("--envoy-log-level", default="warning")
    run.add_argument(
        "--envoy-template",
        type=Path,
        default=None,
        metavar="FILE",
        help="Envoy config to render (default envoy/standalone.yaml; "
        "envoy/single-filter.yaml is the one-filter variant meshes use)",
    )
    run.add_argument("--envoy-concurrency", type=int, default=None)
    policy_args(run)

    check = sub.add_parser("check-config", help="validate a policy file (and load its tokenizers)")
    check.add_argument("file", type=Path)
    check.add_argument("--tokenizer", action="append", default=[], metavar="NAME=DIR")
    check.add_argument("--no-tokenizers", action="store_true", help="skip loading tokenizers")

    sub.add_parser("presets", help="list the model-family presets")

    check_health = sub.add_parser("health", help="query a server's gRPC health service")
    check_health.add_argument("--address", default="127.0.0.1:50051")
    check_health.add_argument("--service", default="", help="'' = the whole server")
    check_health.add_argument("--timeout", type=float, default=3.0)

    probe_command.add_parser(sub)
    shadow_command.add_parsers(sub)
    return parser


def load_contract_or_report(
    config: Path, tokenizer_flags: list[str], *, tokenizers: bool = True
) -> Contract | None:
    """The policy and its tokenizers, or None after printing file, field and reason."""
    try:
        overrides = parse_tokenizer_overrides(",".join(tokenizer_flags))
        policy = load_policy_file(config, tokenizer_overrides=overrides)
        if not tokenizers:
            return Contract(policy=policy, tokenizers={})
        return load_contract(policy)
    except PolicyError as exc:
        print(f"error: {exc.source}: {exc.field}: {exc.reason}", file=sys.stderr)
    except (TokenizerLoadError, ValueError, OSError) as exc:
        print(f"error: {config}: tokenizer: {exc}", file=sys.stderr)
    return None


def _serve(args: argparse.Namespace) -> int:
    from extproc.server import serve, stop_on_signals

    contract = load_contract_or_report(args.config, args.tokenizer)
    if contract is None:
        return 2

    async def go() -> None:
        await serve(
            contract,
            address=args.listen,
            metrics_address=args.metrics,
            grace_seconds=args.grace,
            stop=stop_on_signals(),
        )

    asyncio.run(go())
    return 0


def _run(args: argparse.Namespace) -> int:
    from extproc.launcher import RunOptions, main_run

    try:
        upstream = Upstream.from_url(args.upstream)
    except ValueError as exc:
        print(f"error: --upstream: {exc}", file=sys.stderr)
        return 2
    contract = load_contract_or_report(args.config, args.tokenizer)
    if contract is None:
        return 2
    options = RunOptions(
        upstream=upstream,
        listen=args.listen,
        metrics_address=args.metrics,
        grace_seconds=args.grace,
        envoy_log_level=args.envoy_log_level,
        envoy_concurrency=args.envoy_concurrency,
        upstream_timeout_s=args.upstream_timeout,
        **({"envoy_template": args.envoy_template} if args.envoy_template else {}),
    )
    return main_run(contract, options)


def _check_config(args: argparse.Namespace) -> int:
    contract = load_contract_or_report(args.file, args.tokenizer, tokenizers=not args.no_tokenizers)
    if contract is None:
        return 1
    policy = contract.policy
    print(
        f"{args.file}: OK, {len(policy.models)} model(s); limits: "
        f"{policy.limits.max_request_bytes} bytes, {policy.limits.max_inputs} inputs"
    )
    for model in policy.models.values():
        dims = model.dimensions_rule()
        print(
            f"  {model.name}: upstream {model.upstream_flavour.value} as {model.upstream_model!r}, "
            f"max {model.max_tokens} tokens, dimensions {dims}, "
            f"encoding profile {model.encoding_profile.value}, "
            f"tokenizer {model.tokenizer.describe()}"
        )
    return 0


def _presets(args: argparse.Namespace) -> int:
    for name in sorted(PRESETS):
        print(name)
    return 0


def _health(args: argparse.Namespace) -> int:
    """Ask a running server's gRPC health service (for container HEALTHCHECKs)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(args.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            print(f"unhealthy: {exc.code().name}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(status)
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1
