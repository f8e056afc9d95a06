"""`extproc learn --task rerank`: a legacy rerank contract, learned from the legacy
server and the raw rerank upstream (vLLM's ``/rerank``), then verified through the
gateway.

What it asks and concludes:

- **dialect and path**: TEI's request to ``/rerank``, Cohere v2's to ``/v2/rerank``,
  Cohere v1's (also Jina's) to ``/v1/rerank``; the first the baseline answers with a
  rerank answer names the dialect (Jina's answers carry ``usage`` and no ``meta``);
- **scores**: the candidate's raw logits for the same pairs (``use_activation:
  false``) against the baseline's scores: equal is ``RAW``, equal to their sigmoid
  ``SIGMOID`` (within 1e-4); anything else is another model, and named;
- **top_n and documents**: how many results and whether documents come back when the
  client does not say;
- **long pairs**: a pair over the candidate's limit: answered (cut, and the score must
  be the candidate's with ``truncate_prompt_tokens``) or refused (its status);
- **errors**: malformed JSON, no documents, an unknown model: statuses and shape.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from extproc.core.dialects import RERANK_DIALECTS
from extproc.core.error_envelope import ErrorClass
from extproc.core.policy.model import TokenizerSource
from extproc.core.tasks.rerank import Ranking, RerankDialect
from extproc.core.upstream_errors import parse_upstream_error
from extproc.runtime.blocking_http import HttpClient, HttpResult
from extproc.tools.learn.errors_learner import learn_errors
from extproc.tools.learn.findings import Finding, finding, unknown
from extproc.tools.learn.local import LocalModel
from extproc.tools.learn.session import Exchange, Server, shown
from extproc.tools.parity.rerank_comparison import SCORE_TOLERANCE, RerankReply
from extproc.tools.toolkit.budgeted_client import RequestBudget
from extproc.tools.toolkit.contract_table import UNKNOWN_MODEL
from extproc.tools.toolkit.long_text import plain_words
from extproc.tools.toolkit.progress import Progress
from extproc.tools.toolkit.rerank_requests import MALFORMED

QUERY = "how do I reset a forgotten password"
DOCUMENTS = (
    "To reset a forgotten password, open the sign-in page and choose 'Forgot password'.",
    "Our offices are closed on public holidays.",
    "Passwords must have at least twelve characters.",
    "The mobile app can scan receipts.",
)


class RerankSession:
    """Both servers' clients (server roots), a budget each, and the record."""

    def __init__(
        self,
        urls: Mapping[str, str],
        budget: int,
        progress: Progress,
        timeout_s: float,
        headers: Mapping[str, str],
    ) -> None:
        self.urls = dict(urls)
        self.headers = dict(headers)
        self.budgets = {s: RequestBudget(budget, s) for s in ("baseline", "candidate")}
        self.clients = {
            s: HttpClient(url, timeout_s=timeout_s, headers=headers) for s, url in urls.items()
        }
        self.exchanges: list[Exchange] = []
        self.replies: dict[int, RerankReply] = {}  # by exchange id
        self.progress = progress
        self._lock = threading.Lock()

    def post(self, server: Server, path: str, label: str, body: dict[str, Any] | bytes) -> Exchange:
        self.budgets[server].take()
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        result: HttpResult = self.clients[server].post(path, raw)
        reply = RerankReply.read(result.status, result.body)
        answer = reply.answer
        error = parse_upstream_error(result.body)
        with self._lock:
            exchange = Exchange(
                id=len(self.exchanges) + 1,
                server=server,
                label=label,
                request=f"POST {path} {shown(body)}",
                status=result.status,
                message=result.error or ("" if answer else (error.message or "")),
                envelope="" if answer else error.shape,
            )
            self.exchanges.append(exchange)
            self.replies[exchange.id] = reply
        return exchange

    def answer(self, exchange: Exchange) -> Ranking | None:
        reply = self.replies.get(exchange.id)
        return reply.answer if reply is not None else None

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


