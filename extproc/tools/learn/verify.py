"""Closing the loop: the gateway with the learned policy in front of the candidate,
compared with the baseline, for every task: embeddings by the probe's parity and
contract checks (the toolkit's ``vector_parity``, ``contract_table`` and
``readiness_checks``), each learned rerank path by its dialect's contract requests,
every answer compared whole as a client reads it (parity's rerank comparison).

The gateway is `extproc run`'s own: its ext_proc server and a real Envoy on the
shipped ``standalone.yaml``, started in this process by the runtime's functions
(``extproc_servers.start_server``, ``envoy_process.run_envoy``) and stopped when the
comparison is done. The comparison uses the shipped corpus (texts learning never sent),
the contract table's default probes, and probes for what was learned: every
``input_type`` the baseline accepts, the Matryoshka sizes at the edges, the lenient
spellings and the bad requests, each expected valid when the baseline accepted it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar
from urllib.parse import urlsplit

import orjson

from extproc.core.contract import Contract
from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.runtime.blocking_http import HttpClient, split_url
from extproc.runtime.envoy_config import (
    DEFAULT_TEMPLATE,
    EnvoySettings,
    Upstream,
    load_template,
    render,
)
from extproc.runtime.envoy_process import run_envoy
from extproc.runtime.extproc_servers import start_server
from extproc.service.metrics import process_metrics
from extproc.service.net import free_port
from extproc.tools.learn import profile_learner, prompts_learner
from extproc.tools.learn.battery import battery_probes
from extproc.tools.learn.local import TEXT
from extproc.tools.learn.probing_plan import Learned
from extproc.tools.learn.prompts_learner import INSTRUCTION_ALONE
from extproc.tools.learn.rerank_paths_learner import DOCUMENTS, QUERY
from extproc.tools.learn.rerank_plan import LearnedRerank
from extproc.tools.learn.session import Session
from extproc.tools.parity import Verdict
from extproc.tools.parity.readiness_verdict import rerank_check
from extproc.tools.parity.rerank_comparison import RerankReply, RerankRow, compare_replies
from extproc.tools.toolkit.contract_table import (
    ContractRow,
    Probe,
    default_probes,
    run_contract,
    said_probes,
)
from extproc.tools.toolkit.corpus import load_corpus
from extproc.tools.toolkit.long_text import LONG_INPUT_TOKENS, long_text
from extproc.tools.toolkit.readiness_checks import PROBE_THRESHOLDS, comparison_verdict
from extproc.tools.toolkit.rerank_requests import rerank_requests
from extproc.tools.toolkit.vector_parity import ParityResult, run_parity

T = TypeVar("T")
# Requests the probe's default contract probes already make.
COVERED = frozenset(
    {"malformed JSON", "input: []", "unknown model", 'encoding_format "base64"', INSTRUCTION_ALONE}
)
# The probe's default probes, by key, and the learning request that tells whether the
# baseline took it.
LEARNED_AS = {
    "input_type_query": "input_type 'query'",
    "instruction": INSTRUCTION_ALONE,
}


@dataclass(frozen=True)
class Verification:
    verdict: Verdict
    parity: ParityResult | None = None  # embeddings
    rows: Sequence[ContractRow] = ()  # embeddings: the contract table
    rerank_rows: Sequence[RerankRow] = ()  # reranking: a row per request and path


def upstream_root(url: str) -> Upstream:
    """The candidate's server root, which Envoy forwards to (the URL may name /v1 or
    the endpoint); ValueError for a path the gateway cannot put in front of."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if path not in ("", "/v1", "/v1/embeddings"):
        raise ValueError(f"the gateway calls /v1/embeddings on the server root; {url!r} has a path")
    return Upstream.from_url(f"{parts.scheme}://{parts.netloc}")


