"""The baseline's error dialect: the status it gives each kind of client mistake and
the shape of its error bodies (the policy's ``errors``).

Nothing is asked here: the other learners' refusals are read, each filed under the
kind of mistake the gateway names it (:class:`extproc.core.error_envelope.ErrorClass`):
malformed JSON; an empty or missing input and an unknown ``input_type`` (invalid); an
unknown model; refused ``dimensions``; a refused ``instruction``; a refused long input.
A kind answered with two statuses, or bodies of a shape no dialect writes, is named.
``too_large`` is never asked (it would take a body over the gateway's own limit): it
keeps the gateway's 413.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from extproc.core.error_envelope import VALIDATED, ErrorClass, ErrorShape
from extproc.tools.learn.findings import Finding, finding
from extproc.tools.learn.session import Exchange

# The body shapes the core's reader names, as the dialect that writes them.
SHAPES: Mapping[str, ErrorShape] = {
    "openai": ErrorShape.OPENAI,
    "detail-list": ErrorShape.FASTAPI,
    "detail": ErrorShape.FASTAPI,
    "flat": ErrorShape.FLAT,
    "error-string": ErrorShape.TEI,
}


def learn_errors(
    refusals: Iterable[tuple[ErrorClass, Exchange]],
) -> tuple[dict[str, Any], list[Finding]]:
    """(the policy's ``errors`` section, findings) from the baseline's refusals."""
    by_class: dict[ErrorClass, list[Exchange]] = {}
    for kind, exchange in refusals:
        if exchange.status >= 400 and exchange.vectors is None:
            by_class.setdefault(kind, []).append(exchange)
    shown = [e for exchanges in by_class.values() for e in exchanges]
    if not shown:
        return {}, [finding("errors", None, "default", "no refusal seen: OpenAI's")]
    problems: list[str] = []
    status: dict[str, int] = {}
    for kind, exchanges in by_class.items():
        seen = sorted({e.status for e in exchanges})
        if len(seen) > 1:
            labels = ", ".join(f"{e.label} {e.status}" for e in exchanges)
            problems.append(f"{kind.value} is answered with several statuses ({labels})")
        status[kind.value] = seen[0]
    shape, shape_problems = _shape(by_class)
    notes = [
        f"{kind.value}: {', '.join(f'{e.label} {e.status} ({e.envelope})' for e in exchanges)}"
        for kind, exchanges in by_class.items()
    ]
    section: dict[str, Any] = {"shape": shape.name if shape else "OPENAI", "status": status}
    summary = f"{section['shape']} bodies; " + ", ".join(f"{k} {v}" for k, v in status.items())
    return section, [
        finding(
            "errors",
            section,
            "measured" if len(shown) < 3 else "verified",
            summary,
            shown=shown,
            notes=notes,
            problem="; ".join(problems + shape_problems),
        )
    ]


def _shape(
    by_class: Mapping[ErrorClass, Sequence[Exchange]],
) -> tuple[ErrorShape | None, list[str]]:
    """The one dialect that writes every body seen, or None and what does not fit."""
    shapes = {SHAPES.get(e.envelope) for exchanges in by_class.values() for e in exchanges}
    if None in shapes or len(shapes) != 1:
        seen = sorted({e.envelope for exchanges in by_class.values() for e in exchanges})
        return None, [
            f"error bodies of shapes {seen}: a dialect writes one of openai, "
            "FastAPI's detail, flat or TEI's"
        ]
    (shape,) = shapes
    problems = []
    if shape is ErrorShape.FASTAPI:
        for kind, exchanges in by_class.items():
            want = "detail-list" if kind in VALIDATED else "detail"
            odd = [e for e in exchanges if e.envelope != want]
            if odd:
                problems.append(
                    f"{kind.value} answered as {odd[0].envelope}; FastAPI's shape gives {want} "
                    "(a list for what a request model validates, a text for the rest)"
                )
    return shape, problems