@dataclass
class LearnedRerank:
    model: str
    upstream_model: str
    tokenizer: TokenizerSource | None
    dialect: RerankDialect | None = None
    path: str = ""
    scores: str = "SIGMOID"
    top_n: int | None = None
    return_documents: bool | None = None
    max_tokens: int | None = None
    cut_long_pairs: bool = True
    errors: dict[str, Any] = field(default_factory=dict)

    def entry(self) -> dict[str, Any]:
        assert self.dialect is not None
        out: dict[str, Any] = {
            "name": self.model,
            "upstream_model": self.upstream_model,
            "dialect": self.dialect.name.upper(),
        }
        if self.path != self.dialect.paths[0]:
            out["path"] = self.path
        out["scores"] = self.scores
        if self.top_n is not None:
            out["top_n"] = self.top_n
        if (
            self.return_documents is not None
            and self.return_documents != self.dialect.returns_documents
        ):
            out["return_documents"] = self.return_documents
        if self.max_tokens is not None and self.tokenizer is not None:
            out["max_tokens"] = self.max_tokens
            if not self.cut_long_pairs:
                out["truncation"] = {"refuse": True}
            source = self.tokenizer
            out["tokenizer"] = (
                {"path": str(source.path)} if source.path else {"hf_id": source.hf_id}
            )
        out["upstream"] = {"kind": "vllm"}
        if self.errors:
            out["errors"] = self.errors
        return out


def learn_rerank(
    session: RerankSession, local: LocalModel | None, model: str
) -> tuple[LearnedRerank, list[Finding]]:
    learned = LearnedRerank(model, model, local.source if local else None)
    found: list[Finding] = []
    session.progress("learn: the rerank dialect (TEI, Cohere v2, Cohere v1 / Jina)")
    probes = [
        (d, d.write_request(model, QUERY, DOCUMENTS))
        for d in (RERANK_DIALECTS[n] for n in ("tei", "cohere_v2", "cohere_v1"))
    ]
    answered: Exchange | None = None
    tried = []
    for dialect, body in probes:
        path = dialect.paths[0]
        exchange = session.post("baseline", path, f"{dialect.name} request", body)
        tried.append(exchange)
        answer = session.answer(exchange)
        if answer is not None:
            read_as = session.replies[exchange.id].dialect
            shape_dialect = RERANK_DIALECTS["jina"] if read_as == "jina" else dialect
            learned.dialect, learned.path, answered = shape_dialect, path, exchange
            break
    if learned.dialect is None or answered is None:
        problem = "the baseline answers none of the rerank dialects (TEI, Cohere v1/v2, Jina)"
        return learned, [unknown("dialect", problem, tried)]
    found.append(
        finding(
            "dialect",
            learned.dialect.name,
            "measured",
            f"{learned.dialect.name} at {learned.path}",
            shown=[answered],
        )
    )
    base = session.answer(answered)
    assert base is not None
    # what the upstream says for the same pairs, raw
    session.budgets["candidate"].take()
    limit = _max_model_len(session.clients["candidate"].get("/v1/models"))
    raw_exchange = session.post(
        "candidate",
        "/rerank",
        "raw logits",
        {
            "model": learned.upstream_model,
            "query": QUERY,
            "documents": list(DOCUMENTS),
            "use_activation": False,
        },
    )
    raw = session.answer(raw_exchange)
    if raw is None:
        return learned, [
            *found,
            unknown(
                "scores", f"the candidate does not rerank: {raw_exchange.brief()}", [raw_exchange]
            ),
        ]
    scale, note = _scale(base.scores, raw.scores)
    if scale is None:
        problem = (
            "the baseline's scores are neither the candidate's logits nor their sigmoid "
            f"({note}): another model?"
        )
        found.append(unknown("scores", problem, [answered, raw_exchange]))
    else:
        learned.scores = scale
        found.append(finding("scores", scale, "verified", note, shown=[answered, raw_exchange]))
    learned.top_n = base.count if base.count < len(DOCUMENTS) else None
    learned.return_documents = base.documents
    returned = "returned" if base.documents else "not returned"
    summary = f"{base.count} of {len(DOCUMENTS)} results; documents {returned}"
    found.append(finding("top_n", learned.top_n, "measured", summary, shown=[answered]))
    refusals: list[tuple[ErrorClass, Exchange]] = []
    if limit is not None and local is not None:
        learned.max_tokens = limit
        found += _long_pairs(session, local, learned, limit, refusals)
    # errors
    dialect = learned.dialect
    bad: dict[str, tuple[ErrorClass, dict[str, Any] | bytes]] = {
        "malformed JSON": (ErrorClass.MALFORMED, MALFORMED),
        "no documents": (ErrorClass.INVALID, dialect.write_request(model, QUERY, ())),
    }
    if dialect.names_model:
        bad["unknown model"] = (
            ErrorClass.UNKNOWN_MODEL,
            dialect.write_request(UNKNOWN_MODEL, QUERY, DOCUMENTS[:2]),
        )
    for label, (kind, bad_body) in bad.items():
        refusals.append((kind, session.post("baseline", learned.path, label, bad_body)))
    learned.errors, errors_found = learn_errors(refusals)
    return learned, found + errors_found


