"""The rerank probing plan: every rerank learner in order, into one
:class:`LearnedRerank` per path the baseline serves (the policy's ``rerankers``).

The paths and dialects first (nothing else can be learned without an answer), then
the candidate's own facts (its limit, its raw logits for the learning pairs), then
per path its defaults (scores, results, documents), what it does with a pair over
the limit, and last its error dialect from every refusal seen on the way. Once a
server's budget is spent, every later learner is marked not learned.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from extproc.core.api_errors import ErrorClass
from extproc.core.policy.model import TokenizerSource
from extproc.core.tasks.rerank import RerankDialect
from extproc.tools.learn.errors_learner import TOP_N_ZERO, learn_errors
from extproc.tools.learn.findings import Finding, finding, unknown
from extproc.tools.learn.rerank_long_pairs_learner import learn_long_pairs
from extproc.tools.learn.rerank_paths_learner import DOCUMENTS, QUERY, FoundPath, learn_paths
from extproc.tools.learn.rerank_scores_learner import learn_defaults, max_model_len, upstream_rerank
from extproc.tools.learn.session import Exchange, Session
from extproc.tools.toolkit.budgeted_client import BudgetSpentError
from extproc.tools.toolkit.contract_table import UNKNOWN_MODEL
from extproc.tools.toolkit.rerank_requests import MALFORMED


@dataclass
class LearnedRerank:
    """One rerank path's contract, as learned so far."""

    model: str
    upstream_model: str
    tokenizer: TokenizerSource | None
    dialect: RerankDialect
    path: str
    scores: str = "SIGMOID"
    top_n: int | None = None
    return_documents: bool | None = None
    max_tokens: int | None = None
    refuse_long_pairs: bool = False
    any_name: bool = False  # an unknown model name is answered as this reranker
    errors: dict[str, Any] = field(default_factory=dict)  # the entry's `errors`


def learn_rerank(
    session: Session, tokenizer: TokenizerSource | None, model: str
) -> tuple[list[LearnedRerank], list[Finding]]:
    try:
        served, found = learn_paths(session, model)
    except BudgetSpentError as exc:
        return [], [unknown("budget", str(exc))]
    learned: list[LearnedRerank] = []
    spent = ""
    for one in served:
        entry = LearnedRerank(model, model, tokenizer, one.dialect, one.path)
        learned.append(entry)
        try:
            found += [unknown(one.path, f"not learned: {spent}")] if spent else []
            if not spent:
                found += _learn_path(session, one, entry)
        except BudgetSpentError as exc:
            spent = str(exc)
            found.append(unknown(one.path, f"not learned: {spent}"))
    return learned, found


def _learn_path(session: Session, served: FoundPath, entry: LearnedRerank) -> list[Finding]:
    """Every aspect of one served path, in order; its refusals give its errors."""
    found: list[Finding] = []
    raw = upstream_rerank(session, entry.upstream_model, "raw logits")
    defaults, more = learn_defaults(session, served, raw)
    found += more
    entry.scores = defaults.scores or entry.scores
    entry.top_n, entry.return_documents = defaults.top_n, defaults.return_documents
    refusals: list[tuple[ErrorClass, Exchange]] = []
    limit = max_model_len(session)
    if limit is not None and entry.tokenizer is not None:
        entry.max_tokens = limit
        names = (entry.model, entry.upstream_model)
        long = learn_long_pairs(session, served, names, limit, defaults.scores)
        found.append(long.finding)
        if long.refused is not None:
            entry.refuse_long_pairs = True
            refusals.append((ErrorClass.TOO_LARGE, long.refused))
    dialect = served.dialect
    bad: dict[str, tuple[ErrorClass, dict[str, Any] | bytes]] = {
        "malformed JSON": (ErrorClass.MALFORMED, MALFORMED),
        "no documents": (ErrorClass.INVALID, dialect.write_request(entry.model, QUERY, ())),
    }
    if any("top_n" in option for option in dialect.client_options.values()):
        # a FastAPI server's body differs by the check that failed (pydantic's type, ctx)
        body = dialect.write_request(entry.model, QUERY, DOCUMENTS[:2], top_n=0)
        bad[TOP_N_ZERO] = (ErrorClass.INVALID, body)
    if dialect.names_model:
        body = dialect.write_request(UNKNOWN_MODEL, QUERY, DOCUMENTS[:2])
        bad["unknown model"] = (ErrorClass.UNKNOWN_MODEL, body)
    for label, (kind, bad_body) in bad.items():
        answer = session.post("baseline", served.path, label, bad_body, [dialect])
        refusals.append((kind, answer))
        if kind is ErrorClass.UNKNOWN_MODEL and answer.ranking is not None:
            entry.any_name = True
            summary = f"an unknown model name is answered: {answer.brief()}"
            found.append(
                finding(f"{served.path} any_name", True, "measured", summary, shown=[answer])
            )
    entry.errors, errors_found = learn_errors(refusals)
    return found + [_at(served.path, f) for f in errors_found]


def _at(path: str, item: Finding) -> Finding:
    """A finding named for the path it is about."""
    return replace(item, field=f"{path} {item.field}")
