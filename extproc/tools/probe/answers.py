"""Reading an embeddings server's answer, whatever its dialect (pure functions).

Success bodies are OpenAI-shaped: ``{"data": [{"index", "embedding"}], "usage":
{"prompt_tokens"}}`` where each embedding is a float array or a base64 string of
little-endian float32. Error bodies come in three shapes that are all read here:
OpenAI/vLLM ``{"error": {"message"}}``, Dynamo's flat ``{"message"}``, FastAPI's
``{"detail": str | [{"msg"}]}``; anything else is shown as text.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import orjson

from extproc.tools.probe.stats import Vector

EncodingKind = Literal["array", "base64 string", "mixed"]
ERROR_TEXT_LIMIT = 70


class AnswerError(ValueError):
    """A 2xx body that is not a usable embeddings answer."""


@dataclass(frozen=True)
class Embeddings:
    """A decoded success answer: vectors in ``index`` order, in float64."""

    vectors: tuple[Vector, ...]
    kind: EncodingKind
    prompt_tokens: int | None

    @property
    def dimensions(self) -> tuple[int, ...]:
        """The distinct vector lengths, sorted (one value for a sane answer)."""
        return tuple(sorted({int(v.shape[0]) for v in self.vectors}))


def _decode_one(raw: Any, position: int) -> tuple[Vector, EncodingKind]:
    if isinstance(raw, str):
        try:
            packed = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise AnswerError(f"embedding {position} is a string but not base64") from None
        if len(packed) % 4:
            raise AnswerError(f"embedding {position}: {len(packed)} bytes is not float32s")
        return np.frombuffer(packed, dtype="<f4").astype(np.float64), "base64 string"
    if isinstance(raw, list):
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in raw):
            raise AnswerError(f"embedding {position} holds non-numbers")
        return np.asarray(raw, dtype=np.float64), "array"
    raise AnswerError(f"embedding {position} is neither an array nor a base64 string")


def parse_embeddings(body: bytes) -> Embeddings:
    """Decode a 2xx embeddings body; raises AnswerError when it is not one."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise AnswerError("body is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise AnswerError("no 'data' list")
    items: list[tuple[int, Any]] = []
    for position, item in enumerate(doc["data"]):
        if not isinstance(item, dict) or "embedding" not in item:
            raise AnswerError(f"data[{position}] has no 'embedding'")
        index = item.get("index", position)
        if not isinstance(index, int) or isinstance(index, bool):
            raise AnswerError(f"data[{position}].index is not an integer")
        items.append((index, item["embedding"]))
    items.sort(key=lambda pair: pair[0])
    if [index for index, _ in items] != list(range(len(items))):
        raise AnswerError("indices are not 0..n-1")
    vectors: list[Vector] = []
    kinds: set[EncodingKind] = set()
    for position, (_, raw) in enumerate(items):
        vector, one_kind = _decode_one(raw, position)
        if not np.isfinite(vector).all():
            raise AnswerError(f"embedding {position} has NaN or infinite values")
        vectors.append(vector)
        kinds.add(one_kind)
    kind: EncodingKind = kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "array")
    usage = doc.get("usage")
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    prompt_tokens = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None
    return Embeddings(vectors=tuple(vectors), kind=kind, prompt_tokens=prompt_tokens)


def _shorten(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def error_text(body: bytes, limit: int = ERROR_TEXT_LIMIT) -> str:
    """A one-line summary of an error body (message only, shortened)."""
    if not body.strip():
        return "(empty body)"
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _shorten(body.decode("utf-8", errors="replace"), limit)
    message: Any = None
    if isinstance(doc, dict):
        error = doc.get("error")
        if isinstance(error, dict):
            message = error.get("message")
        elif isinstance(error, str):
            message = error
        if message is None and "message" in doc:
            message = doc["message"]
        if message is None and "detail" in doc:
            detail = doc["detail"]
            if isinstance(detail, list) and detail and isinstance(detail[0], dict):
                first = detail[0]
                loc = first.get("loc")
                where = ".".join(str(x) for x in loc) if isinstance(loc, list) else ""
                message = f"{where}: {first.get('msg', '')}" if where else first.get("msg")
            else:
                message = detail
    if message is None:
        message = body.decode("utf-8", errors="replace")
    return _shorten(str(message), limit)


def status_class(status: int) -> str:
    """'2xx'..'5xx', or 'no answer' for 0 (connection failure, timeout)."""
    if status <= 0:
        return "no answer"
    return f"{status // 100}xx"
