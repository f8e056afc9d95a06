"""Reading an upstream's error body, whatever shape it has.

Measured shapes (upstream-behaviour.md):
- Dynamo 1.6.1 frontend: flat ``{"message", "type", "code"}``; sometimes an empty
  body (404 after the worker went away);
- vLLM: ``{"error": {"message", "type", "param", "code": <int>}}``;
- anything else (a proxy's HTML, plain text): kept as a short text message.
One tolerant parser serves every flavour, so a policy naming the wrong flavour
still yields a useful message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

MAX_MESSAGE_CHARS = 1000


@dataclass(frozen=True)
class UpstreamError:
    message: str | None
    param: str | None = None


def parse_upstream_error(body: bytes) -> UpstreamError:
    if not body.strip():
        return UpstreamError(None)
    try:
        doc: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        # HTML or plain text from a proxy: keep it, on one line.
        text = " ".join(body[:MAX_MESSAGE_CHARS].decode("utf-8", "replace").split())
        return UpstreamError(text if text and text.isprintable() else None)
    if isinstance(doc, dict):
        inner = doc.get("error")
        if isinstance(inner, dict):  # vLLM / OpenAI
            return UpstreamError(_text(inner.get("message")), _text(inner.get("param")))
        if isinstance(inner, str):
            return UpstreamError(_text(inner))
        return UpstreamError(_text(doc.get("message")) or _text(doc.get("detail")))  # Dynamo
    return UpstreamError(None)


def _text(value: Any) -> str | None:
    # A blank message is no message: " " became the client's whole error message
    # instead of the "rejected with HTTP N" fallback (tests/test_fuzz_core.py).
    if isinstance(value, str) and value.strip():
        return value[:MAX_MESSAGE_CHARS]
    return None
