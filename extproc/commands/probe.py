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
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import orjson

from extproc.commands.options import (
    add_header_option,
    add_servers_options,
    add_timeout_option,
    add_tool_parser,
    headers_from,
)
from extproc.core.dialects import RERANK_DIALECTS
from extproc.runtime.blocking_http import split_url
from extproc.tools.parity import ExitCode, Thresholds
from extproc.tools.probe.html_report import to_html
from extproc.tools.probe.latency import QUICK_PLAN, LatencyPlan, Request, run_latency
from extproc.tools.probe.probe_report import Meta, ProbeReport, to_json, to_markdown
from extproc.tools.probe.probe_verdict import decide
from extproc.tools.probe.rerank_probe import (
    RerankProbeOptions,
    RerankTarget,
    run_rerank_probe,
)
from extproc.tools.probe.rerank_probe import to_html as rerank_html
from extproc.tools.probe.rerank_probe import to_json as rerank_json
from extproc.tools.probe.rerank_probe import to_markdown as rerank_markdown
from extproc.tools.toolkit.contract_table import default_probes, run_contract
from extproc.tools.toolkit.corpus import Corpus, CorpusError, batches, load_corpus
from extproc.tools.toolkit.embeddings_client import EmbeddingsClient, endpoint_url
from extproc.tools.toolkit.long_text import LONG_INPUT_TOKENS, long_text
from extproc.tools.toolkit.readiness_checks import PROBE_THRESHOLDS
from extproc.tools.toolkit.report_files import write_report
from extproc.tools.toolkit.vector_parity import BATCH_SIZE, run_parity

log = logging.getLogger("extproc.tools.probe")

SUMMARY = "compare a candidate embeddings server with a baseline (parity, contract, latency)"
DEFAULT_MODEL = "Qwen/Qwen3-Embedding-0.6B"
DEFAULT_OUT = Path("probe-report")
DEFAULT_REPETITIONS = 3
FALLBACK_TOKENS_PER_CHAR = 0.5  # when the baseline gave no usage to measure it
MAX_REPETITIONS = 100


