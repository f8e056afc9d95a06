"""Rerank requests in a legacy dialect, and two servers' answers to one compared as a
client sees them (pure): the status, an error body's shape, and for an answer the
number of results, whether the documents come back, the order and every score
(within :data:`SCORE_TOLERANCE`). learn's verification, probe's rerank run and the
shadow comparator share it, so all three call the same things a difference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extproc.core.dialects import RERANK_DIALECTS
from extproc.core.tasks.rerank import Ranking, RerankDialect
from extproc.core.upstream_errors import parse_upstream_error
from extproc.tools.toolkit.long_text import plain_words
from extproc.tools.toolkit.report_format import cell, table

# Scores a client would call equal: float32 logits through two engines, or their sigmoid.
SCORE_TOLERANCE = 1e-4
UNKNOWN_MODEL = "no-such-model-extproc"
MALFORMED = b'{"query": '
# The readers tried on an answer of unknown dialect, in turn (Cohere v2 reads as v1).
_READERS = ("tei", "cohere_v1", "jina")


@dataclass(frozen=True)
class RerankAnswer:
    """A rerank answer, read in whatever dialect it came."""

    ranking: Ranking
    shape: str  # the name of the dialect whose reader took it

    @property
    def scores(self) -> Mapping[int, float]:
        return self.ranking.scores

    @property
    def order(self) -> tuple[int, ...]:
        return self.ranking.order

    @property
    def documents(self) -> bool:
        return self.ranking.documents

    @property
    def count(self) -> int:
        return self.ranking.count


def read_answer(body: bytes) -> RerankAnswer | None:
    """The answer in ``body``, or None when no rerank dialect reads it."""
    for name in _READERS:
        ranking = RERANK_DIALECTS[name].read_answer(body)
        if ranking is not None:
            return RerankAnswer(ranking, name)
    return None


def rerank_request(
    dialect: RerankDialect, model: str, query: str, documents: Sequence[str], **extra: Any
) -> dict[str, Any]:
    """A request as ``dialect``'s clients write it."""
    return dialect.write_request(model, query, documents, **extra)


def contract_requests(
    dialect: RerankDialect,
    model: str,
    query: str,
    documents: Sequence[str],
    max_tokens: int | None = None,
) -> dict[str, dict[str, Any] | bytes]:
    """What a client of ``dialect`` can send, by label: a plain request, the dialect's
    options, the client mistakes and, given the limit, a pair over it."""
    docs = list(documents)
    bodies: dict[str, dict[str, Any] | bytes] = {
        "plain": dialect.write_request(model, query, docs),
        "malformed JSON": MALFORMED,
        "no documents": dialect.write_request(model, query, ()),
    }
    for label, options in dialect.client_options.items():
        bodies[label] = dialect.write_request(model, query, docs, **options)
    if dialect.names_model:
        bodies["unknown model"] = dialect.write_request(UNKNOWN_MODEL, query, docs[:2])
    if max_tokens is not None:
        long = (docs[0], plain_words(max_tokens + 64))
        bodies["a pair over the limit"] = dialect.write_request(model, query, long)
        if dialect.cut_option is not None:
            bodies["a pair over the limit, truncate"] = dialect.write_request(
                model, query, long, **dialect.cut_option
            )
    return bodies


@dataclass(frozen=True)
class AnswerRow:
    label: str
    baseline: str  # what each side answered, for people
    candidate: str
    problem: str  # "" when a client sees the same; else for people, with its figures
    # the problem's kind, one of a fixed set (a metric's or a count's label): "status",
    # "error body", "results", "another order", "scores differ"; "" when the same
    difference: str = ""
    baseline_answered: bool = False  # the baseline gave a rerank answer
    worst_score_difference: float | None = None  # both answered the same documents


@dataclass(frozen=True)
class RerankReply:
    """One server's reply to a rerank request, kept as the comparison needs it (the
    answer, or an error body's shape), never the raw body."""

    status: int  # <= 0: no answer
    answer: RerankAnswer | None  # a 2xx rerank answer
    error_shape: str  # an error body's shape ("" for an answer)
    said: str  # for people: "200, 4 results", "422, fastapi: ..."

    @classmethod
    def read(cls, status: int, body: bytes) -> RerankReply:
        answer = read_answer(body) if 200 <= status < 300 else None
        if status <= 0:
            return cls(status, None, "", "no answer")
        if answer is not None:
            return cls(status, answer, "", f"{status}, {answer.count} results")
        error = parse_upstream_error(body)
        said = f"{status}, {error.shape}: {(error.message or '')[:60]}"
        return cls(status, None, error.shape, said)


def compare_replies(label: str, old: RerankReply, new: RerankReply) -> AnswerRow:
    """The baseline's reply against the candidate's, as a client sees them."""
    a, b = old.answer, new.answer
    worst = None
    if a is not None and b is not None and set(a.scores) == set(b.scores) and a.scores:
        worst = max(abs(a.scores[i] - b.scores[i]) for i in a.scores)
    problem, difference = "", ""
    if old.status != new.status:
        problem, difference = f"status {old.status} vs {new.status}", "status"
    elif a is None or b is None:
        if (a is None) != (b is None) or old.error_shape != new.error_shape:
            shapes = f"{old.error_shape or 'answer'} vs {new.error_shape or 'answer'}"
            problem, difference = f"error body {shapes}", "error body"
    elif a.shape != b.shape or a.count != b.count or a.documents != b.documents:
        problem, difference = f"{a.count} {a.shape} results vs {b.count} {b.shape}", "results"
    elif a.order != b.order:
        problem, difference = "another order", "another order"
    elif worst is not None and worst > SCORE_TOLERANCE:
        problem, difference = f"scores differ by {worst:.2e}", "scores differ"
    return AnswerRow(label, old.said, new.said, problem, difference, a is not None, worst)


def rows_table(rows: Sequence[AnswerRow], candidate: str) -> list[str]:
    """The rows as a Markdown table, the candidate's column named ``candidate``."""
    return table(
        ["request", "baseline", candidate, ""],
        [[r.label, cell(r.baseline), cell(r.candidate), cell(r.problem) or "same"] for r in rows],
    )
