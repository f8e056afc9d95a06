"""Reading an embeddings success body: the one parser for this wire format.

The OpenAI shape ``{"data": [{"index", "embedding"}], "usage": {"prompt_tokens"}}``,
each embedding a JSON float array or a base64 string of little-endian float32.
The upstream may list items out of order: ``index`` says which input each row is
and must name every row exactly once, or vectors would be paired with the wrong
inputs. Every vector must be finite float32, and all must have the same width.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import pybase64

from extproc.core.vectors import BadVectorsError, FloatMatrix, decode_rows

BodyEncoding = Literal["float", "base64", "mixed"]


@dataclass(frozen=True)
class EmbeddingsBody:
    """A checked success body. ``doc`` and ``items`` are the parsed JSON itself
    (``items`` are the objects of ``doc['data']``), so a rewrite can edit them in
    place and re-encode ``doc``."""

    doc: dict[str, Any]
    items: list[dict[str, Any]]  # in 'index' order
    vectors: FloatMatrix  # float32, shape (rows, dims), rows in 'index' order
    encoding: BodyEncoding
    prompt_tokens: int | None


def parse_embeddings_body(
    body: bytes, *, input_count: int | None = None, dimensions: int | None = None
) -> EmbeddingsBody:
    """The checked body; :class:`BadVectorsError` names the first problem.

    ``input_count`` / ``dimensions`` are what the answer must have; ``None`` takes
    the row count / the first row's width as given.
    """
    try:
        doc: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadVectorsError("the body is not JSON") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise BadVectorsError("it has no 'data' array")
    if input_count is not None and len(data) != input_count:
        raise BadVectorsError(f"{len(data)} embeddings for {input_count} inputs")
    if not all(isinstance(item, dict) for item in data):
        raise BadVectorsError("an item of 'data' is not an object")
    indices = [item.get("index") for item in data]
    in_order = list(range(len(data)))
    if not all(type(i) is int for i in indices):
        raise BadVectorsError(f"its 'index' values are not 0 to {len(data) - 1}, each once")
    items: list[dict[str, Any]] = data  # the usual case: already in 'index' order
    if indices != in_order:
        if sorted(indices) != in_order:
            raise BadVectorsError(f"its 'index' values are not 0 to {len(data) - 1}, each once")
        items = sorted(data, key=lambda item: int(item["index"]))
    embeddings = [item.get("embedding") for item in items]
    width = dimensions if dimensions is not None else _first_width(embeddings)
    vectors = decode_rows(embeddings, width)
    return EmbeddingsBody(
        doc=doc,
        items=items,
        vectors=vectors,
        encoding=_encoding(embeddings),
        prompt_tokens=_prompt_tokens(doc),
    )


def _first_width(embeddings: list[Any]) -> int:
    """The width every row must share when the caller does not know it: the first
    row's (0 for an answer with no rows)."""
    if not embeddings:
        return 0
    first = embeddings[0]
    if isinstance(first, list):
        width = len(first)
    elif isinstance(first, str):
        try:
            size = len(pybase64.b64decode(first, validate=True))
        except (binascii.Error, ValueError, TypeError):
            raise BadVectorsError("embedding 0 is not valid base64") from None
        if size % 4:
            raise BadVectorsError(f"embedding 0 has {size} bytes, not whole float32 values")
        width = size // 4
    else:
        raise BadVectorsError("embedding 0 is neither a float array nor base64")
    if width == 0:
        raise BadVectorsError("embedding 0 is empty")
    return width


def _encoding(embeddings: list[Any]) -> BodyEncoding:
    strings = sum(isinstance(e, str) for e in embeddings)
    if strings == 0:
        return "float"
    return "base64" if strings == len(embeddings) else "mixed"


def _prompt_tokens(doc: dict[str, Any]) -> int | None:
    usage = doc.get("usage")
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return tokens if type(tokens) is int else None
