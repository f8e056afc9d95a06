"""The baseline's error dialect: the status it gives each kind of client mistake and
the body it writes, as a template (the policy's ``errors``).

Nothing is asked here: the other learners' refusals are read, each filed under the
kind of mistake the gateway names it (:class:`extproc.core.api_errors.ErrorClass`).
Each body becomes a template (:mod:`extproc.core.error_templates`): its keys, key
order and constants as the baseline wrote them, and slots where the gateway's own
values go - the free text (``{message}``), the field the mistake names
(``{param}``, or FastAPI's ``{loc}``), the status (``{status}``). One template serves
every kind (``body``) unless some kinds' bodies differ (``bodies``: a FastAPI server's
list ``detail`` for what its request model validates beside a text ``detail`` for what
its handler raises). A kind answered with two statuses or two bodies, or a body that is
not JSON, is named. ``too_large`` is never asked (it would take a body over the
gateway's own limit): it keeps the gateway's 413 and the template of every kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import orjson

from extproc.core.api_errors import ErrorClass
from extproc.core.error_dialect import NARROWER, SHAPE_TEMPLATES
from extproc.core.error_templates import offending_input
from extproc.core.json_templates import Template
from extproc.tools.learn.findings import Finding, finding
from extproc.tools.learn.names_learner import NO_MODEL
from extproc.tools.learn.profile_learner import EMPTY_INPUT, NO_INPUT
from extproc.tools.learn.session import Exchange
from extproc.tools.parity.json_shape import shape_difference

# The fields a learning request can name in its refusal: the `{param}` slot's values.
REQUEST_FIELDS: Final = frozenset(
    {"model", "input", "inputs", "texts", "documents", "query", "dimensions"}
    | {"input_type", "instruction", "encoding_format", "prompt_name", "task", "top_n"}
)
# Keys whose text value is an error's message when a body has several texts.
_MESSAGE_KEYS: Final = ("message", "msg", "detail", "error", "description", "reason")


def learn_errors(
    refusals: Iterable[tuple[ErrorClass, Exchange]],
    reason_of: Callable[[ErrorClass, Exchange], str] | None = None,
) -> tuple[dict[str, Any], list[Finding]]:
    """(the policy's ``errors`` section, findings) from the baseline's refusals;
    ``reason_of``: what exactly is wrong in a refused request (default: by its label,
    :data:`REASON_OF`, else "value")."""
    reason = reason_of or (lambda kind, exchange: REASON_OF.get(exchange.label, "value"))
    by_class: dict[ErrorClass, list[Exchange]] = {}
    for kind, exchange in refusals:
        if exchange.status >= 400 and not exchange.ok:
            by_class.setdefault(kind, []).append(exchange)
    shown = [e for exchanges in by_class.values() for e in exchanges]
    if not shown:
        return {}, [finding("errors", None, "default", "no refusal seen: OpenAI's")]
    problems: list[str] = []
    status: dict[str, int] = {}
    by_reason: dict[str, int] = {}  # kind.reason -> a status other than the kind's
    templates: dict[str, Template] = {}  # by kind, or by kind and reason
    for kind, exchanges in by_class.items():
        reasons = [reason(kind, e) for e in exchanges]
        kind_status, reason_statuses, problem = _kind_statuses(kind, exchanges, reasons)
        status[kind.value] = kind_status
        by_reason |= reason_statuses
        problems += [problem] if problem else []
        bodies = [body_template(e.body, e.status, e.sent) for e in exchanges]
        if any(t is None for t in bodies):
            odd = next(e for e, t in zip(exchanges, bodies, strict=True) if t is None)
            problems.append(f"{kind.value}: the body of {odd.label!r} is not JSON")
            continue
        found, problem = _kind_templates(kind, reasons, bodies)
        templates |= found
        problems += [problem] if problem else []
    section: dict[str, Any] = {"status": status, **_bodies_section(templates)}
    if by_reason:
        section["status_by_reason"] = by_reason
    notes = [
        f"{kind.value}: {', '.join(f'{e.label} {e.status} ({e.envelope})' for e in exchanges)}"
        for kind, exchanges in by_class.items()
    ]
    said = section.get("shape") or "templates of their own"
    summary = f"{said} bodies; " + ", ".join(f"{k} {v}" for k, v in status.items())
    return section, [
        finding(
            "errors",
            section,
            "measured" if len(shown) < 3 else "verified",
            summary,
            shown=shown,
            notes=notes,
            problem="; ".join(problems),
        )
    ]


TOP_N_ZERO: Final = "top_n zero"
# What exactly is wrong in a learning request, by its label (the rest: a value).
REASON_OF = {
    TOP_N_ZERO: "below",
    EMPTY_INPUT: "empty",
    NO_INPUT: "missing",
    NO_MODEL: "missing",
    "no documents": "empty",
}


def _kind_statuses(
    kind: ErrorClass, exchanges: list[Exchange], reasons: list[str]
) -> tuple[int, dict[str, int], str]:
    """A kind's status; the statuses of its reasons that differ from it (when a
    reason tells them apart); a problem when even that does not."""
    seen: dict[str, set[int]] = {}
    for exchange, reason in zip(exchanges, reasons, strict=True):
        seen.setdefault(reason, set()).add(exchange.status)
    everything = sorted({s for statuses in seen.values() for s in statuses})
    if any(len(statuses) > 1 for statuses in seen.values()):
        labels = ", ".join(f"{e.label} {e.status}" for e in exchanges)
        return everything[0], {}, f"{kind.value} is answered with several statuses ({labels})"
    main = min(seen["value"]) if "value" in seen else everything[0]
    others = {f"{kind.value}.{r}": min(s) for r, s in seen.items() if min(s) != main}
    return main, others, ""


def _kind_templates(
    kind: ErrorClass, reasons: list[str], bodies: list[Template]
) -> tuple[dict[str, Template], str]:
    """A kind's template when every body of it has one shape (keys, order, value
    types; the first's constants are kept); else one by what exactly is wrong
    (``invalid.missing``), when that tells them apart; else a problem."""
    differ = next((d for t in bodies[1:] if (d := shape_difference(bodies[0], t))), None)
    if differ is None:
        return {kind.value: bodies[0]}, ""
    by_reason: dict[str, Template] = {}
    for reason, template in zip(reasons, bodies, strict=True):
        first = by_reason.setdefault(reason, template)
        if shape_difference(first, template) is not None:
            return {}, f"{kind.value} is answered with bodies of several shapes ({differ})"
    found = {f"{kind.value}.{reason}": t for reason, t in by_reason.items()}
    found[kind.value] = by_reason.get("value", bodies[0])
    return found, ""


def body_template(body: bytes, status: int, sent: bytes = b"") -> Template | None:
    """The template a baseline's error body makes (None: the body is not JSON); ``sent``
    the request it answered, whose offending input a body may echo."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    message = _message_path(doc)
    named = _named_field(doc)
    echoed = offending_input(sent, named) if sent else _NOTHING
    # pydantic echoes a field's value, or the whole body for a check on the request
    echo_slot = "{input}" if named else "{body}"

    def slot(node: Any, path: tuple[Any, ...], key: Any) -> Any:
        if path == message:
            return "{message}"
        if path and node == echoed and key == "input":
            return echo_slot
        if isinstance(node, dict):
            return {k: slot(v, (*path, k), k) for k, v in node.items()}
        if isinstance(node, list):
            if _is_loc(node) and len(node) > 1 and node[1] in REQUEST_FIELDS:
                return "{loc}"
            return [slot(v, (*path, i), None) for i, v in enumerate(node)]
        if isinstance(node, str) and node in REQUEST_FIELDS and key != "type":
            return "{param}"
        if type(node) is int and node == status:
            return "{status}"
        return node

    return slot(doc, (), None)


