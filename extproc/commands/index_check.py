"""`extproc index-check`: can the old index stay after cut-over?

Embeds a sample of your corpus and queries (BEIR's files) with the legacy server
(--baseline, which built the index) and with what clients will call after cut-over
(--candidate: the gateway, or a raw upstream), then compares exact top-k retrieval:
new queries searched in the old index against today's results, and with judgements
(--qrels) whether they retrieve as well (the backward-compatibility criterion).
Writes report.md (also printed), report.json and report.html into --out.

Exit 0: KEEP INDEX; 1: RE-INDEX (the likely cause named); 2: INCONCLUSIVE (a sample
too small for the tolerances), or bad arguments, an unreadable file, or a server that
does not embed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from extproc.commands.options import (
    EMBEDDINGS_DIALECT_HELP,
    add_budget_option,
    add_compared_servers,
    add_dialect_option,
    add_tool_parser,
    check_budget,
    embeddings_dialect_from,
    flag_values,
    servers_from,
)
from extproc.core.dialects import EMBEDDINGS_DIALECTS
from extproc.tools.index_check.beir_files import (
    MAX_DOCUMENTS,
    build_sample,
    parse_qrels,
    parse_texts,
    read_lines,
)
from extproc.tools.index_check.embedding_run import EmbedError
from extproc.tools.index_check.index_report import to_html, to_json, to_markdown
from extproc.tools.index_check.index_run import IndexCheckOptions, run_index_check
from extproc.tools.index_check.index_verdict import IndexThresholds
from extproc.tools.toolkit.budgeted_client import BudgetSpentError
from extproc.tools.toolkit.embeddings_client import dialect_url
from extproc.tools.toolkit.progress import to_stderr
from extproc.tools.toolkit.report_files import write_report

SUMMARY = "can the old index stay? retrieval with the old and the new vectors, compared"
DEFAULT_OUT = Path("index-check-report")
DEFAULT_BUDGET = 5000
MAX_BUDGET = 1_000_000
DEFAULTS = IndexThresholds()


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_tool_parser(subparsers, "index-check", SUMMARY, __doc__)
    add_compared_servers(
        p, "the legacy server, which built the index", "what clients call after cut-over"
    )
    for flag, what in (("--corpus", "documents"), ("--queries", "queries")):
        p.add_argument(
            flag, required=True, type=Path, metavar="FILE", help=f"the {what}, BEIR JSON lines"
        )
    p.add_argument("--qrels", type=Path, metavar="FILE", help="judgements, BEIR's TSV")
    p.add_argument("--model", required=True, help="the model name clients send")
    add_dialect_option(p, EMBEDDINGS_DIALECTS, EMBEDDINGS_DIALECT_HELP)
    p.add_argument(
        "--k", type=int, default=DEFAULTS.k, help=f"results compared (default {DEFAULTS.k})"
    )
    p.add_argument("--dimensions", type=int, metavar="D", help="as the index was built")
    p.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help=f"documents to embed (default all, at most {MAX_DOCUMENTS:,}; judged ones always)",
    )
    p.add_argument(
        "--corpus-size", type=int, metavar="N", help="documents to re-index (default the file's)"
    )
    add_budget_option(p, DEFAULT_BUDGET)
    p.add_argument(
        "--min-overlap",
        type=float,
        default=DEFAULTS.min_overlap,
        help="mean overlap@k with today's results to keep the index "
        f"(default {DEFAULTS.min_overlap})",
    )
    p.add_argument(
        "--ndcg-tolerance",
        type=float,
        default=DEFAULTS.ndcg_tolerance,
        help=f"nDCG@k the kept index may lose (default {DEFAULTS.ndcg_tolerance})",
    )
    p.add_argument(
        "--min-queries",
        type=int,
        default=DEFAULTS.min_queries,
        help=f"fewest queries for a verdict (default {DEFAULTS.min_queries})",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"where the report goes (default {DEFAULT_OUT})",
    )


def run(args: argparse.Namespace) -> int:
    try:
        options = _options(args)
        qrels = None
        if args.qrels is not None:
            qrels = parse_qrels(read_lines(args.qrels, "a qrels file"), str(args.qrels))
        sample = build_sample(
            parse_texts(read_lines(args.corpus, "a corpus"), str(args.corpus)),
            parse_texts(read_lines(args.queries, "a queries file"), str(args.queries)),
            qrels,
            sample=args.sample,
        )
        args.out.mkdir(parents=True, exist_ok=True)
    except (ValueError, OSError) as exc:  # SampleError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        report = run_index_check(sample, options, to_stderr)
    except (EmbedError, BudgetSpentError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    markdown = to_markdown(report)
    files: dict[str, str | bytes] = {
        "report.md": markdown,
        "report.json": to_json(report),
        "report.html": to_html(report),
    }
    write_report(args.out, files)
    print(markdown, end="")
    to_stderr(f"index-check: {report.verdict.label}; {args.out / 'report.md'}")
    return int(report.verdict.exit_code)


def _options(args: argparse.Namespace) -> IndexCheckOptions:
    if not 1 <= args.k <= 1000:
        raise ValueError("--k must be within 1..1000")
    check_budget(args.budget, MAX_BUDGET)
    if args.sample is not None and args.sample < 1:
        raise ValueError("--sample must be at least 1")
    if args.dimensions is not None and args.dimensions < 1:
        raise ValueError("--dimensions must be at least 1")
    if not 0 < args.min_overlap <= 1 or not 0 <= args.ndcg_tolerance < 1:
        raise ValueError("--min-overlap must be in (0, 1], --ndcg-tolerance in [0, 1)")
    if args.min_queries < 2:
        raise ValueError("--min-queries must be at least 2")
    thresholds = IndexThresholds(
        **flag_values(args, "k", "min_overlap", "ndcg_tolerance", "min_queries")
    )
    dialect = embeddings_dialect_from(args)
    return IndexCheckOptions(
        servers=servers_from(args, lambda url: dialect_url(url, dialect)),
        dialect=dialect,
        thresholds=thresholds,
        **flag_values(args, "model", "dimensions", "budget", "corpus_size"),
    )


__all__ = ["add_parser", "run"]
