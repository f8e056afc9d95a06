"""Command line of shadow mode: ``extproc shadow-compare | shadow-report | shadow``.

``add_parsers`` adds the three sub-commands to ``extproc``'s parser; each sets
``shadow_handler`` to its ``run_*`` function, which takes the parsed arguments and
returns the exit status. Heavy imports (gRPC, numpy) happen inside the handlers.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from extproc.commands.options import (
    LAUNCHER_FIELDS,
    add_envoy_options,
    add_workers_option,
    flag_values,
    upstream_values,
)
from extproc.runtime.server_options import add_policy_options, add_server_options
from extproc.runtime.starting_contract import load_contract_or_report

if TYPE_CHECKING:
    from extproc.tools.parity import Thresholds
    from extproc.tools.shadow.comparator_server import CompareOptions


def add_parsers(subparsers: Any) -> None:
    """Add shadow-compare, shadow-report and shadow to ``extproc``'s sub-parsers."""
    compare = subparsers.add_parser(
        "shadow-compare", help="the comparator: pairs mirrored answers, serves /summary, /metrics"
    )
    arg = compare.add_argument
    arg(
        "--listen",
        default=os.environ.get("EXTPROC_SHADOW_LISTEN", "0.0.0.0:50061"),
        metavar="HOST:PORT",
        help="gRPC: Envoy's tap streams (default 0.0.0.0:50061)",
    )
    arg(
        "--http",
        default=os.environ.get("EXTPROC_SHADOW_HTTP", "0.0.0.0:9300"),
        metavar="HOST:PORT",
        help="HTTP: /summary (JSON), /metrics (Prometheus), /healthz (default 0.0.0.0:9300)",
    )
    arg("--noise", action="store_true", help="expect a third half per request (role noise)")
    arg("--grace", type=float, default=5.0, metavar="SECONDS")
    _comparator_args(compare)
    compare.set_defaults(shadow_handler=run_compare)

    report = subparsers.add_parser(
        "shadow-report", help="print a running comparator's tables and verdict; exit 0 when ready"
    )
    report.add_argument("--url", default="http://127.0.0.1:9300", help="the comparator's HTTP")
    report.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS")
    report.add_argument("--json", action="store_true", help="print the summary JSON instead")
    _threshold_args(report)
    report.set_defaults(shadow_handler=run_report)

    shadow = subparsers.add_parser(
        "shadow", help="shadow mode on one machine: gateway server + comparator + Envoy"
    )
    arg = shadow.add_argument
    arg("--baseline", required=True, help="the legacy server, e.g. http://10.0.0.5:8000")
    arg("--candidate", required=True, help="the Dynamo/vLLM frontend URL")
    arg("--noise", default=None, help="a second legacy replica (optional)")
    arg(
        "--legacy",
        default=None,
        metavar="URL",
        help="split migration: every path but the embeddings one goes to this server, "
        "untouched (default: the baseline in forward mode, the candidate's gateway in reverse)",
    )
    arg(
        "--rerank-candidate",
        default=None,
        metavar="URL",
        help="the candidate's reranker (a vLLM serving the cross-encoder): the policy's "
        "rerank paths are shadowed too, their pairs compared whole",
    )
    arg("--listen", default="127.0.0.1:8080", help="where clients connect")
    arg("--percent", type=float, default=100.0, help="share mirrored (0-100, default 100)")
    arg("--reverse", action="store_true", help="after the cut-over: the baseline is the shadow")
    arg("--http", default="127.0.0.1:9300", metavar="HOST:PORT", help="/summary and /metrics")
    arg(
        "--gateway-template",
        type=Path,
        default=None,
        metavar="FILE",
        help="run this gateway config's filters on the candidate side (e.g. "
        "envoy/standalone.yaml) instead of the single filter the shadow configs embed",
    )
    add_envoy_options(shadow)
    add_policy_options(shadow)
    add_server_options(shadow, metrics_env="EXTPROC_METRICS", grace_s=5.0)
    add_workers_option(shadow)
    _comparator_args(shadow)
    shadow.set_defaults(shadow_handler=run_shadow)


