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

from collections.abc import Iterable, Mapping
from typing import Any, Final

import orjson

from extproc.core.api_errors import ErrorClass
from extproc.core.error_dialect import NARROWER, SHAPE_TEMPLATES
from extproc.core.error_templates import offending_input
from extproc.core.json_templates import Template
from extproc.tools.learn.findings import Finding, finding
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
) -> tuple[dict[str, Any], list[Finding]]:
    """(the policy's ``errors`` section, findings) from the baseline's refusals."""
    by_class: dict[ErrorClass, list[Exchange]] = {}
    for kind, exchange in refusals:
        if exchange.status >= 400 and not exchange.ok:
            by_class.setdefault(kind, []).append(exchange)
    shown = [e for exchanges in by_class.values() for e in exchanges]
    if not shown:
        return {}, [finding("errors", None, "default", "no refusal seen: OpenAI's")]
    problems: list[str] = []
    status: dict[str, int] = {}
    templates: dict[ErrorClass, Template] = {}
    for kind, exchanges in by_class.items():
        seen = sorted({e.status for e in exchanges})
        if len(seen) > 1:
            labels = ", ".join(f"{e.label} {e.status}" for e in exchanges)
            problems.append(f"{kind.value} is answered with several statuses ({labels})")
        status[kind.value] = seen[0]
        bodies = [body_template(e.body, e.status, e.sent) for e in exchanges]
        if any(t is None for t in bodies):
            odd = next(e for e, t in zip(exchanges, bodies, strict=True) if t is None)
            problems.append(f"{kind.value}: the body of {odd.label!r} is not JSON")
            continue
        # One template for the kind when every body of it has one shape (keys, order,
        # value types); the first's constants are kept.
        differ = next(
            (d for t in bodies[1:] if (d := shape_difference(bodies[0], t)) is not None), None
        )
        if differ is not None:
            problems.append(f"{kind.value} is answered with bodies of several shapes ({differ})")
        else:
            templates[kind] = bodies[0]
    section: dict[str, Any] = {"status": status, **_bodies_section(templates)}
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


def body_template(body: bytes, status: int, sent: bytes = b"") -> Template | None:
    """The template a baseline's error body makes (None: the body is not JSON); ``sent``
    the request it answered, whose offending input a body may echo."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    message = _message_path(doc)
    echoed = offending_input(sent, _named_field(doc)) if sent else _NOTHING

    def slot(node: Any, path: tuple[Any, ...], key: Any) -> Any:
        if path == message:
            return "{message}"
        if path and node == echoed and key == "input":
            return "{input}"
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


def _bodies_section(templates: Mapping[ErrorClass, Template]) -> dict[str, Any]:
    """A shipped shape when the templates are its own; else ``body``, the template
    most kinds share by shape (INVALID's on a tie), and ``bodies`` for the kinds whose
    shape differs. A narrower kind not seen takes INVALID's body, as it takes its
    status."""
    if not templates:
        return {"shape": "OPENAI"}
    for shape, (default, own) in SHAPE_TEMPLATES.items():
        if all(_dumps(t) == _dumps(own.get(k, default)) for k, t in templates.items()):
            return {"shape": shape.name}
    groups: list[list[ErrorClass]] = []
    for kind, template in templates.items():
        group = next(
            (g for g in groups if shape_difference(templates[g[0]], template) is None), None
        )
        if group is None:
            groups.append([kind])
        else:
            group.append(kind)
    common = max(groups, key=lambda g: (len(g), ErrorClass.INVALID in g))
    lead = ErrorClass.INVALID if ErrorClass.INVALID in common else common[0]
    bodies = {k: t for k, t in templates.items() if k not in common}
    if ErrorClass.INVALID in bodies:
        bodies |= {k: bodies[ErrorClass.INVALID] for k in NARROWER if k not in templates}
    section: dict[str, Any] = {"body": templates[lead]}
    if bodies:
        section["bodies"] = {k.value: t for k, t in bodies.items()}
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
