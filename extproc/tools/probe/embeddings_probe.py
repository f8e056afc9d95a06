"""`extproc probe` (the embeddings task): a candidate embeddings server against the
baseline, in three sections: the vector parity of the corpus, the contract table
(the toolkit's), and latency and throughput (:mod:`extproc.tools.probe.latency`),
skipped when a server cannot embed the corpus. The verdict is the probe's
(:mod:`extproc.tools.probe.probe_verdict`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.tools.parity import Thresholds
from extproc.tools.probe.latency import LatencyPlan, LatencyRequest, run_latency
from extproc.tools.probe.probe_report import EmbeddingsSections, ProbeReport, probe_meta
from extproc.tools.probe.probe_verdict import decide
from extproc.tools.toolkit.contract_table import default_probes, run_contract, said_probes
from extproc.tools.toolkit.corpus import Corpus, batches
from extproc.tools.toolkit.embeddings_client import EmbeddingsClient
from extproc.tools.toolkit.long_text import LONG_INPUT_TOKENS, long_text
from extproc.tools.toolkit.run_meta import RunClock
from extproc.tools.toolkit.server_pair import ServerPair
from extproc.tools.toolkit.vector_parity import BATCH_SIZE, run_parity

log = logging.getLogger("extproc.tools.probe")

FALLBACK_TOKENS_PER_CHAR = 0.5  # when the baseline gave no usage to measure it


@dataclass(frozen=True)
class EmbeddingsProbeOptions:
    servers: ServerPair  # the embeddings endpoints' URLs
    model: str
    thresholds: Thresholds
    plan: LatencyPlan
    quick: bool
    dialect: EmbeddingsDialect | None = None  # the legacy clients' (None: OpenAI's)


def run_embeddings_probe(options: EmbeddingsProbeOptions, corpus: Corpus) -> ProbeReport:
    """Run the three sections against the two servers (network I/O)."""
    clock = RunClock.start()
    servers = options.servers
    baseline, candidate = (
        EmbeddingsClient(
            url, timeout_s=servers.timeout_s, headers=servers.headers, dialect=options.dialect
        )
        for url in (servers.baseline, servers.candidate)
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
        probes = said_probes(probes, options.dialect)
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
            latency = run_latency(
                baseline, candidate, latency_requests(options.model, corpus), plan
            )
    finally:
        baseline.close()
        candidate.close()

    if skipped is not None:
        log.warning("probe: latency not measured: %s", skipped)
    sections = EmbeddingsSections(options.thresholds, parity, rows, latency, skipped)
    meta = probe_meta(clock, "embeddings", servers, options.model, corpus, quick=options.quick)
    return ProbeReport(meta, decide(parity, rows, latency, options.thresholds), sections)


def latency_requests(model: str, corpus: Corpus) -> list[LatencyRequest]:
    """The corpus documents in batches, as the latency runs send them (pure)."""
    return [
        LatencyRequest(
            orjson.dumps(
                {"model": model, "input": [d.text for d in batch], "encoding_format": "float"}
            ),
            len(batch),
        )
        for batch in batches(corpus.documents, BATCH_SIZE)
    ]


def latency_skipped(baseline_errors: Sequence[str], candidate_embedded: int) -> str | None:
    """Why the latency runs are skipped (a server that cannot embed the documents would
    only produce errors, possibly one timeout each), or None to run them."""
    if baseline_errors:
        return "the baseline did not answer every parity request"
    if candidate_embedded == 0:
        return "the candidate answered no parity request"
    return None
