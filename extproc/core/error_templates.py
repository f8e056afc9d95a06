"""Error bodies by template: the body a legacy server wrote for a kind of client
mistake, with its constant keys and values in its own key order, and slots the
gateway fills (pure; the templates are :mod:`extproc.core.json_templates`'). The
slots:

- ``{message}``: what went wrong, in the gateway's words (a string);
- ``{param}``: the offending field's name, or null when the mistake names none;
- ``{loc}``: FastAPI's location of it, ``["body", <field>]``, or where the body's JSON
  broke (``["body", <position>]``), else ``["body"]``;
- ``{status}``: the HTTP status answered (a number);
- ``{type}``, ``{code}``: OpenAI's ``type`` and ``code`` of the error;
- ``{tei_type}``: text-embeddings-inference's ``error_type`` for the status
  (``Validation``, ``Overloaded``, ``Backend``);
- ``{input}``: what the client sent that the mistake is about, as pydantic echoes it:
  the offending field's value, the whole body when the field is missing, the body's
  text when it is not JSON (long texts and arrays shortened, their types kept);
  ``{body}``: the whole body so (pydantic's input of a check on the whole request).

The shapes the gateway ships (:data:`SHAPE_TEMPLATES`) are such templates too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from extproc.core.api_errors import ApiError, ErrorClass
from extproc.core.json_templates import Template, fill

SLOTS: Final = (
    "message",
    "param",
    "loc",
    "status",
    "type",
    "code",
    "tei_type",
    "input",
    "body",
)
# What exactly is wrong, where a kind's bodies differ by it (ClientError.reason):
# pydantic's errors tell these apart (`missing`, `too_short`, `greater_than_equal`,
# `less_than_equal`, the rest), each with a `ctx` of its own.
REASONS: Final = ("missing", "empty", "below", "above", "value")


def fill_template(template: Template, error: ApiError, status: int) -> Any:
    """``template`` with its slots filled for ``error``, answered with ``status``."""
    values = _values(error, status)
    written = orjson.dumps(template).decode()
    if "{input}" in written:
        values["input"] = offending_input(error.request, error.param)
    if "{body}" in written:
        values["body"] = offending_input(error.request, None)
    return fill(template, values)


def _loc(error: ApiError) -> list[str | int]:
    if error.param:
        return ["body", error.param]
    position = getattr(error, "position", None)
    return ["body"] if position is None else ["body", position]


def tei_type(status: int) -> str:
    """text-embeddings-inference's ``error_type`` for an answer's status."""
    if status == 400:
        return "Empty"
    if status in (429, 503):
        return "Overloaded"
    return "Backend" if status >= 500 else "Validation"


def _values(error: ApiError, status: int) -> dict[str, Any]:
    return {
        "message": error.message,
        "param": error.param,
        "loc": _loc(error),
        "status": status,
        "type": error.type,
        "code": error.code,
        "tei_type": tei_type(status),
        "input": None,
        "body": None,
    }


def offending_input(request: bytes | None, param: str | None) -> Any:
    """What pydantic echoes as an error's ``input``: the field's value, the whole body
    when the field is missing, the text when the body is not JSON; bounded."""
    if request is None:
        return None
    try:
        doc = orjson.loads(request)
    except orjson.JSONDecodeError:
        return _bounded(request.decode("utf-8", "replace"))
    if isinstance(doc, dict) and param is not None and param in doc:
        return _bounded(doc[param])
    return _bounded(doc)


# An echoed input is cut to this much: its type stays, its size does not grow with
# what a client sends.
_ECHO_CHARS: Final = 200
_ECHO_ITEMS: Final = 8


def _bounded(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return value[:_ECHO_CHARS]
    if isinstance(value, list):
        return [] if depth > 3 else [_bounded(v, depth + 1) for v in value[:_ECHO_ITEMS]]
    if isinstance(value, dict):
        items = list(value.items())[:_ECHO_ITEMS]
        return {} if depth > 3 else {k: _bounded(v, depth + 1) for k, v in items}
    return value


_OPENAI_FIELDS: Final = {
    "message": "{message}",
    "type": "{type}",
    "param": "{param}",
    "code": "{code}",
}
OPENAI_TEMPLATE: Final = {"error": _OPENAI_FIELDS}
FLAT_TEMPLATE: Final = _OPENAI_FIELDS
TEI_TEMPLATE: Final = {"error": "{message}", "error_type": "{tei_type}"}
DETAIL_TEMPLATE: Final = {"detail": "{message}"}


def fastapi_list_template(pydantic_type: str) -> Template:
    """FastAPI's answer to what its request model refuses: a list of pydantic errors."""
    return {"detail": [{"type": pydantic_type, "loc": "{loc}", "msg": "{message}", "input": None}]}


# FastAPI's answers: a list for what its request model validates (JSON, types,
# ranges, extra fields), one text for what its handler raises.
FASTAPI_TEMPLATES: Final[Mapping[ErrorClass, Template]] = {
    ErrorClass.MALFORMED: fastapi_list_template("json_invalid"),
    ErrorClass.INVALID: fastapi_list_template("value_error"),
    ErrorClass.DIMENSIONS: fastapi_list_template("value_error"),
    ErrorClass.INSTRUCTION: fastapi_list_template("value_error"),
}
