"""One side's answer to one mirrored request, reduced to what the comparison needs.

A :class:`Half` is built from what the tap saw on one listener: the client's
request body (the same bytes on both listeners: the mirror copies them), the
HTTP status and response body the client (or the mirror) got, and the time in
between. It keeps the answer as the parity package reads it (status, float32
vectors, ``usage.prompt_tokens``), the request's input kind and count and a digest
of the request; never the raw bodies, and the input texts only when asked to
(``--keep-text``).

Input kind (per request, so per input): a rerank request when the policy routes its
path (as Envoy's routes compare it, :func:`extproc.core.request_headers.route_of`) to
a rerank dialect, or when it is a rerank path of a mesh (any dialect's) the policy
does not route; else a query when ``input_type`` is in the query vocabulary
(:data:`extproc.core.prompts.QUERY_TYPES`) or an ``instruction`` is present, else a
document. The inputs are the core's reading of ``input``
(:func:`extproc.core.request_json.input_items`). At a path the policy serves in
another embeddings dialect, both are read at that dialect's field names (``texts``,
``prompt_name``) and the answer as its clients read it. A rerank half keeps its reply as
its route's dialect reads it (order, scores, documents, or the error body's shape;
a mesh path the policy does not route, in whichever dialect answers): the pair is
compared whole, as a client sees it.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Any, Final

import orjson

from extproc.core.prompts import QUERY_TYPES
from extproc.core.request_headers import route_of
from extproc.core.request_json import input_items
from extproc.core.routes import Routes
from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.core.tasks.rerank import RerankDialect
from extproc.tools.parity import Answer
from extproc.tools.parity.rerank_comparison import RerankReply

TEXT_CHARS: Final = 200  # --keep-text keeps at most this much of each input
_OVERHEAD_BYTES: Final = 512  # a Half's size beyond its vectors and texts, roughly
_SCORE_BYTES: Final = 200  # a rerank result kept: its index and score in two dict slots


class Role(enum.Enum):
    """Which side of the comparison a half is (the tap's ``x-shadow-role``)."""

    BASELINE = "baseline"  # what clients rely on today
    CANDIDATE = "candidate"  # the new backend, through the contract gateway
    NOISE = "noise"  # a second baseline replica: baseline-vs-baseline noise


class InputKind(enum.Enum):
    DOCUMENT = "document"
    QUERY = "query"
    RERANK = "rerank"  # a rerank request: its answer is compared whole


VECTOR_KINDS: Final = (InputKind.DOCUMENT, InputKind.QUERY)


@dataclass(frozen=True)
class RawHalf:
    """What a tap stream collected for one HTTP exchange."""

    role: Role
    request_id: str
    request_body: bytes
    status: int  # 0: no response headers arrived
    response_body: bytes
    latency_s: float
    upstream_s: float | None = None  # Envoy's x-envoy-upstream-service-time
    path: str = ""  # the request's :path as the tap saw it ("" when not sent)


@dataclass(frozen=True)
class Half:
    request_id: str
    role: Role
    answer: Answer  # status, and the vectors and tokens of a usable 2xx body
    latency_s: float
    kind: InputKind
    inputs: int | None  # None: the request did not parse
    request_digest: int
    texts: tuple[str, ...] = ()
    upstream_s: float | None = None  # Envoy's x-envoy-upstream-service-time
    rerank: RerankReply | None = None  # a rerank request's reply

    @property
    def nbytes(self) -> int:
        """Roughly what keeping this half costs, for the store's memory bound."""
        vectors = 0 if self.answer.vectors is None else int(self.answer.vectors.nbytes)
        answer = self.rerank.answer if self.rerank is not None else None
        scores = _SCORE_BYTES * (answer.count if answer is not None else 0)
        return vectors + scores + sum(len(t) for t in self.texts) + _OVERHEAD_BYTES


def digest(body: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(body, digest_size=8).digest(), "big")


def rerank_route(routes: Routes, path: str) -> tuple[bool, RerankDialect | None]:
    """Whether a tapped ``path`` is a rerank request, and the dialect its answers are
    read in: its endpoint's; None (whichever answers) for a mesh's rerank path the
    policy does not route."""
    route = route_of(path)
    endpoint = routes.at(route)
    if endpoint is None:
        return routes.left_alone(route), None
    dialect = endpoint.dialect
    return (True, dialect) if isinstance(dialect, RerankDialect) else (False, None)


def embeddings_dialect_at(routes: Routes, path: str) -> EmbeddingsDialect | None:
    """The embeddings dialect of its own shape the policy serves at a tapped ``path``
    (None: OpenAI's shape, Jina's included, or a path it does not route)."""
    endpoint = routes.at(route_of(path))
    dialect = None if endpoint is None else endpoint.dialect
    if isinstance(dialect, EmbeddingsDialect) and dialect.own_shape:
        return dialect
    return None


def extract_half(raw: RawHalf, routes: Routes, *, keep_text: bool = False) -> Half:
    """Pure: the comparable essence of one side's exchange, its path looked up in
    ``routes`` (the policy's route table): a rerank answer, or vectors as the path's
    dialect reads its requests and answers."""
    rerank, dialect = rerank_route(routes, raw.path)
    if rerank:
        return Half(
            request_id=raw.request_id,
            role=raw.role,
            answer=Answer(raw.status),
            latency_s=raw.latency_s,
            kind=InputKind.RERANK,
            inputs=None,
            request_digest=digest(raw.request_body),
            upstream_s=raw.upstream_s,
            rerank=RerankReply.read(raw.status, raw.response_body, dialect),
        )
    spoken = embeddings_dialect_at(routes, raw.path)
    kind, inputs, texts = _read_request(raw.request_body, spoken)
    return Half(
        request_id=raw.request_id,
        role=raw.role,
        answer=Answer.read(raw.status, raw.response_body, spoken),
        latency_s=raw.latency_s,
        kind=kind,
        inputs=inputs,
        request_digest=digest(raw.request_body),
        texts=texts if keep_text else (),
        upstream_s=raw.upstream_s,
    )


def _read_request(
    body: bytes, dialect: EmbeddingsDialect | None
) -> tuple[InputKind, int | None, tuple[str, ...]]:
    """The input kind, count and texts, at the dialect's field names (``texts``,
    ``inputs``, ``prompt``; its role field)."""
    names = {} if dialect is None else dialect.field_names
    role_field = (
        "input_type" if dialect is None or dialect.role_field is None else (dialect.role_field)
    )
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return InputKind.DOCUMENT, None, ()
    if not isinstance(doc, dict):
        return InputKind.DOCUMENT, None, ()
    input_type = doc.get(role_field)
    is_query = (isinstance(input_type, str) and input_type in QUERY_TYPES) or (
        dialect is None and doc.get("instruction") is not None
    )
    kind = InputKind.QUERY if is_query else InputKind.DOCUMENT
    items = input_items(doc.get(names.get("input", "input")))
    if items is None:
        return kind, None, ()
    return kind, len(items), tuple(_describe(item) for item in items)


def _describe(item: Any) -> str:
    if isinstance(item, str):
        return item[:TEXT_CHARS]
    if isinstance(item, list):
        return f"<{len(item)} token ids>"
    return f"<{type(item).__name__}>"
