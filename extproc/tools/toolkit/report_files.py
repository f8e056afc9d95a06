"""Writing a tool's report: its JSON and the files of its report directory.

Every tool writes the same way: the directory is made if missing, each file written
whole; the JSON is indented, with numpy values as numbers and a non-finite float as
null (JSON has no NaN).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson


def jsonable(value: Any) -> Any:
    """``value`` with non-finite floats as None, dict keys as strings, tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def report_json(doc: Any) -> bytes:
    """The report's JSON, indented."""
    return orjson.dumps(jsonable(doc), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)


def write_report(out: Path, files: Mapping[str, str | bytes]) -> None:
    """Write each of ``files`` (name -> text or bytes) into the directory ``out``.
    OSError when the directory or a file cannot be written."""
    out.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if isinstance(content, bytes):
            (out / name).write_bytes(content)
        else:
            (out / name).write_text(content, encoding="utf-8")
