"""HTTP status classes, as every layer reads them."""

from __future__ import annotations


def is_success(status: int) -> bool:
    """A 2xx: the body is an answer, not an error."""
    return 200 <= status < 300


def status_class(status: int) -> str:
    """'1xx'..'5xx' (or the first digit + 'xx' of any other status), or 'no answer'
    when there was no HTTP status at all (0 or below: connection failure, timeout)."""
    if status <= 0:
        return "no answer"
    return f"{status // 100}xx"
