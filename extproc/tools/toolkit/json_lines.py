"""JSON lines read as the tools' corpora are: one object a line, blank lines skipped,
every fault named by source and line number."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any


def json_objects(
    lines: Iterable[str], source: str, error: type[ValueError], expected: str
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(``source:line``, the object) for each non-blank line; ``error`` for a line that
    is not JSON or not an object (``expected`` says what the line should hold)."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{where}: not JSON: {exc.msg}") from None
        if not isinstance(doc, dict):
            raise error(f"{where}: expected {expected}")
        yield where, doc