def _bodies_section(templates: Mapping[str, Template]) -> dict[str, Any]:
    """A shipped shape when the templates are its own; else ``body``, the template
    most kinds share by shape (INVALID's on a tie), and ``bodies`` for the kinds (and
    kinds' reasons) whose shape differs. A narrower kind not seen takes INVALID's
    body, as it takes its status."""
    if not templates:
        return {"shape": "OPENAI"}
    kinds = {k: t for k, t in templates.items() if "." not in k}
    for shape, (default, own) in SHAPE_TEMPLATES.items():
        expected = {kind.value: own.get(kind, default) for kind in ErrorClass}
        if len(kinds) == len(templates) and all(
            _dumps(t) == _dumps(expected[k]) for k, t in kinds.items()
        ):
            return {"shape": shape.name}
    groups: list[list[str]] = []
    for key, template in kinds.items():
        group = next((g for g in groups if shape_difference(kinds[g[0]], template) is None), None)
        if group is None:
            groups.append([key])
        else:
            group.append(key)
    invalid = ErrorClass.INVALID.value
    common = max(groups, key=lambda g: (len(g), invalid in g))
    lead = invalid if invalid in common else common[0]
    bodies = {k: t for k, t in templates.items() if k not in common}
    if invalid in bodies:
        bodies |= {k.value: bodies[invalid] for k in NARROWER if k.value not in templates}
    section: dict[str, Any] = {"body": templates[lead]}
    if bodies:
        section["bodies"] = bodies
    return section


def _message_path(doc: Any) -> tuple[Any, ...] | None:
    """Where the message is: the text under a message-like key, else the longest text
    (of at least two words) anywhere in the body."""
    texts: list[tuple[tuple[Any, ...], str, Any]] = []

    def walk(node: Any, path: tuple[Any, ...], key: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, (*path, k), k)
        elif isinstance(node, list) and not _is_loc(node):
            for i, v in enumerate(node):
                walk(v, (*path, i), None)
        elif isinstance(node, str) and node not in REQUEST_FIELDS:
            texts.append((path, node, key))

    walk(doc, (), None)
    keyed = [t for t in texts if t[2] in _MESSAGE_KEYS]
    pick = keyed or [t for t in texts if " " in t[1].strip()]
    if not pick:
        return None
    return max(pick, key=lambda t: len(t[1]))[0]


_NOTHING: Final = object()


def _named_field(doc: Any) -> str | None:
    """The request field an error body names (the first found), if any."""
    if isinstance(doc, dict):
        for value in doc.values():
            found = _named_field(value)
            if found:
                return found
    elif isinstance(doc, list):
        if _is_loc(doc) and len(doc) > 1 and doc[1] in REQUEST_FIELDS:
            return str(doc[1])
        for value in doc:
            found = _named_field(value)
            if found:
                return found
    elif isinstance(doc, str) and doc in REQUEST_FIELDS:
        return doc
    return None


def _is_loc(node: list[Any]) -> bool:
    """FastAPI's location of an error: ``["body"]`` or ``["body", <field>, ...]``."""
    return bool(node) and node[0] == "body" and all(isinstance(p, str | int) for p in node)


def _dumps(template: Template) -> str:
    return orjson.dumps(template).decode()
