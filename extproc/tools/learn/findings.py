"""What a learner concludes about one field: the value, how sure, and why.

A finding with a ``problem`` was not learned (or the policy cannot express what the
baseline does): the policy still gets the field, marked with a YAML comment, and the
command exits non-zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from extproc.tools.learn.session import Exchange

# verified: two independent observations agree (token counts and vectors);
# measured: observed once, nothing to cross-check it with;
# default: nothing to observe (the kind's or the model's default is written);
# unknown: not learned (see ``problem``).
Confidence = Literal["verified", "measured", "default", "unknown"]


@dataclass(frozen=True)
class Finding:
    field: str  # the policy field (or contract aspect) it is about
    value: Any  # what is written to the policy (YAML-able), or None
    confidence: Confidence
    summary: str  # one line: what was found
    exchanges: tuple[int, ...] = ()  # ids of the requests that show it
    notes: tuple[str, ...] = ()  # cosines, counts and comparisons, for people
    problem: str = ""  # non-empty: not learned, or not expressible in a policy
    warning: str = ""  # a difference the gateway will show, which does not stop the run


def finding(
    field: str,
    value: Any,
    confidence: Confidence,
    summary: str,
    *,
    shown: list[Exchange] | tuple[Exchange, ...] = (),
    notes: list[str] | tuple[str, ...] = (),
    problem: str = "",
    warning: str = "",
) -> Finding:
    """A Finding citing the given exchanges (each once, in order)."""
    ids = tuple(dict.fromkeys(e.id for e in shown))
    return Finding(field, value, confidence, summary, ids, tuple(notes), problem, warning)


def unknown(field: str, problem: str, shown: list[Exchange] | tuple[Exchange, ...] = ()) -> Finding:
    return finding(field, None, "unknown", problem, shown=shown, problem=problem)


def cos(value: float | None) -> str:
    return "-" if value is None else f"{value:.6f}"
