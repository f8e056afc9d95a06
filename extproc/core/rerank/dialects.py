"""The rerank dialects legacy clients speak: each one's request read into one
:class:`RerankRequest`, and the answer written back in its shape (pure).

- TEI: ``{query, texts, raw_scores, return_text, truncate, truncation_direction}``
  answered ``[{index, score, text?}]``;
- Cohere v1: ``{model?, query, documents: [str or {text}], top_n, return_documents}``
  answered ``{id, results: [{index, relevance_score, document?: {text}}], meta}``;
- Cohere v2: ``{model, query, documents: [str], top_n, max_tokens_per_doc}`` answered
  ``{id, results: [{index, relevance_score}], meta}``;
- Jina: ``{model, query, documents: [str or {text}], top_n, return_documents}``
  answered ``{model, usage, results: [{index, relevance_score, document?: {text}}]}``.

Every client mistake is an :class:`ApiError` here (FastAPI-like servers answered such
requests 422; the status a client sees is the policy's error dialect's).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from extproc.core.error_envelope import invalid_request


class Dialect(enum.Enum):
    TEI = "tei"
    COHERE_V1 = "cohere_v1"
    COHERE_V2 = "cohere_v2"
    JINA = "jina"


DEFAULT_PATHS: Final = {
    Dialect.TEI: "/rerank",
    Dialect.COHERE_V1: "/v1/rerank",
    Dialect.COHERE_V2: "/v2/rerank",
    Dialect.JINA: "/v1/rerank",
}
# The rerank paths a mesh's filter lets through to the server (envoy/istio): a policy
# that covers one of them gets its requests; the others pass untouched.
MESH_RERANK_PATHS: Final = frozenset(DEFAULT_PATHS.values())
# Whether answers carry the documents when the client does not say.
DEFAULT_RETURN_DOCUMENTS: Final = {
    Dialect.TEI: False,
    Dialect.COHERE_V1: False,
    Dialect.COHERE_V2: False,
    Dialect.JINA: True,
}


@dataclass(frozen=True)
class RerankRequest:
    """A rerank request, in no dialect's terms. ``None``: the client did not say."""

    model: str | None
    query: str
    documents: tuple[str, ...]
    top_n: int | None
    return_documents: bool | None
    raw_scores: bool | None  # TEI only
    truncate: bool | None  # TEI only
    truncate_left: bool  # TEI's truncation_direction "Left"
    max_tokens_per_doc: int | None = None  # Cohere v2: each document cut to this many


@dataclass(frozen=True)
class Ranked:
    """One document's place in the answer."""

    index: int
    score: float
    text: str | None  # when the answer carries the documents


def read_request(dialect: Dialect, body: bytes, max_documents: int) -> RerankRequest:
    """The request; ApiError for a client mistake."""
    doc = _object(body)
    if dialect is Dialect.TEI:
        return _tei(doc, max_documents)
    model = _optional(doc, "model", str)
    if dialect in (Dialect.COHERE_V2, Dialect.JINA) and model is None:
        raise invalid_request("Missing required parameter: 'model'.", param="model")
    query = _query(doc)
    documents = _documents(
        doc, "documents", max_documents, objects=dialect is not Dialect.COHERE_V2
    )
    top_n = _optional(doc, "top_n", int)
    if top_n is not None and top_n < 1:
        raise invalid_request("'top_n' must be at least 1.", param="top_n")
    returning = per_doc = None
    if dialect is Dialect.COHERE_V2:
        per_doc = _optional(doc, "max_tokens_per_doc", int)
        if per_doc is not None and per_doc < 1:
            raise invalid_request(
                "'max_tokens_per_doc' must be at least 1.", param="max_tokens_per_doc"
            )
    else:
        returning = _optional(doc, "return_documents", bool)
    return RerankRequest(model, query, documents, top_n, returning, None, None, False, per_doc)


def _tei(doc: dict[str, Any], max_documents: int) -> RerankRequest:
    query = _query(doc)
    texts = _documents(doc, "texts", max_documents, objects=False)
    direction = _optional(doc, "truncation_direction", str)
    if direction not in (None, "Left", "Right", "left", "right"):
        raise invalid_request(
            "'truncation_direction' must be 'Left' or 'Right'.", param="truncation_direction"
        )
    return RerankRequest(
        model=None,
        query=query,
        documents=texts,
        top_n=None,
        return_documents=_optional(doc, "return_text", bool),
        raw_scores=_optional(doc, "raw_scores", bool),
        truncate=_optional(doc, "truncate", bool),
        truncate_left=direction in ("Left", "left"),
    )


def write_answer(
    dialect: Dialect, ranked: Sequence[Ranked], *, model: str, prompt_tokens: int | None
) -> bytes:
    """The client's answer, ``ranked`` best first (already cut to top_n)."""
    if dialect is Dialect.TEI:
        return orjson.dumps(
            [
                {
                    "index": r.index,
                    "score": r.score,
                    **({"text": r.text} if r.text is not None else {}),
                }
                for r in ranked
            ]
        )
    results = [
        {
            "index": r.index,
            "relevance_score": r.score,
            **({"document": {"text": r.text}} if r.text is not None else {}),
        }
        for r in ranked
    ]
    if dialect is Dialect.JINA:
        usage = {"total_tokens": prompt_tokens} if prompt_tokens is not None else {}
        return orjson.dumps({"model": model, "usage": usage, "results": results})
    version = "1" if dialect is Dialect.COHERE_V1 else "2"
    return orjson.dumps(
        {"id": str(uuid.uuid4()), "results": results, "meta": {"api_version": {"version": version}}}
    )


def _object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise invalid_request("The request body is empty; send a JSON object.", code="invalid_json")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise invalid_request(
            f"The request body is not valid JSON: {exc}.", code="invalid_json"
        ) from None
    if not isinstance(doc, dict):
        raise invalid_request("The request body must be a JSON object.", code="invalid_json")
    return doc


def _query(doc: dict[str, Any]) -> str:
    query = doc.get("query")
    if query is None:
        raise invalid_request("Missing required parameter: 'query'.", param="query")
    if not isinstance(query, str) or not query.strip():
        raise invalid_request("'query' must be a non-empty string.", param="query")
    return query


def _documents(
    doc: dict[str, Any], field: str, max_documents: int, *, objects: bool
) -> tuple[str, ...]:
    raw = doc.get(field)
    if raw is None:
        raise invalid_request(f"Missing required parameter: '{field}'.", param=field)
    if not isinstance(raw, list) or not raw:
        raise invalid_request(f"'{field}' must be a non-empty array.", param=field)
    if len(raw) > max_documents:
        raise invalid_request(
            f"'{field}' has {len(raw)} items; at most {max_documents} are allowed per request.",
            param=field,
        )
    texts = []
    for i, entry in enumerate(raw):
        item = entry.get("text") if objects and isinstance(entry, dict) else entry
        if not isinstance(item, str):
            what = "a string or an object with a 'text' string" if objects else "a string"
            raise invalid_request(f"{field}[{i}] must be {what}.", param=field)
        texts.append(item)
    return tuple(texts)


def _optional(doc: dict[str, Any], field: str, kind: type) -> Any:
    value = doc.get(field)
    if value is None:
        return None
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise invalid_request(f"'{field}' must be an integer.", param=field)
    if not isinstance(value, kind):
        name = {str: "a string", bool: "a boolean", int: "an integer"}[kind]
        raise invalid_request(f"'{field}' must be {name}.", param=field)
    return value
