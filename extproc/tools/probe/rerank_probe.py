"""`extproc probe --task rerank`: a candidate rerank server (usually the gateway in front
of the new engine) against the legacy one, as the legacy server's clients see them.

Both servers get the same requests in the legacy dialect, one at a time:

- per corpus query (the first :data:`MAX_QUERIES`), the query against a window of
  :data:`WINDOW` corpus documents, each query its own window;
- the dialect's contract requests (its options, the client mistakes, and a pair over
  ``--max-tokens`` when given), from the first query and documents.

Both replies are read in that dialect and compared by the parity package (status,
error body shape, results, documents, order, every score within 1e-4); the verdict is
the probe's (:mod:`extproc.tools.probe.probe_verdict`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson

from extproc.core.tasks.rerank import RerankDialect
from extproc.runtime.blocking_http import HttpClient, split_url
from extproc.tools.parity.rerank_comparison import RerankReply, RerankRow, compare_replies
from extproc.tools.probe.probe_report import ProbeReport, RerankSections, probe_meta
from extproc.tools.probe.probe_verdict import rerank_verdict
from extproc.tools.toolkit.corpus import Corpus
from extproc.tools.toolkit.rerank_requests import rerank_requests
from extproc.tools.toolkit.run_meta import RunClock
from extproc.tools.toolkit.server_pair import ServerPair

log = logging.getLogger("extproc.tools.probe")

MAX_QUERIES = 20
WINDOW = 8  # documents a query is reranked against
QUERY_LABEL = "query "
CONTRACT_LABEL = "contract: "


@dataclass(frozen=True)
class RerankProbeOptions:
    servers: ServerPair  # the URLs clients post rerank requests to
    dialect: RerankDialect
    model: str  # sent by every dialect but TEI
    max_tokens: int | None


def query_requests(
    dialect: RerankDialect, model: str, corpus: Corpus
) -> dict[str, dict[str, Any] | bytes]:
    """Each corpus query against its window of documents, by label (pure)."""
    documents = [d.text for d in corpus.documents]
    size = min(WINDOW, len(documents))
    bodies: dict[str, dict[str, Any] | bytes] = {}
    for i, query in enumerate(corpus.queries[:MAX_QUERIES]):
        window = [documents[(i * WINDOW + j) % len(documents)] for j in range(size)]
        bodies[f"{QUERY_LABEL}{query.id}"] = dialect.write_request(model, query.text, window)
    return bodies


def contract_requests(
    dialect: RerankDialect, model: str, corpus: Corpus, max_tokens: int | None
) -> dict[str, dict[str, Any] | bytes]:
    """The dialect's contract requests, by label (pure)."""
    documents = [d.text for d in corpus.documents[:4]]
    contract = rerank_requests(dialect, model, corpus.queries[0].text, documents, max_tokens)
    return {f"{CONTRACT_LABEL}{label}": body for label, body in contract.items()}


def run_rerank_probe(options: RerankProbeOptions, corpus: Corpus) -> ProbeReport:
    """Send the requests to both servers and compare (network I/O; every request
    bounded by the timeout, one at a time)."""
    clock = RunClock.start()
    dialect = options.dialect
    queries = query_requests(dialect, options.model, corpus)
    contract = contract_requests(dialect, options.model, corpus, options.max_tokens)
    log.info("probe: rerank, %d requests to each server", len(queries) + len(contract))
    servers = options.servers
    (baseline, baseline_path), (candidate, candidate_path) = (
        _client(url, servers) for url in (servers.baseline, servers.candidate)
    )

    def compared(label: str, body: dict[str, Any] | bytes) -> RerankRow:
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        old = baseline.post(baseline_path, raw)
        new = candidate.post(candidate_path, raw)
        return compare_replies(
            label,
            RerankReply.read(old.status, old.body, dialect),
            RerankReply.read(new.status, new.body, dialect),
        )

    try:
        sections = RerankSections(
            queries=tuple(compared(label, body) for label, body in queries.items()),
            contract=tuple(compared(label, body) for label, body in contract.items()),
        )
    finally:
        baseline.close()
        candidate.close()
    meta = probe_meta(clock, "rerank", servers, options.model, corpus, dialect=dialect.name)
    return ProbeReport(meta, rerank_verdict(sections), sections)


def _client(url: str, servers: ServerPair) -> tuple[HttpClient, str]:
    """A client of ``url``'s server, and the path to post to."""
    server, path = split_url(url)
    return HttpClient(server, timeout_s=servers.timeout_s, headers=servers.headers), path
