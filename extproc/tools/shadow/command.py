"""Command line of shadow mode: ``extproc shadow-compare | shadow-report | shadow``.

``add_parsers`` adds the three sub-commands to ``extproc``'s parser; each sets
``shadow_handler`` to its ``run_*`` function (``run_compare``, ``run_report``,
``run_shadow``), which takes the parsed arguments and returns the exit status.
Heavy imports (gRPC, numpy) happen inside the handlers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from extproc.commands.common import add_policy_options, load_contract_or_report

if TYPE_CHECKING:
    from extproc.tools.parity import Thresholds
    from extproc.tools.shadow.compare import Tolerances
    from extproc.tools.shadow.store import StoreLimits

COMMANDS = ("shadow-compare", "shadow-report", "shadow")


def add_parsers(subparsers: Any) -> None:
    """Add shadow-compare, shadow-report and shadow to ``extproc``'s sub-parsers."""
    compare = subparsers.add_parser(
        "shadow-compare",
        help="the shadow-mode comparator: pairs mirrored answers, serves /summary and /metrics",
    )
    compare.add_argument(
        "--listen",
        default=os.environ.get("EXTPROC_SHADOW_LISTEN", "0.0.0.0:50061"),
        metavar="HOST:PORT",
        help="gRPC: Envoy's tap streams (default 0.0.0.0:50061)",
    )
    compare.add_argument(
        "--http",
        default=os.environ.get("EXTPROC_SHADOW_HTTP", "0.0.0.0:9300"),
        metavar="HOST:PORT",
        help="HTTP: /summary (JSON), /metrics (Prometheus), /healthz (default 0.0.0.0:9300)",
    )
    compare.add_argument(
        "--ttl",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long a half waits for its other half (default 30)",
    )
    compare.add_argument(
        "--max-pending",
        type=int,
        default=10_000,
        help="request ids waiting for their other half, at most (default 10000)",
    )
    compare.add_argument(
        "--max-pending-bytes",
        type=int,
        default=1 << 30,
        help="memory held by waiting halves, at most (default 1 GiB)",
    )
    compare.add_argument(
        "--max-body-bytes",
        type=int,
        default=64 * 1024 * 1024,
        help="larger tapped bodies are skipped and counted (default 64 MiB)",
    )
    compare.add_argument(
        "--keep-text",
        action="store_true",
        help="keep input texts (first 200 characters) in the worst-mismatch list",
    )
    compare.add_argument(
        "--noise",
        action="store_true",
        help="expect a third half per request from a noise replica (role noise)",
    )
    compare.add_argument("--noise-relative", type=float, default=2.0)
    compare.add_argument("--noise-absolute", type=float, default=1e-5)
    _threshold_args(compare)
    compare.add_argument("--grace", type=float, default=5.0, metavar="SECONDS")
    compare.set_defaults(shadow_handler=run_compare)

    report = subparsers.add_parser(
        "shadow-report",
        help="print a running comparator's tables and verdict; exit 0 when ready",
    )
    report.add_argument(
        "--url",
        default="http://127.0.0.1:9300",
        help="the comparator's HTTP address",
    )
    report.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS")
    report.add_argument("--json", action="store_true", help="print the summary JSON instead")
    _threshold_args(report)
    report.set_defaults(shadow_handler=run_report)

    shadow = subparsers.add_parser(
        "shadow",
        help="shadow mode on one machine: gateway server + comparator + Envoy",
    )
    shadow.add_argument(
        "--baseline", required=True, help="the legacy server, e.g. http://10.0.0.5:8000"
    )
    shadow.add_argument("--candidate", required=True, help="the Dynamo/vLLM frontend URL")
    shadow.add_argument("--noise", default=None, help="a second legacy replica (optional)")
    shadow.add_argument("--listen", default="127.0.0.1:8080", help="where clients connect")
    shadow.add_argument(
        "--percent",
        type=float,
        default=100.0,
        help="share of embeddings requests mirrored (0-100, default 100)",
    )
    shadow.add_argument(
        "--reverse",
        action="store_true",
        help="after the cut-over: clients get the candidate, the baseline is the shadow",
    )
    shadow.add_argument(
        "--http",
        default="127.0.0.1:9300",
        metavar="HOST:PORT",
        help="the comparator's /summary and /metrics (default 127.0.0.1:9300)",
    )
    shadow.add_argument("--ttl", type=float, default=30.0, metavar="SECONDS")
    shadow.add_argument("--keep-text", action="store_true")
    _threshold_args(shadow)
    shadow.add_argument(
        "--gateway-template",
        type=Path,
        default=None,
        metavar="FILE",
        help="run this gateway config's filters on the candidate side (e.g. "
        "envoy/standalone.yaml) instead of the single filter the shadow configs embed",
    )
    shadow.add_argument("--upstream-timeout", type=float, default=300.0, metavar="SECONDS")
    shadow.add_argument("--envoy-log-level", default="warning")
    shadow.add_argument("--envoy-concurrency", type=int, default=None)
    add_policy_options(shadow, grace_s=5.0)
    shadow.set_defaults(shadow_handler=run_shadow)