def _max_model_len(listing: HttpResult) -> int | None:
    try:
        doc = orjson.loads(listing.body)
    except orjson.JSONDecodeError:
        return None
    for entry in doc.get("data", []) if isinstance(doc, dict) else []:
        if isinstance(entry, dict) and type(entry.get("max_model_len")) is int:
            return int(entry["max_model_len"])
    return None


def _scale(base: Mapping[int, float], raw: Mapping[int, float]) -> tuple[str | None, str]:
    if set(base) - set(raw):
        return None, "different documents"
    worst_raw = max(abs(base[i] - raw[i]) for i in base)
    worst_sigmoid = max(abs(base[i] - 1 / (1 + math.exp(-raw[i]))) for i in base)
    note = f"max difference {worst_raw:.2e} to the logits, {worst_sigmoid:.2e} to their sigmoid"
    if worst_raw <= SCORE_TOLERANCE:
        return "RAW", note
    if worst_sigmoid <= SCORE_TOLERANCE:
        return "SIGMOID", note
    return None, note


def _long_pairs(
    session: RerankSession,
    local: LocalModel,
    learned: LearnedRerank,
    limit: int,
    refusals: list[tuple[ErrorClass, Exchange]],
) -> list[Finding]:
    """A pair over the limit: cut by the baseline as the upstream's
    truncate_prompt_tokens cuts it, or refused."""
    assert learned.dialect is not None
    long_doc = plain_words(limit + 64)
    documents = (DOCUMENTS[0], long_doc)
    body = learned.dialect.write_request(learned.model, QUERY, documents)
    exchange = session.post("baseline", learned.path, "a pair over the limit", body)
    answer = session.answer(exchange)
    if answer is None:
        learned.cut_long_pairs = False
        refusals.append((ErrorClass.TOO_LARGE, exchange))
        summary = f"{limit} tokens a pair; longer ones refused ({exchange.status})"
        return [finding("max_tokens", limit, "measured", summary, shown=[exchange])]
    cut = session.post(
        "candidate",
        "/rerank",
        "the pair cut by truncate_prompt_tokens",
        {
            "model": learned.upstream_model,
            "query": QUERY,
            "documents": list(documents),
            "use_activation": False,
            "truncate_prompt_tokens": limit,
        },
    )
    theirs = session.answer(cut)
    if theirs is None:
        problem = f"the candidate does not cut a long pair: {cut.brief()}"
        return [unknown("max_tokens", problem, [exchange, cut])]
    logit_of_long = theirs.scores[1]
    expected = logit_of_long if learned.scores == "RAW" else 1 / (1 + math.exp(-logit_of_long))
    got = answer.scores.get(1, math.nan)
    same = abs(got - expected) <= SCORE_TOLERANCE
    summary = (
        f"{limit} tokens a pair; longer ones cut (score {got:.6f}, the upstream's cut "
        f"{expected:.6f})"
    )
    problem = (
        ""
        if same
        else "the baseline cuts long pairs elsewhere than the upstream's truncate_prompt_tokens"
    )
    return [
        finding(
            "max_tokens",
            limit,
            "verified" if same else "measured",
            summary,
            shown=[exchange, cut],
            problem=problem,
        )
    ]
