"""`extproc serve`: its arguments, and the one ext_proc server process they run.

The command line's `extproc serve` and each worker of `extproc run --workers N`
(:func:`extproc.runtime.worker_process.main`) run the same :func:`serve`. What it
makes of its flags (``server_tls_or_report``, ``reload_settings``, ``budget_share``)
`extproc run` makes of the same flags for the servers it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from extproc.runtime.server_options import (
    add_policy_options,
    add_reload_option,
    add_server_options,
    add_server_tls_options,
    add_tracing_option,
    tracing_unavailable,
)
from extproc.runtime.starting_contract import load_contract_or_report
from extproc.runtime.worker_pool import PRECHECK_MARKERS_ENV, WORKER_COUNT_ENV
from extproc.service.memory import fix_mmap_threshold
from extproc.service.reload import FileStamp, ReloadSettings, policy_stamp
from extproc.service.tls import TlsError, TlsSettings, load_material, settings_from_flags
from extproc.service.tokenizer_overrides import tokenizer_overrides


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `extproc serve`."""
    parser.add_argument("--listen", default=os.environ.get("EXTPROC_LISTEN", "0.0.0.0:50051"))
    add_policy_options(parser)
    add_reload_option(parser)
    add_server_options(parser, metrics_env="EXTPROC_METRICS", grace_s=30.0)
    add_tracing_option(parser)
    add_server_tls_options(parser)


def serve(args: argparse.Namespace) -> int:
    """Serve ext_proc as ``args`` (:func:`add_serve_arguments`) say until SIGTERM or
    SIGINT; 2 after one error line when the TLS files, tracing or policy cannot serve."""
    from extproc.runtime.extproc_servers import otlp_stream_tracer
    from extproc.service.metrics import process_metrics
    from extproc.service.server import serve as serve_ext_proc
    from extproc.service.stop_signals import stop_on_signals

    ok, tls = server_tls_or_report(args)
    if not ok:
        return 2
    if args.tracing and (why := tracing_unavailable()):
        print(f"error: {why}", file=sys.stderr)
        return 2
    started_from = policy_stamp(args.config)
    fix_mmap_threshold()  # before the tokenizers load (extproc/service/memory.py)
    contract = load_contract_or_report(args.config, args.tokenizer)
    if contract is None:
        return 2

    async def go() -> None:
        await serve_ext_proc(
            contract,
            address=args.listen,
            metrics_address=args.metrics,
            grace_seconds=args.grace,
            stop=stop_on_signals(),
            metrics=process_metrics(),
            tls=tls,
            reload=reload_settings(args, started_from),
            budget_share=budget_share(),
            tracer=otlp_stream_tracer() if args.tracing else None,
        )

    asyncio.run(go())
    return 0


def reload_settings(args: argparse.Namespace, started_from: FileStamp | None) -> ReloadSettings:
    """How `serve` and `run` reload the policy they started with (SIGHUP, and the
    watch unless --no-watch). The flags were checked by the first load."""
    markers = os.environ.get(PRECHECK_MARKERS_ENV)  # set for `extproc run`'s workers
    return ReloadSettings(
        config=args.config,
        tokenizer_overrides=tokenizer_overrides(args.tokenizer),
        watch=not args.no_watch,
        started_from=started_from,
        precheck_markers=None if markers is None else tuple(filter(None, markers.split(","))),
    )


def budget_share() -> int:
    """How many processes share the policy's admission budget: `extproc run`'s worker
    count for its workers, else 1 (a plain `extproc serve` admits the whole budget)."""
    text = os.environ.get(WORKER_COUNT_ENV, "1")
    return int(text) if text.isascii() and text.isdigit() and int(text) >= 1 else 1


def server_tls_or_report(args: argparse.Namespace) -> tuple[bool, TlsSettings | None]:
    """(ok, settings): the --tls-* flags, with every file checked now, so a bad one
    stops the command with its name and reason (not a traceback at first handshake)."""
    try:
        settings = settings_from_flags(args.tls_cert, args.tls_key, args.tls_client_ca)
        if settings is not None:
            load_material(settings)
    except TlsError as exc:
        print(f"error: TLS: {exc}", file=sys.stderr)
        return False, None
    return True, settings