def _threshold_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--min-cosine",
        type=float,
        default=0.999,
        help="lowest acceptable cosine for documents (default 0.999)",
    )
    parser.add_argument(
        "--min-query-cosine",
        type=float,
        default=None,
        help="lowest acceptable cosine for queries (default: --min-cosine)",
    )
    parser.add_argument(
        "--max-status-mismatches",
        type=int,
        default=0,
        help="status-class mismatches tolerated (default 0)",
    )


def run_compare(args: argparse.Namespace) -> int:
    from extproc.service.server import stop_on_signals
    from extproc.tools.shadow.server import CompareOptions, serve_compare

    try:
        options = CompareOptions(
            listen=args.listen,
            http=args.http or None,
            limits=_limits(args),
            tolerances=_tolerances(args),
            thresholds=_thresholds(args),
            expect_noise=args.noise,
            keep_text=args.keep_text,
            max_body_bytes=args.max_body_bytes,
            grace_s=args.grace,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def ready(grpc_port: int, http_port: int | None) -> None:
        http = f"http://127.0.0.1:{http_port}" if http_port else "off"
        print(f"shadow-compare ready: gRPC port {grpc_port}, HTTP {http}", flush=True)

    async def go() -> None:
        await serve_compare(options, stop=stop_on_signals(), on_ready=ready)

    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        return 130
    return 0


def run_report(args: argparse.Namespace) -> int:
    """Exit 0 when ready, 1 when not ready, 2 when the comparator cannot be read."""
    import orjson

    from extproc.tools.shadow.report import fetch_summary, render_report
    from extproc.tools.shadow.summary import judge

    try:
        summary = fetch_summary(args.url, timeout_s=args.timeout)
    except (OSError, ValueError) as exc:
        print(f"error: cannot read the comparator's summary at {args.url}: {exc}", file=sys.stderr)
        return 2
    thresholds = _thresholds(args)
    verdict = judge(summary, thresholds)
    if args.json:
        summary["verdict"] = {**verdict.to_json(), "thresholds": thresholds.to_json()}
        sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(render_report(summary, thresholds))
    return 0 if verdict.ready else 1


def run_shadow(args: argparse.Namespace) -> int:
    from extproc.commands.envoy_config import Upstream
    from extproc.tools.shadow.launcher import ShadowRunOptions, main_shadow
    from extproc.tools.shadow.server import CompareOptions

    try:
        baseline = Upstream.from_url(args.baseline)
        candidate = Upstream.from_url(args.candidate)
        noise = Upstream.from_url(args.noise) if args.noise else None
        if not 0 <= args.percent <= 100:
            raise ValueError("--percent must be within 0..100")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    contract = load_contract_or_report(args.config, args.tokenizer)
    if contract is None:
        return 2
    options = ShadowRunOptions(
        baseline=baseline,
        candidate=candidate,
        noise=noise,
        listen=args.listen,
        percent=args.percent,
        reverse=args.reverse,
        compare=CompareOptions(
            listen="127.0.0.1:0",
            http=args.http or None,
            limits=_limits(args),
            thresholds=_thresholds(args),
            tolerances=_tolerances(args),
            keep_text=args.keep_text,
            grace_s=args.grace,
        ),
        metrics_address=args.metrics,
        grace_seconds=args.grace,
        envoy_log_level=args.envoy_log_level,
        envoy_concurrency=args.envoy_concurrency,
        upstream_timeout_s=args.upstream_timeout,
        gateway_template=args.gateway_template,
    )
    return main_shadow(contract, options)


def _limits(args: argparse.Namespace) -> StoreLimits:
    from extproc.tools.shadow.store import StoreLimits

    return StoreLimits(
        ttl_s=args.ttl,
        max_pending=getattr(args, "max_pending", 10_000),
        max_bytes=getattr(args, "max_pending_bytes", 1 << 30),
    )


def _tolerances(args: argparse.Namespace) -> Tolerances:
    from extproc.tools.shadow.compare import Tolerances

    return Tolerances(
        min_cosine=args.min_cosine,
        noise_relative=getattr(args, "noise_relative", 2.0),
        noise_absolute=getattr(args, "noise_absolute", 1e-5),
    )


def _thresholds(args: argparse.Namespace) -> Thresholds:
    from extproc.tools.parity import Thresholds

    return Thresholds(
        min_cosine=args.min_cosine,
        min_query_cosine=args.min_query_cosine,
        max_status_mismatches=args.max_status_mismatches,
    )
