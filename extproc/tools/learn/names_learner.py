"""The model names the baseline answers: another name than its model's (an unknown
one) and none at all, each answered as its model (the vector of the plain text) or
refused (an error the errors learner reads)."""

from __future__ import annotations

from dataclasses import dataclass

from extproc.tools.learn.basics_learner import Basics
from extproc.tools.learn.findings import Finding, finding
from extproc.tools.learn.local import TEXT
from extproc.tools.learn.session import Exchange, Session

NO_MODEL = "no model"


@dataclass(frozen=True)
class Names:
    any_name: bool  # an unknown name is its model
    unnamed: bool  # a request naming none is its model
    no_model: Exchange  # its answer to a request naming none


def learn_names(session: Session, basics: Basics, unknown: Exchange) -> tuple[Names, list[Finding]]:
    """``unknown``: the baseline's answer to the plain text under an unknown name."""
    no_model = session.send("baseline", NO_MODEL, {"input": [TEXT]})
    takes_unknown = unknown.ok and unknown.same_as(basics.plain)
    takes_none = no_model.ok and no_model.same_as(basics.plain)
    found = [
        finding(
            "any_name",
            takes_unknown,
            "verified",
            f"an unknown model name: {unknown.brief()}",
            shown=[unknown, basics.plain],
        ),
        finding(
            "unnamed",
            takes_none,
            "verified",
            f"no model name: {no_model.brief()}",
            shown=[no_model, basics.plain],
        ),
    ]
    for answer, taken in ((unknown, takes_unknown), (no_model, takes_none)):
        if answer.ok and not taken:
            found.append(
                finding(
                    "model",
                    None,
                    "measured",
                    f"{answer.label}: answered with another vector than the model's",
                    shown=[answer, basics.plain],
                    problem=f"the baseline answers {answer.label!r} as another model",
                )
            )
    return Names(takes_unknown, takes_none, no_model), found
