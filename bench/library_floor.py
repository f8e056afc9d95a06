"""The library floor: the contract's work done with the libraries alone (case L).

For the benchmark's two requests this does what the shipped server must do to a
message's body, by direct calls to the same compiled libraries (orjson, pybase64,
numpy) and nothing else: no validation, no state machine, no policy, no metrics.
``floor_processor.py --listen-library`` answers with these bodies on the floor's
message pattern, so the shipped Envoy config in front of it (L) costs what any
Python ext_proc server doing this work must cost at least: L's ratio to the naive
gateway bounds what cutting the server's own Python can reach.

- request body: parse it; for the rewrite also drop ``dimensions`` and
  ``input_type``, put the query instruction in front of every input, ask for
  base64, and write it back (the server's request rewrite);
- response body of the rewrite: parse it, decode every base64 vector, cut them to
  the first ``dimensions`` components, re-normalise, and write the float answer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pybase64

# The shape of the Qwen3 policy's query instruction; its exact words do not change the cost.
QUERY_PREFIX = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)
CUT_DIMENSIONS = 256


def request_work(body: bytes, rewrite: bool) -> bytes | None:
    """The request's new body (the rewrite), or None: parsed and passed on unchanged."""
    doc: dict[str, Any] = orjson.loads(body)
    if not rewrite:
        return None
    doc.pop("dimensions", None)
    doc.pop("input_type", None)
    doc["input"] = [QUERY_PREFIX + text for text in doc["input"]]
    doc["encoding_format"] = "base64"
    return orjson.dumps(doc)


def response_work(body: bytes, dimensions: int = CUT_DIMENSIONS) -> bytes:
    """The client's float answer: every vector cut to ``dimensions`` and re-normalised."""
    doc: dict[str, Any] = orjson.loads(body)
    items = doc["data"]
    vectors = np.stack(
        [np.frombuffer(pybase64.b64decode(item["embedding"]), dtype="<f4") for item in items]
    )
    head = np.ascontiguousarray(vectors[:, :dimensions])
    head /= np.sqrt(np.einsum("ij,ij->i", head, head))[:, None]
    for item, row in zip(items, head, strict=True):
        item["embedding"] = row
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
