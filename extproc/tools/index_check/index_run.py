"""One index-check run: the sample embedded by both servers (each text with its kind
as ``input_type``, document or query, as clients send them), at most four
requests in flight in all and each server within its request budget, then measured
and reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.tools.index_check.beir_files import Sample
from extproc.tools.index_check.embedding_run import Embedded, EmbedError, embed_texts
from extproc.tools.index_check.index_measures import measure
from extproc.tools.index_check.index_report import IndexCheckReport, Sizes
from extproc.tools.index_check.index_verdict import IndexThresholds, IndexVerdict
from extproc.tools.parity import Check
from extproc.tools.toolkit.budgeted_client import BudgetedClient, RequestBudget
from extproc.tools.toolkit.corpus import Kind
from extproc.tools.toolkit.progress import Progress
from extproc.tools.toolkit.request_pool import RequestPool
from extproc.tools.toolkit.run_meta import RunClock
from extproc.tools.toolkit.server_pair import ServerPair

MAX_IN_FLIGHT = 4
SERVERS = ("baseline", "candidate")


@dataclass(frozen=True)
class IndexCheckOptions:
    servers: ServerPair  # their embeddings endpoints
    model: str
    dimensions: int | None
    budget: int  # requests per server
    thresholds: IndexThresholds
    corpus_size: int | None  # for the re-index estimate; None: the corpus file's
    dialect: EmbeddingsDialect | None = None  # the legacy clients' (None: OpenAI's)


def run_index_check(
    sample: Sample, options: IndexCheckOptions, progress: Progress
) -> IndexCheckReport:
    """Raises EmbedError (a server did not embed) or BudgetSpentError."""
    clock = RunClock.start()
    budgets = {s: RequestBudget(options.budget, s) for s in SERVERS}
    servers = options.servers
    clients = {
        s: BudgetedClient(
            url,
            budgets[s],
            timeout_s=servers.timeout_s,
            headers=servers.headers,
            dialect=options.dialect,
        )
        for s, url in servers.urls.items()
    }
    pool = RequestPool(MAX_IN_FLIGHT, "index-check")
    documents = [d.text for d in sample.documents]
    queries = [q.text for q in sample.queries]
    embedded: dict[tuple[str, Kind], Embedded] = {}
    try:
        for server in SERVERS:
            client = clients[server]

            def post(
                body: bytes, client: BudgetedClient = client, server: str = server
            ) -> tuple[int, bytes]:
                result = client.post(body)
                if result.status == 0:
                    raise EmbedError(f"no answer from the {server}: {result.error}")
                return result.status, result.body

            phases: tuple[tuple[Kind, list[str]], ...] = (
                ("document", documents),
                ("query", queries),
            )
            for kind, texts in phases:
                embedded[(server, kind)] = embed_texts(
                    post,
                    pool,
                    options.model,
                    texts,
                    kind,
                    dimensions=options.dimensions,
                    progress=_bar(progress, f"{server}, {kind} texts", len(texts)),
                    dialect=options.dialect,
                )
    finally:
        pool.close()
        for client in clients.values():
            client.close()
    old = (embedded[("baseline", "document")].vectors, embedded[("baseline", "query")].vectors)
    new = (embedded[("candidate", "document")].vectors, embedded[("candidate", "query")].vectors)
    widths = (int(old[0].shape[1]), int(new[0].shape[1]))
    t = options.thresholds
    if widths[0] != widths[1]:
        measures = None
        widths_differ = f"the old vectors are {widths[0]}-d, the new ones {widths[1]}-d"
        verdict = IndexVerdict(
            (Check("widths", False, widths_differ),),
            cause="another width (or another model): new queries cannot search the old index",
        )
    else:
        qrels = [sample.qrels[q.id] for q in sample.queries] if sample.judged else None
        measures = measure(
            [d.id for d in sample.documents],
            documents,
            queries,
            old=old,
            new=new,
            qrels=qrels,
            t=t,
        )
        verdict = measures.verdict
    rate = embedded[("candidate", "document")].texts_per_second
    sizes = Sizes(
        len(documents), len(queries), options.corpus_size or sample.corpus_size, sample.judged
    )
    return IndexCheckReport(
        run=clock.meta(servers, options.model),
        sizes=sizes,
        dimensions=options.dimensions,
        thresholds=t,
        widths=widths,
        measures=measures,
        verdict=verdict,
        candidate_docs_per_s=rate,
        requests={s: budgets[s].spent for s in SERVERS},
    )


def _bar(progress: Progress, what: str, total: int) -> Callable[[int], None]:
    """A progress line each tenth of the way (and at the end)."""
    shown = [-1]

    def step(done: int) -> None:
        tenth = done * 10 // max(total, 1)
        if tenth > shown[0]:
            shown[0] = tenth
            filled = "#" * tenth + "." * (10 - tenth)
            progress(f"index-check: [{filled}] {what} {done:,}/{total:,}")

    return step