def learned_probes(learned: Learned) -> list[Probe]:
    """Probes for what was learned: each request learning sent to the baseline alone
    (every input_type, `instruction`, the lenient spellings and bad requests), expected
    valid when the baseline answered it 2xx; Matryoshka sizes at the rule's edges, just
    past them and inside (where a cut's norm shows), and the native size."""
    native = learned.basics.native if learned.basics else 0
    plain = {"model": learned.model, "input": [TEXT]}
    bodies: dict[str, dict[str, object] | bytes] = {
        **prompts_learner.requests(learned.model, learned.prompts.role_field),
        **profile_learner.requests(learned.model, learned.size_below_native(native)),
    }
    probes = [
        _probe(label, bodies[label], ok)
        for label, ok in learned.accepted.items()
        if label in bodies and label not in COVERED
    ]
    d = learned.dimensions
    sizes: list[tuple[int, bool]] = []
    if d.min_dimensions is not None:
        top = d.max_dimensions or native - 1
        inside = (d.min_dimensions + top) // 2
        sizes = [(d.min_dimensions, True), (d.min_dimensions - 1, False), (inside, True)]
        sizes += [(top, True), (top + 1, top + 1 == native and d.accepts_native)]
    elif d.matryoshka:
        sizes = [*((a, True) for a in d.allowed), (d.allowed[0] + 1, False)]
    if d.matryoshka:
        sizes += [(native, d.accepts_native), (native + 1, False)]
    probes += [
        _probe(f"dimensions {n}", {**plain, "dimensions": n}, ok)
        for n, ok in dict(sizes).items()
        if n > 0
    ]
    return probes


def _probe(title: str, body: dict[str, object] | bytes, valid: bool) -> Probe:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return Probe(key="learned " + title, title=title, body=raw, valid=valid)


def verify(
    session: Session, contract: Contract, urls: dict[str, str], learned: Learned
) -> Verification:
    """Start the gateway, compare it with the baseline, stop it. Every row compares
    what a client sees (exact status and error body shape, vectors and their norms,
    token counts); the probe's own rows for a query and for `instruction` are valid
    only if the baseline accepted those while learning (a gateway that accepts more
    is a warning)."""
    corpus, model, accepted = load_corpus(None), learned.model, learned.accepted
    long_refused = bool(learned.truncation.get("refuse"))
    max_tokens = max(m.max_tokens for m in contract.policy.models.values())

    def compare(gateway_url: str) -> Verification:
        dialect = session.dialects["baseline"]  # the gateway serves the baseline's clients
        baseline = session.client("baseline", urls["baseline"], dialect)
        gateway = session.client("candidate", gateway_url, dialect)
        try:
            session.note(f"verify: the gateway on {gateway_url} against the baseline")
            parity = run_parity(baseline, gateway, model, corpus.documents, corpus.queries)
            tokens = (
                parity.baseline.prompt_tokens or sum(len(d.text) for d in corpus.documents) // 2
            )
            target = max(LONG_INPUT_TOKENS, 2 * max_tokens)
            text, size = long_text(corpus.documents, target, tokens)
            probes = [
                replace(p, valid=accepted.get(LEARNED_AS.get(p.key, ""), p.valid))
                for p in default_probes(model, corpus.documents, corpus.queries, text, size)
            ]
            probes = [
                replace(p, valid=False) if p.key == "long_input" and long_refused else p
                for p in probes
            ]
            probes += learned_probes(learned)
            largest = learned.batches.limit if learned.batches else None
            probes += battery_probes(model, largest)
            said = said_probes(probes, dialect)
            rows = run_contract(baseline, gateway, said, PROBE_THRESHOLDS.min_cosine, exact=True)
            pair = (urls["baseline"], gateway_url)
            for found in learned.dialects:
                if found.dialect is not dialect:  # its other paths: the same handler
                    rows += _dialect_rows(session, found.dialect, pair, probes)
        finally:
            baseline.close()
            gateway.close()
        return Verification(comparison_verdict(parity, rows), parity, rows)

    with contextlib.redirect_stdout(sys.stderr):  # the launcher's ready line is progress here
        return asyncio.run(with_gateway(contract, upstream_root(urls["candidate"]), compare))


