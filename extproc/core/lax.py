"""Lax integers: which JSON values a pydantic v2 ``int`` field takes, and as what.

The legacy embedding server was FastAPI, whose request model validated in pydantic's
lax mode: an ``int`` field took ``256``, ``256.0`` (what ``1024 / 4`` serialises to in
Python), ``"256"``, ``" 256 "``, ``"256.00"``, ``"1_024"`` and ``true`` (as 1), and
refused ``256.5``, ``"256.5"``, ``"2.56e2"`` and ``"0x100"``. Clients written against
that server send such values; the ``legacy`` encoding profile keeps accepting them and
forwards the converted integer. ``tests/test_legacy_leniency.py`` checks these rules
against pydantic itself.
"""

from __future__ import annotations

import math
import re
from typing import Any, Final

# What pydantic's string parsing trims: Unicode White_Space (Rust's str::trim), which
# is not Python's str.strip() (that one also strips U+001C..U+001F).
_WHITESPACE: Final = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
# An integer as JSON writes it; ASCII digits only (str.isdigit() takes other scripts).
_JSON_INT: Final = re.compile(r"-?(?:0|[1-9][0-9]*)\Z")
# pydantic refuses longer digit strings (CPython's own int() limit).
_MAX_DIGITS: Final = 4300
# A float converts only strictly inside the signed 64-bit range.
_I64_BOUND: Final = 2**63


def lax_int(value: Any) -> int | None:
    """The integer a lax pydantic ``int`` field makes of a parsed JSON value, or None
    when it refuses the value."""
    if isinstance(value, int):  # bool included: lax mode takes true/false as 1/0
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return None
        return int(value) if -_I64_BOUND < value < _I64_BOUND else None
    if isinstance(value, str):
        return _str_int(value)
    return None


def _str_int(text: str) -> int | None:
    if _JSON_INT.match(text):
        return _digits_int(text)
    cleaned = _clean_int_str(text)
    if cleaned is None or not _JSON_INT.match(cleaned):
        return None
    return _digits_int(cleaned)


def _digits_int(text: str) -> int | None:
    return int(text) if len(text.lstrip("-")) <= _MAX_DIGITS else None


def _clean_int_str(text: str) -> str | None:
    """Surrounding whitespace, a leading ``+``, leading zeros, a ``.000`` fraction and
    single underscores between digits removed; None if nothing could be removed."""
    s = text.strip(_WHITESPACE)
    if s.startswith("+"):
        if s[1:].startswith("-"):
            return None
        s = s[1:]
    negative = s.startswith("-")
    if negative:
        if s[1:2] in ("-", "+"):
            return None
        s = s[1:]
    stripped = _strip_leading_zeros(s)
    if stripped is None:
        return None
    s = stripped
    dot = s.find(".")
    if dot >= 0:
        fraction = s[dot + 1 :]
        if fraction and fraction.strip("0") == "":
            s = s[:dot]
    sign = "-" if negative else ""
    if "_" in s and not (s.startswith("_") or s.endswith("_") or "__" in s):
        return sign + s.replace("_", "")
    if len(s) == len(text):
        return None
    return sign + s


def _strip_leading_zeros(s: str) -> str | None:
    """``007`` -> ``7``, ``000`` -> ``0``, ``00.0`` -> ``0.0``; None if ``s`` does not
    start like a number."""
    if not s:
        return None
    if s[0] != "0":
        return s if s[0] in "123456789-" else None
    for i in range(1, len(s)):
        c = s[i]
        if c in "0_":
            continue
        if c in "123456789-":
            return s[i:]
        if c == ".":
            return s[i - 1 :]
        return None
    return s[-1]


def integral_float_int(value: Any) -> int | None:
    """What a lax pydantic ``Literal`` of integers takes: a JSON integer, a float with
    no fraction (``256.0``), or a boolean (equal to 0 or 1); never a string."""
    if isinstance(value, int):  # bool included, as for lax_int
        return int(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value) if -_I64_BOUND < value < _I64_BOUND else None
    return None