@dataclass(frozen=True)
class Options:
    baseline: str
    candidate: str
    model: str
    corpus: Path | None
    out: Path
    thresholds: Thresholds
    plan: LatencyPlan
    quick: bool
    timeout_s: float
    headers: dict[str, str]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `probe` on the CLI's subparsers."""
    p = add_tool_parser(subparsers, "probe", SUMMARY, __doc__)
    add_servers_options(p, "the server to keep (legacy)", "the replacement")
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
    p.add_argument(
        "--dialect",
        choices=[name.replace("_", "-") for name in RERANK_DIALECTS],
        default=None,
        help="--task rerank: the legacy server's rerank dialect; requests go to its path "
        "(tei /rerank, cohere-v1 and jina /v1/rerank, cohere-v2 /v2/rerank) unless the URLs "
        "name one",
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
    add_timeout_option(p)
    add_header_option(p)


def options_from(args: argparse.Namespace) -> Options:
    """Validate the arguments; raises ValueError with a message for the user."""
    baseline = endpoint_url(args.baseline)
    candidate = endpoint_url(args.candidate)
    if args.dialect is not None or args.max_tokens is not None:
        raise ValueError("--dialect and --max-tokens go with --task rerank")
    if not -1.0 <= args.min_cosine <= 1.0:
        raise ValueError("--min-cosine must be within -1..1")
    if not 0 < args.timeout <= 3600:
        raise ValueError("--timeout must be within (0, 3600] seconds")
    plan = QUICK_PLAN if args.quick else LatencyPlan(repetitions=DEFAULT_REPETITIONS)
    if args.repetitions is not None:
        if not 1 <= args.repetitions <= MAX_REPETITIONS:
            raise ValueError(f"--repetitions must be within 1..{MAX_REPETITIONS}")
        plan = replace(plan, repetitions=args.repetitions)
    headers = headers_from(args.header)
    return Options(
        baseline=baseline,
        candidate=candidate,
        model=args.model or DEFAULT_MODEL,
        corpus=args.corpus,
        out=args.out,
        thresholds=Thresholds(min_cosine=args.min_cosine),
        plan=plan,
        quick=args.quick,
        timeout_s=args.timeout,
        headers=headers,
    )


def probe(options: Options, corpus: Corpus) -> ProbeReport:
    """Run the three sections against the two servers (network I/O)."""
    started_wall = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.monotonic()
    baseline = EmbeddingsClient(
        options.baseline, timeout_s=options.timeout_s, headers=options.headers
    )
    candidate = EmbeddingsClient(
        options.candidate, timeout_s=options.timeout_s, headers=options.headers
    )
    try:
        log.info("probe: vector parity (%d documents)", len(corpus.documents))
        parity = run_parity(baseline, candidate, options.model, corpus.documents, corpus.queries)

        tokens = parity.baseline.prompt_tokens
        if not tokens or parity.baseline.embedded < len(corpus.documents):
            chars = sum(len(d.text) for d in corpus.documents)
            tokens = round(chars * FALLBACK_TOKENS_PER_CHAR)
        long_input, long_tokens = long_text(corpus.documents, LONG_INPUT_TOKENS, tokens)
        probes = default_probes(
            options.model, corpus.documents, corpus.queries, long_input, long_tokens
        )
        log.info("probe: contract table (%d requests)", len(probes))
        rows = run_contract(baseline, candidate, probes, options.thresholds.min_cosine)

        latency = None
        skipped = latency_skipped(parity.baseline.errors, parity.candidate.embedded)
        if skipped is None:
            plan = options.plan
            log.info(
                "probe: latency (%d sequential + %d concurrent, x%d)",
                plan.sequential,
                plan.concurrent,
                plan.repetitions,
            )
            requests = [
                Request(
                    orjson.dumps(
                        {
                            "model": options.model,
                            "input": [d.text for d in batch],
                            "encoding_format": "float",
                        }
                    ),
                    len(batch),
                )
                for batch in batches(corpus.documents, BATCH_SIZE)
            ]
            latency = run_latency(baseline, candidate, requests, plan)
    finally:
        baseline.close()
        candidate.close()

    verdict = decide(parity, rows, latency, options.thresholds)
    if skipped is not None:
        log.warning("probe: latency not measured: %s", skipped)
    meta = Meta(
        baseline=options.baseline,
        candidate=options.candidate,
        model=options.model,
        corpus=corpus.source,
        documents=len(corpus.documents),
        queries=len(corpus.queries),
        started=started_wall,
        duration_s=time.monotonic() - started,
        quick=options.quick,
    )
    return ProbeReport(
        meta=meta,
        thresholds=options.thresholds,
        parity=parity,
        contract=rows,
        latency=latency,
        verdict=verdict,
        latency_skipped=skipped,
    )


def latency_skipped(baseline_errors: Sequence[str], candidate_embedded: int) -> str | None:
    """Why the latency runs are skipped (a server that cannot embed the documents would
    only produce errors, possibly one timeout each), or None to run them."""
    if baseline_errors:
        return "the baseline did not answer every parity request"
    if candidate_embedded == 0:
        return "the candidate answered no parity request"
    return None


def publish(out: Path, markdown: str, html: str, json: bytes, code: int) -> int:
    """Write report.md, report.html and report.json into ``out`` and print the Markdown;
    ``code``, or INCONCLUSIVE when the report cannot be written."""
    try:
        write_report(out, {"report.md": markdown, "report.html": html, "report.json": json})
    except OSError as exc:
        print(markdown)
        print(f"error: cannot write the report to {out}: {exc}", file=sys.stderr)
        return int(ExitCode.INCONCLUSIVE)
    print(markdown, end="")
    print(f"report: {out / 'report.md'}, {out / 'report.html'}", file=sys.stderr)
    return code


def rerank_options_from(args: argparse.Namespace) -> RerankProbeOptions:
    """Validate the arguments of --task rerank; raises ValueError with a message."""
    if args.dialect is None:
        raise ValueError("--task rerank needs --dialect (tei, cohere-v1, cohere-v2 or jina)")
    dialect = RERANK_DIALECTS[args.dialect.replace("-", "_")]
    if dialect.names_model and not args.model:
        raise ValueError(f"--dialect {args.dialect} sends a model: give --model")
    if args.max_tokens is not None and not 1 <= args.max_tokens <= 1_000_000:
        raise ValueError("--max-tokens must be within 1..1000000")
    if not 0 < args.timeout <= 3600:
        raise ValueError("--timeout must be within (0, 3600] seconds")

    def target(url: str, flag: str) -> RerankTarget:
        try:
            server, path = split_url(url)
        except ValueError as exc:
            raise ValueError(f"{flag}: {exc}") from None
        return RerankTarget(server, dialect.paths[0] if path == "/" else path)

    return RerankProbeOptions(
        baseline=target(args.baseline, "--baseline"),
        candidate=target(args.candidate, "--candidate"),
        dialect=dialect,
        model=args.model or "",
        max_tokens=args.max_tokens,
        timeout_s=args.timeout,
        headers=headers_from(args.header),
    )


def run_rerank(args: argparse.Namespace) -> int:
    try:
        options = rerank_options_from(args)
        corpus = load_corpus(args.corpus)
    except CorpusError as exc:
        print(f"error: corpus: {exc}", file=sys.stderr)
        return int(ExitCode.INCONCLUSIVE)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(ExitCode.INCONCLUSIVE)
    report = run_rerank_probe(options, corpus)
    markdown, html, json = rerank_markdown(report), rerank_html(report), rerank_json(report)
    return publish(args.out, markdown, html, json, int(report.exit_code))


def run(args: argparse.Namespace) -> int:
    if args.task == "rerank":
        return run_rerank(args)
    try:
        options = options_from(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(ExitCode.INCONCLUSIVE)
    try:
        corpus = load_corpus(options.corpus)
    except CorpusError as exc:
        print(f"error: corpus: {exc}", file=sys.stderr)
        return int(ExitCode.INCONCLUSIVE)
    report = probe(options, corpus)
    markdown, html, json = to_markdown(report), to_html(report), to_json(report)
    return publish(options.out, markdown, html, json, int(report.verdict.exit_code))