def _dialect_rows(
    session: Session, dialect: EmbeddingsDialect, urls: tuple[str, str], probes: list[Probe]
) -> list[ContractRow]:
    """The rows ``dialect``'s clients can say, asked of both servers at its path."""
    base_url, gateway_url = (split_url(url)[0] for url in urls)
    said = said_probes(probes, dialect)
    baseline = session.client("baseline", base_url, dialect)
    gateway = session.client("candidate", gateway_url, dialect)
    try:
        return run_contract(baseline, gateway, said, PROBE_THRESHOLDS.min_cosine, exact=True)
    finally:
        baseline.close()
        gateway.close()


def verify_rerank(
    session: Session, contract: Contract, learned: Sequence[LearnedRerank]
) -> Verification:
    """Start the gateway with the written policy in front of the candidate, send each
    learned path its dialect's contract requests, to both, and stop it."""

    def compare(gateway_url: str) -> Verification:
        session.note(f"verify: the gateway on {gateway_url} against the baseline")
        gateway = HttpClient(gateway_url, timeout_s=session.timeout_s, headers=session.headers)
        rows: list[RerankRow] = []
        try:
            for entry in learned:
                dialect, path = entry.dialect, entry.path
                bodies = rerank_requests(dialect, entry.model, QUERY, DOCUMENTS, entry.max_tokens)
                for label, body in bodies.items():
                    raw = body if isinstance(body, bytes) else orjson.dumps(body)
                    old = session.post("baseline", path, f"verify: {label}", body, [dialect])
                    session.budgets["candidate"].take()
                    new = gateway.post(path, raw)
                    rows.append(
                        compare_replies(
                            f"{path} {label}",
                            RerankReply.read(old.status, old.body, dialect),
                            RerankReply.read(new.status, new.body, dialect),
                        )
                    )
        finally:
            gateway.close()
        return Verification(rerank_verdict(rows), rerank_rows=rows)

    with contextlib.redirect_stdout(sys.stderr):
        return asyncio.run(
            with_gateway(contract, upstream_root(session.roots["candidate"]), compare)
        )


def rerank_verdict(rows: Sequence[RerankRow]) -> Verdict:
    """Ready when a client sees the same in every row."""
    differences = Counter(r.difference for r in rows if r.problem)
    return Verdict((rerank_check(len(rows), differences),))


async def with_gateway(contract: Contract, upstream: Upstream, work: Callable[[str], T]) -> T:
    """Run ``work(gateway_url)`` in a thread while the gateway serves; stop it after."""
    server_stop, envoy_stop = asyncio.Event(), asyncio.Event()
    server, port = await start_server(
        contract,
        metrics=process_metrics(),
        metrics_address=None,
        grace_seconds=1.0,
        stop=server_stop,
    )
    settings = EnvoySettings(
        "127.0.0.1", free_port(), free_port(), port, upstream, upstream_timeout_s=120
    )
    config = render(load_template(DEFAULT_TEMPLATE), settings, contract.policy)
    loop = asyncio.get_running_loop()
    results: list[T] = []
    errors: list[BaseException] = []

    def on_ready() -> None:
        try:
            results.append(work(f"http://127.0.0.1:{settings.listen_port}"))
        except BaseException as exc:  # raised again below, in the caller's thread
            errors.append(exc)
        finally:
            loop.call_soon_threadsafe(envoy_stop.set)

    try:
        status = await run_envoy(
            config,
            admin_port=settings.admin_port,
            log_level="error",
            concurrency=1,
            ready_line=lambda pid: f"verify: gateway ready (envoy pid {pid}) -> {upstream.url}",
            stop=envoy_stop,
            servers=(server,),
            on_ready=on_ready,
        )
    finally:
        server_stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await server
    if errors:
        raise errors[0]
    if not results:
        raise RuntimeError(f"the gateway stopped before the comparison (status {status})")
    return results[0]