def _comparator_args(parser: argparse.ArgumentParser) -> None:
    arg = parser.add_argument
    arg("--ttl", type=float, default=30.0, help="how long a half waits for its pair (default 30 s)")
    arg("--max-pending", type=int, default=10_000, help="waiting request ids (default 10000)")
    arg("--max-pending-bytes", type=int, default=1 << 30, help="their memory (default 1 GiB)")
    arg("--max-body-bytes", type=int, default=64 << 20, help="larger bodies are skipped (64 MiB)")
    arg("--keep-text", action="store_true", help="keep input texts (200 characters) in /summary")
    arg("--noise-relative", type=float, default=2.0)
    arg("--noise-absolute", type=float, default=1e-5)
    _threshold_args(parser)


def _threshold_args(parser: argparse.ArgumentParser) -> None:
    arg = parser.add_argument
    arg("--min-cosine", type=float, default=0.999, help="lowest cosine, documents (0.999)")
    arg("--min-query-cosine", type=float, help="lowest cosine, queries (--min-cosine)")
    arg("--max-status-mismatches", type=int, default=0, help="status-class mismatches allowed (0)")


def run_compare(args: argparse.Namespace) -> int:
    from extproc.service.stop_signals import stop_on_signals
    from extproc.tools.shadow.comparator_server import serve_compare

    options = _compare_options(args, args.listen, noise=args.noise)

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

    from extproc.tools.shadow.shadow_report import fetch_summary, render_report
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
    from extproc.tools.shadow.shadow_launcher import ShadowRunOptions, main_shadow

    try:
        upstreams = upstream_values(
            args, "baseline", "candidate", "noise", "legacy", "rerank_candidate"
        )
        if not 0 <= args.percent <= 100:
            raise ValueError("--percent must be within 0..100")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from extproc.runtime.cpu_count import cpus_available
    from extproc.runtime.extproc_servers import launcher_contract
    from extproc.service.tokenizer_overrides import tokenizer_overrides

    workers = args.workers or cpus_available()
    contract = launcher_contract(
        functools.partial(load_contract_or_report, args.config, args.tokenizer), workers
    )
    if contract is None:
        return 2
    if upstreams["rerank_candidate"] is not None and not contract.policy.rerank_paths():
        print(f"error: --rerank-candidate: {args.config} has no rerankers", file=sys.stderr)
        return 2
    options = ShadowRunOptions(
        compare=_compare_options(args, "127.0.0.1:0", noise=upstreams["noise"] is not None),
        workers=workers,
        tokenizer_overrides=tokenizer_overrides(args.tokenizer),
        **upstreams,
        **flag_values(
            args, *LAUNCHER_FIELDS, "percent", "reverse", "gateway_template", "policy_file"
        ),
    )
    return main_shadow(contract, options)


def _compare_options(args: argparse.Namespace, listen: str, *, noise: bool) -> CompareOptions:
    from extproc.tools.shadow.comparator_server import CompareOptions
    from extproc.tools.shadow.pair_comparison import ShadowTolerances
    from extproc.tools.shadow.store import StoreLimits

    return CompareOptions(
        listen=listen,
        http=args.http or None,
        limits=StoreLimits(args.ttl, args.max_pending, args.max_pending_bytes),
        tolerances=ShadowTolerances(
            **flag_values(args, "min_cosine", "noise_relative", "noise_absolute")
        ),
        thresholds=_thresholds(args),
        expect_noise=noise,
        **flag_values(args, "keep_text", "max_body_bytes", "grace_seconds"),
    )


def _thresholds(args: argparse.Namespace) -> Thresholds:
    from extproc.tools.parity import Thresholds

    return Thresholds(
        **flag_values(args, "min_cosine", "min_query_cosine", "max_status_mismatches")
    )
