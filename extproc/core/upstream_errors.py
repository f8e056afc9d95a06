"""Reading an upstream's error body, whatever shape it has.

Shapes read (docs/upstreams.md):
- Dynamo 1.6.x frontend: flat ``{"message", "type", "code"}``; sometimes an empty
  body (404 once its worker is gone);
- vLLM / OpenAI: ``{"error": {"message", "type", "param", "code"}}``;
- FastAPI (request validation in Python servers): ``{"detail": "text"}`` or
  ``{"detail": [{"loc": ["body", "input"], "msg": "..."}, ...]}``;
- anything else (a proxy's HTML, plain text): kept as a short text message.
One tolerant parser serves every upstream, so a policy naming the wrong upstream
kind still yields a useful message. It also names the body's shape (:data:`Shape`),
which is what a client that reads error bodies depends on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

MAX_MESSAGE_CHARS = 1000

# openai: {"error": {...}}; detail-list: FastAPI's validation errors; detail: FastAPI's
# HTTPException {"detail": "text"}; flat: {"message", ...} (Dynamo); error-string:
# {"error": "text"} (with "error_type": TEI's); other: JSON of another shape; text:
# not JSON; empty: no body.
Shape = Literal["openai", "detail-list", "detail", "flat", "error-string", "other", "text", "empty"]


@dataclass(frozen=True)
class UpstreamError:
    message: str | None
    param: str | None = None
    shape: Shape = "other"


def parse_upstream_error(body: bytes) -> UpstreamError:
    if not body.strip():
        return UpstreamError(None, shape="empty")
    try:
        doc: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        # HTML or plain text from a proxy: keep it, on one line.
        text = " ".join(body[:MAX_MESSAGE_CHARS].decode("utf-8", "replace").split())
        return UpstreamError(text if text and text.isprintable() else None, shape="text")
    if not isinstance(doc, dict):
        return UpstreamError(None)
    inner = doc.get("error")
    if isinstance(inner, dict):  # vLLM / OpenAI
        return UpstreamError(_text(inner.get("message")), _text(inner.get("param")), "openai")
    if isinstance(inner, str):
        return UpstreamError(_text(inner), shape="error-string")
    detail = doc.get("detail")
    if isinstance(detail, list):  # FastAPI validation errors
        return _fastapi_errors(detail)
    if "message" in doc:  # Dynamo
        return UpstreamError(_text(doc.get("message")) or _text(detail), shape="flat")
    shape: Shape = "detail" if "detail" in doc else "other"
    return UpstreamError(_text(detail), shape=shape)


def _fastapi_errors(detail: list[Any]) -> UpstreamError:
    """``[{"loc": [...], "msg": ...}]`` -> "loc.path: msg" for each entry, joined;
    ``param`` is the first entry's field (its location without the leading "body")."""
    messages: list[str] = []
    param: str | None = None
    for entry in detail:
        if not isinstance(entry, dict):
            continue
        msg = _text(entry.get("msg"))
        loc = entry.get("loc")
        path = [str(part) for part in loc] if isinstance(loc, list) else []
        where = ".".join(path)
        if msg is None and not where:
            continue
        messages.append(f"{where}: {msg or 'invalid'}" if where else str(msg))
        if param is None and path[1:] and path[0] == "body":
            param = ".".join(path[1:])
    return UpstreamError(_text("; ".join(messages)), param, "detail-list")


def _text(value: Any) -> str | None:
    # A blank message is no message: the client then gets the "rejected with HTTP N"
    # fallback rather than an empty string.
    if isinstance(value, str) and value.strip():
        return value[:MAX_MESSAGE_CHARS]
    return None
