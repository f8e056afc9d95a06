"""Typed optional fields of a request's JSON object, and an answer's JSON, as every
dialect reads them (pure): a wrong type is the client's 400, named by its field."""

from __future__ import annotations

from typing import Any

import orjson

from extproc.core.api_errors import InvalidFieldError

_KIND_NAMES = {str: "a string", bool: "a boolean", int: "an integer", list: "an array"}


def optional(doc: dict[str, Any], field: str, kind: type) -> Any:
    """``doc[field]`` when it is of ``kind``; None when absent or null."""
    value = doc.get(field)
    if value is None:
        return None
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise InvalidFieldError(f"'{field}' must be an integer.", param=field)
    if not isinstance(value, kind):
        raise InvalidFieldError(f"'{field}' must be {_KIND_NAMES[kind]}.", param=field)
    return value


def positive(doc: dict[str, Any], field: str) -> int | None:
    """An optional integer of at least 1."""
    value: int | None = optional(doc, field, int)
    if value is not None and value < 1:
        raise InvalidFieldError(f"'{field}' must be at least 1.", param=field, reason="below")
    return value


def read_json(body: bytes) -> Any:
    """An answer's JSON, or None when it is not JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
