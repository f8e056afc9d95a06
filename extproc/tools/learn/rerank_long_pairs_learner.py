"""What a served rerank path does with a (query, document) pair over the model's
token limit: cut as the candidate's ``truncate_prompt_tokens`` cuts it (the score
must be the candidate's for the cut pair), or refused (its status, an error the
errors learner reads)."""

from __future__ import annotations

from dataclasses import dataclass

from extproc.core.tasks.rerank import sigmoid
from extproc.tools.learn.findings import Confidence, Finding, finding, unknown
from extproc.tools.learn.rerank_paths_learner import DOCUMENTS, QUERY, FoundPath
from extproc.tools.learn.rerank_scores_learner import upstream_rerank
from extproc.tools.learn.session import Exchange, Session
from extproc.tools.parity.rerank_comparison import SCORE_TOLERANCE
from extproc.tools.toolkit.long_text import plain_words


@dataclass(frozen=True)
class LongPairs:
    refused: Exchange | None  # the refusal, when the baseline refuses such pairs
    finding: Finding


def learn_long_pairs(
    session: Session, served: FoundPath, names: tuple[str, str], limit: int, scores: str | None
) -> LongPairs:
    """``names``: the model's name at the baseline and at the candidate."""
    model, upstream_model = names
    field = f"{served.path} max_tokens"
    long_doc = plain_words(limit + 64)
    documents = (DOCUMENTS[0], long_doc)
    body = served.dialect.write_request(model, QUERY, documents)
    readers = [served.dialect]
    exchange = session.post("baseline", served.path, "a pair over the limit", body, readers)
    answer = exchange.ranking
    if answer is None:
        summary = f"{limit} tokens a pair; longer ones refused ({exchange.status})"
        return LongPairs(exchange, finding(field, limit, "measured", summary, shown=[exchange]))
    cut = upstream_rerank(
        session,
        upstream_model,
        "the pair cut by truncate_prompt_tokens",
        documents=list(documents),
        truncate_prompt_tokens=limit,
    )
    theirs = cut.ranking
    if theirs is None:
        problem = f"the candidate does not cut a long pair: {cut.brief()}"
        return LongPairs(None, unknown(field, problem, [exchange, cut]))
    logit_of_long = theirs.scores[1]
    expected = logit_of_long if scores == "RAW" else sigmoid(logit_of_long)
    got = answer.scores.get(1, float("nan"))
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
    confidence: Confidence = "verified" if same else "measured"
    shown = [exchange, cut]
    return LongPairs(None, finding(field, limit, confidence, summary, shown=shown, problem=problem))
