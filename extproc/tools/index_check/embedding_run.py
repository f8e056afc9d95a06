"""Embedding the sample with one server: batches sent through the caller's
:class:`RequestPool` (which bounds the requests in flight), each answer checked (one
vector per text, finite, one width), the wall time kept for the re-index estimate.

The server is a ``post`` callable (bytes in, status and body out), so the request
budget, the headers and the connection belong to the caller's client. A batch the
server does not embed stops the run with :class:`EmbedError`, which names the
server's answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from extproc.core.embeddings_body import parse_embeddings_body
from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.core.upstream_errors import parse_upstream_error
from extproc.core.vectors import BadVectorsError, FloatMatrix
from extproc.tools.toolkit.corpus import Kind
from extproc.tools.toolkit.request_pool import RequestPool

Post = Callable[[bytes], tuple[int, bytes]]
BATCH_SIZE = 32


class EmbedError(Exception):
    """The server did not embed a batch (its status and message, or why its answer is
    unusable)."""


@dataclass(frozen=True)
class Embedded:
    vectors: FloatMatrix  # one row per text, in the texts' order
    seconds: float  # wall time, first request sent to last answer read
    requests: int

    @property
    def texts_per_second(self) -> float:
        return self.vectors.shape[0] / self.seconds if self.seconds > 0 else float("inf")


def embed_texts(
    post: Post,
    pool: RequestPool,
    model: str,
    texts: Sequence[str],
    kind: Kind,
    *,
    dimensions: int | None = None,
    batch_size: int = BATCH_SIZE,
    progress: Callable[[int], None] = lambda done: None,
    dialect: EmbeddingsDialect | None = None,
) -> Embedded:
    """Every text's vector, with ``input_type: kind`` (and ``dimensions``) as clients
    send them, each answer read as ``dialect``'s clients read it (None: OpenAI's);
    ``progress`` gets the number of texts embedded after each batch."""
    batches = [list(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size)]
    extra: dict[str, Any] = {"input_type": kind}
    if dimensions is not None:
        extra["dimensions"] = dimensions
    done = 0
    lock = threading.Lock()

    def one(batch: list[str]) -> FloatMatrix:
        nonlocal done
        body = orjson.dumps({"model": model, "input": batch, **extra})
        status, answer = post(body)
        if not 200 <= status < 300:
            what = parse_upstream_error(answer).message or "no message"
            raise EmbedError(f"HTTP {status}: {what[:200]}")
        vectors = _vectors(answer, len(batch), dimensions, dialect)
        with lock:
            done += len(batch)
            progress(done)
        return vectors

    started = time.perf_counter()
    rows = pool.send_all(one, batches)
    seconds = time.perf_counter() - started
    widths = {m.shape[1] for m in rows}
    if len(widths) > 1:
        raise EmbedError(f"vectors of several widths: {sorted(widths)}")
    vectors = np.vstack(rows).astype(np.float32, copy=False)
    return Embedded(vectors, seconds, len(batches))


def _vectors(
    answer: bytes, count: int, dimensions: int | None, dialect: EmbeddingsDialect | None
) -> FloatMatrix:
    """A 2xx answer's ``count`` vectors (of ``dimensions``, when given), or EmbedError."""
    if dialect is None or not dialect.own_shape:
        try:
            return parse_embeddings_body(answer, input_count=count, dimensions=dimensions).vectors
        except BadVectorsError as exc:
            raise EmbedError(f"an unusable answer: {exc}") from None
    read = dialect.read_answer(answer)
    if read is None:
        raise EmbedError(f"an unusable answer: not a {dialect.name} answer")
    rows, width = read.vectors.shape
    if rows != count or (dimensions is not None and width != dimensions):
        raise EmbedError(f"an unusable answer: {rows} vectors of {width} for {count} inputs")
    return read.vectors
