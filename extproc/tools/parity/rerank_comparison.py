"""Two servers' replies to one rerank request, compared as a client of the dialect
sees them (pure): the status, an error body's shape, and for an answer the number of
results, whether the documents come back, the order and every score (within
:data:`SCORE_TOLERANCE`).

A reply is read in the dialect the caller names (the probe's ``--dialect``, the
route a shadow pair was tapped on): a 2xx body that dialect does not read is no
answer to its clients. Only a caller that has yet to learn the dialect reads in
whichever dialect answers (:func:`read_any_answer`). The probe, shadow mode and
learn's verification all compare with :func:`compare_replies`, so they call the
same things a difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from extproc.core.dialects import RERANK_DIALECTS
from extproc.core.status import is_success
from extproc.core.tasks.rerank import Ranking, RerankDialect
from extproc.core.upstream_errors import parse_upstream_error
from extproc.tools.parity.json_shape import skeleton, skeleton_difference

# Scores a client would call equal: float32 logits through two engines, or their sigmoid.
SCORE_TOLERANCE = 1e-4


def read_any_answer(body: bytes) -> tuple[RerankDialect, Ranking] | None:
    """The first dialect of the registry whose reader takes ``body``, and its reading;
    None when none does. The readers tell the shapes apart (TEI's array, Cohere's
    ``meta``, Jina's ``usage`` without it), but not the versions of one shape: a Cohere
    answer reads as v1's."""
    for dialect in RERANK_DIALECTS.values():
        ranking = dialect.read_answer(body)
        if ranking is not None:
            return dialect, ranking
    return None


@dataclass(frozen=True)
class RerankReply:
    """One server's reply to a rerank request, kept as the comparison needs it (the
    answer, or an error body's shape), never the raw body."""

    status: int  # <= 0: no answer
    answer: Ranking | None  # a 2xx body the dialect reads
    # The dialect it was read in: the caller's, or the one that read it ("" when the
    # caller named none and no dialect reads it).
    dialect: str
    error_shape: str  # a non-answer's body shape (extproc.core.upstream_errors.Shape)
    said: str  # for people: "200, 4 results", "422, fastapi: ..."
    # What a client's code reads of the body (json_shape.skeleton; None: not JSON).
    skeleton: Any = None

    @classmethod
    def read(cls, status: int, body: bytes, dialect: RerankDialect | None = None) -> RerankReply:
        """``body`` read in ``dialect``; with None, in whichever dialect reads it."""
        name = "" if dialect is None else dialect.name
        if status <= 0:
            return cls(status, None, name, "", "no answer")
        try:
            body_skeleton = skeleton(orjson.loads(body))
        except orjson.JSONDecodeError:
            body_skeleton = None
        answer = None
        if is_success(status):
            if dialect is None:
                found = read_any_answer(body)
                if found is not None:
                    name, answer = found[0].name, found[1]
            else:
                answer = dialect.read_answer(body)
        if answer is not None:
            said = f"{status}, {answer.count} results"
            return cls(status, answer, name, "", said, body_skeleton)
        error = parse_upstream_error(body)
        if is_success(status):
            said = f"{status}, no {name or 'rerank'} answer"
        else:
            said = f"{status}, {error.shape}: {(error.message or '')[:60]}"
        return cls(status, None, name, error.shape, said, body_skeleton)

    @property
    def results(self) -> str:
        """What a client got, as a difference names it: "4 tei results", "no tei answer"."""
        if self.answer is None:
            return f"no {self.dialect or 'rerank'} answer"
        return f"{self.answer.count} {self.dialect} results"


# The kinds of difference, a fixed set (a metric's or a count's label).
DIFFERENCES = ("status", "error body", "body", "results", "another order", "scores differ")


@dataclass(frozen=True)
class RerankRow:
    """One request's replies compared."""

    label: str
    baseline: str  # what each side answered, for people
    candidate: str
    problem: str  # "" when a client sees the same; else for people, with its figures
    difference: str = ""  # the problem's kind, one of DIFFERENCES; "" when the same
    baseline_answered: bool = False  # the baseline gave an answer in the dialect
    worst_score_difference: float | None = None  # both answered the same documents


def compare_replies(label: str, old: RerankReply, new: RerankReply) -> RerankRow:
    """The baseline's reply against the candidate's, as a client sees them."""
    a, b = old.answer, new.answer
    worst = None
    if a is not None and b is not None and set(a.scores) == set(b.scores) and a.scores:
        worst = max(abs(a.scores[i] - b.scores[i]) for i in a.scores)
    problem, difference = "", ""
    shaped = skeleton_difference(old.skeleton, new.skeleton) if old.status == new.status else None
    if old.status != new.status:
        problem, difference = f"status {old.status} vs {new.status}", "status"
    elif a is None and b is None:
        if old.error_shape != new.error_shape:
            shapes = f"{old.error_shape} vs {new.error_shape}"
            problem, difference = f"error body {shapes}", "error body"
        elif shaped is not None and old.status > 0:
            problem, difference = f"the error body differs at {shaped}", "error body"
    elif a is None or b is None or old.dialect != new.dialect:
        problem, difference = f"{old.results} vs {new.results}", "results"
    elif a.count != b.count or a.documents != b.documents:
        documents = f"documents {_returned(a)} vs {_returned(b)}"
        problem = f"{old.results} vs {new.results}" if a.count != b.count else documents
        difference = "results"
    elif a.order != b.order:
        problem, difference = "another order", "another order"
    elif worst is not None and worst > SCORE_TOLERANCE:
        problem, difference = f"scores differ by {worst:.2e}", "scores differ"
    elif shaped is not None:
        problem, difference = f"the body differs at {shaped}", "body"
    return RerankRow(label, old.said, new.said, problem, difference, a is not None, worst)


def _returned(ranking: Ranking) -> str:
    return "returned" if ranking.documents else "not returned"
