"""`extproc probe`: compare a candidate embeddings server with a baseline, offline.

A cut-over study (vector parity, contract table, latency/throughput) against
two live servers, writes report.md, report.html and report.json into --out, prints the
Markdown, and exits 0 when the candidate is ready to replace the baseline, 1 when a
threshold fails, 2 when the probe could not reach a verdict (bad arguments, unreadable
corpus, or a baseline that does not answer).

With --task rerank it compares rerank answers instead: the corpus's queries against
its documents and the dialect's contract requests, in the legacy --dialect, sent to
both servers at the dialect's path (or the URL's); a row per request: status, error
body, results, documents, order, scores within 1e-4.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from extproc.commands.options import (
    EMBEDDINGS_DIALECT_HELP,
    add_compared_servers,
    add_dialect_option,
    add_tool_parser,
    embeddings_dialect_from,
    servers_from,
)
from extproc.core.dialects import EMBEDDINGS_DIALECTS, RERANK_DIALECTS
from extproc.runtime.blocking_http import split_url
from extproc.tools.parity import ExitCode, Thresholds
from extproc.tools.probe.embeddings_probe import EmbeddingsProbeOptions, run_embeddings_probe
from extproc.tools.probe.html_report import to_html
from extproc.tools.probe.latency import QUICK_PLAN, LatencyPlan
from extproc.tools.probe.probe_report import ProbeReport, to_json, to_markdown
from extproc.tools.probe.rerank_probe import RerankProbeOptions, run_rerank_probe
from extproc.tools.toolkit.corpus import CorpusError, load_corpus
from extproc.tools.toolkit.embeddings_client import dialect_url
from extproc.tools.toolkit.readiness_checks import PROBE_THRESHOLDS
from extproc.tools.toolkit.report_files import write_report

SUMMARY = "compare a candidate embeddings server with a baseline (parity, contract, latency)"
DEFAULT_MODEL = "Qwen/Qwen3-Embedding-0.6B"
DEFAULT_OUT = Path("probe-report")
DEFAULT_REPETITIONS = 3
MAX_REPETITIONS = 100


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `probe` on the CLI's subparsers."""
    p = add_tool_parser(subparsers, "probe", SUMMARY, __doc__)
    add_compared_servers(p, "the server to keep (legacy)", "the replacement")
    p.add_argument(
        "--corpus",
        type=Path,
        default=None,
        metavar="FILE",
        help="JSON lines {id, kind: document|query, text} (default: the shipped corpus)",
    )
    p.add_argument(
        "--task",
        choices=("embeddings", "rerank"),
        default="embeddings",
        help="what to compare: the embeddings endpoint (default) or reranking",
    )
    p.add_argument(
        "--model",
        default=None,
        help=f"model name sent (embeddings default {DEFAULT_MODEL}; rerank: needed by every "
        "dialect but TEI)",
    )
    add_dialect_option(
        p,
        [*RERANK_DIALECTS, *EMBEDDINGS_DIALECTS],
        EMBEDDINGS_DIALECT_HELP + "; --task rerank (required): tei /rerank, cohere-v1 and "
        "jina /v1/rerank, cohere-v2 /v2/rerank",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="--task rerank: the legacy server's limit per pair, to send a pair over it",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR", help="report directory")
    p.add_argument(
        "--min-cosine",
        type=float,
        default=PROBE_THRESHOLDS.min_cosine,
        help="minimum cosine per document and per valid contract probe (default 0.9995)",
    )
    p.add_argument(
        "--repetitions",
        type=int,
        default=None,
        help=f"latency repetitions, the median is reported (default {DEFAULT_REPETITIONS}; "
        "1 with --quick)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smaller latency runs: 10 sequential, 8 concurrent, 1 repetition",
    )


def options_from(args: argparse.Namespace) -> EmbeddingsProbeOptions:
    """Validate the arguments; raises ValueError with a message for the user."""
    if args.max_tokens is not None:
        raise ValueError("--max-tokens goes with --task rerank")
    dialect = embeddings_dialect_from(args)
    if not -1.0 <= args.min_cosine <= 1.0:
        raise ValueError("--min-cosine must be within -1..1")
    plan = QUICK_PLAN if args.quick else LatencyPlan(repetitions=DEFAULT_REPETITIONS)
    if args.repetitions is not None:
        if not 1 <= args.repetitions <= MAX_REPETITIONS:
            raise ValueError(f"--repetitions must be within 1..{MAX_REPETITIONS}")
        plan = replace(plan, repetitions=args.repetitions)
    return EmbeddingsProbeOptions(
        servers=servers_from(args, lambda url: dialect_url(url, dialect)),
        model=args.model or DEFAULT_MODEL,
        thresholds=Thresholds(min_cosine=args.min_cosine),
        plan=plan,
        quick=args.quick,
        dialect=dialect,
    )


def publish(out: Path, report: ProbeReport) -> int:
    """Write report.md, report.html and report.json into ``out`` and print the Markdown;
    the verdict's exit code, or INCONCLUSIVE when the report cannot be written."""
    markdown, html, json = to_markdown(report), to_html(report), to_json(report)
    try:
        write_report(out, {"report.md": markdown, "report.html": html, "report.json": json})
    except OSError as exc:
        print(markdown)
        print(f"error: cannot write the report to {out}: {exc}", file=sys.stderr)
        return int(ExitCode.INCONCLUSIVE)
    print(markdown, end="")
    print(f"report: {out / 'report.md'}, {out / 'report.html'}", file=sys.stderr)
    return int(report.verdict.exit_code)


def rerank_options_from(args: argparse.Namespace) -> RerankProbeOptions:
    """Validate the arguments of --task rerank; raises ValueError with a message."""
    if args.dialect is None:
        raise ValueError("--task rerank needs --dialect (tei, cohere-v1, cohere-v2 or jina)")
    dialect = RERANK_DIALECTS[args.dialect.replace("-", "_")]
    if dialect.names_model and not args.model:
        raise ValueError(f"--dialect {args.dialect} sends a model: give --model")
    if args.max_tokens is not None and not 1 <= args.max_tokens <= 1_000_000:
        raise ValueError("--max-tokens must be within 1..1000000")

    def rerank_url(url: str) -> str:
        """The URL, at the dialect's path when it names none."""
        server, path = split_url(url)
        return server + (dialect.paths[0] if path == "/" else path)

    return RerankProbeOptions(
        servers=servers_from(args, rerank_url),
        dialect=dialect,
        model=args.model or "",
        max_tokens=args.max_tokens,
    )


def run(args: argparse.Namespace) -> int:
    options: EmbeddingsProbeOptions | RerankProbeOptions
    try:
        options = rerank_options_from(args) if args.task == "rerank" else options_from(args)
        corpus = load_corpus(args.corpus)
    except CorpusError as exc:
        print(f"error: corpus: {exc}", file=sys.stderr)
        return int(ExitCode.INCONCLUSIVE)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(ExitCode.INCONCLUSIVE)
    if isinstance(options, RerankProbeOptions):
        return publish(args.out, run_rerank_probe(options, corpus))
    return publish(args.out, run_embeddings_probe(options, corpus))
