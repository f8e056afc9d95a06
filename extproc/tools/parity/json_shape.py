"""Two JSON documents compared as a client's code reads them (pure): the same keys, in
the same order, with values of the same types, at every level - not the same values.
A client that indexes `body["detail"][0]["loc"]`, iterates keys or checks a type sees
any of these differences; one that only logs the text sees none.

The types are JSON's as a decoder hands them over: an object, an array, a string, a
boolean, null, and a number that is an integer or not (``1`` and ``1.0`` decode to
different types in most languages). Arrays are compared item by item; one that is
longer is a difference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

# JSON's types by the Python type a decoder hands over (bool before int: a bool is one).
_JSON_TYPES: Final = (
    (type(None), "null"),
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def json_type(value: Any) -> str:
    for kind, name in _JSON_TYPES:
        if isinstance(value, kind):
            return name
    return type(value).__name__


def shape_difference(expected: Any, got: Any, path: str = "$") -> str | None:
    """The first place where ``got`` is not shaped as ``expected``, said for people
    (``$.error: keys [message, type] vs [type, message]``), or None."""
    want, have = json_type(expected), json_type(got)
    if want != have:
        return f"{path}: {want} vs {have}"
    if isinstance(expected, dict):
        return _object_difference(expected, got, path, shape_difference)
    if isinstance(expected, list):
        for index, (a, b) in enumerate(zip(expected, got, strict=False)):
            found = shape_difference(a, b, f"{path}[{index}]")
            if found:
                return found
        if len(expected) != len(got):
            return f"{path}: {len(expected)} items vs {len(got)}"
    return None


# How a skeleton writes an array: its items' distinct shapes, in order, and its length.
ARRAY: Final = "…array"
LENGTH: Final = "…length"


def skeleton(value: Any) -> Any:
    """What of ``value`` a client's code reads, small enough to keep and report: the
    type at each leaf, an object's keys in order, an array's distinct item shapes and
    its length (a vector is ``{"…array": ["number"], "…length": 384}``)."""
    if isinstance(value, dict):
        return {key: skeleton(item) for key, item in value.items()}
    if isinstance(value, list):
        shapes: list[Any] = []
        for item in value:
            shape = skeleton(item)
            if shape not in shapes:
                shapes.append(shape)
        return {ARRAY: shapes, LENGTH: len(value)}
    return json_type(value)


def skeleton_difference(expected: Any, got: Any, path: str = "$") -> str | None:
    """The first place where two skeletons differ, said as :func:`shape_difference`
    says it of the values, or None."""
    if isinstance(expected, dict) and isinstance(got, dict):
        if ARRAY in expected and ARRAY in got:
            if expected[LENGTH] != got[LENGTH]:
                return f"{path}: {expected[LENGTH]} items vs {got[LENGTH]}"
            if expected[ARRAY] != got[ARRAY]:
                return f"{path}[]: items of other shapes"
            return None
        if (ARRAY in expected) != (ARRAY in got):
            kinds = ["array" if ARRAY in s else "object" for s in (expected, got)]
            return f"{path}: {kinds[0]} vs {kinds[1]}"
        return _object_difference(expected, got, path, skeleton_difference)
    if expected != got:
        return f"{path}: {_kind(expected)} vs {_kind(got)}"
    return None


def _kind(shape: Any) -> str:
    if isinstance(shape, dict):
        return "array" if ARRAY in shape else "object"
    return str(shape)


def _object_difference(
    expected: dict[str, Any],
    got: dict[str, Any],
    path: str,
    difference: Callable[[Any, Any, str], str | None],
) -> str | None:
    """Two objects' keys in order, then each value by ``difference``."""
    keys, other = list(expected), list(got)
    if keys != other:
        how = "key order" if set(keys) == set(other) else "keys"
        return f"{path}: {how} [{', '.join(keys)}] vs [{', '.join(other)}]"
    for key in keys:
        found = difference(expected[key], got[key], f"{path}.{key}")
        if found:
            return found
    return None
