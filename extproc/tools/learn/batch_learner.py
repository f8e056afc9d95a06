"""The most inputs the baseline takes in one request, and its refusal of more.

Batches of 16, 17 and 64 short texts are sent; a refused one is bisected down to the
limit (at most 7 more requests). The limit is the policy's ``limits.max_inputs``, the
refusal's status its ``errors.status.too_many_inputs``. None refused: the gateway's
own limit stays, and the verification sends the largest batch asked.
"""

from __future__ import annotations

from dataclasses import dataclass

from extproc.tools.learn.basics_learner import Basics
from extproc.tools.learn.findings import Finding, finding
from extproc.tools.learn.session import Exchange, Session, first_true

SIZES = (16, 17, 64)


@dataclass(frozen=True)
class Batches:
    limit: int | None  # the most inputs it takes (None: no limit up to the largest asked)
    refused: Exchange | None  # a refusal of a batch over the limit
    largest: int  # the largest batch it was seen to take


def batch(model: str, size: int) -> dict[str, object]:
    """A request of ``size`` short, distinct texts."""
    return {"model": model, "input": [f"text number {i} of a batch" for i in range(size)]}


def learn_batches(session: Session, basics: Basics) -> tuple[Batches, list[Finding]]:
    session.note("learn: how many inputs one request may have")
    asked = session.send_all([("baseline", f"{n} inputs", batch(basics.model, n)) for n in SIZES])
    shown = list(asked)
    refused = next((a for a in asked if not a.ok), None)
    taken = [n for n, a in zip(SIZES, asked, strict=True) if a.ok]
    if refused is None:
        summary = f"batches of up to {SIZES[-1]} inputs taken"
        found = finding("limits.max_inputs", None, "measured", summary, shown=shown)
        return Batches(None, None, SIZES[-1]), [found]
    low = max((n for n in taken if n < SIZES[asked.index(refused)]), default=0)
    high = SIZES[asked.index(refused)]

    def refuses(n: int) -> bool:
        answer = session.send("baseline", f"{n} inputs", batch(basics.model, n))
        shown.append(answer)
        return not answer.ok

    limit = first_true(refuses, low, high) - 1
    summary = f"at most {limit} inputs; more refused ({refused.status})"
    found = finding("limits.max_inputs", limit, "verified", summary, shown=shown)
    return Batches(limit, refused, limit), [found]
