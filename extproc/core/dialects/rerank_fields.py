"""Reading the fields rerank dialects share (pure): the body as a JSON object, the
query, the documents (strings, or Cohere's and Jina's ``{"text"}`` objects), and
optional typed fields; and reading an answer's results as a client does. Every
client mistake is an ApiError here, in the words every dialect gives it. And
:class:`DocumentsRerank`, the base of the ``{model, query, documents}`` dialects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import orjson

from extproc.core.api_errors import InvalidFieldError, MalformedBodyError, TooManyInputsError
from extproc.core.dialects.json_fields import optional, positive
from extproc.core.tasks.rerank import Ranked, Ranking, RerankDialect, RerankRequest


def json_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise MalformedBodyError("The request body is empty; send a JSON object.")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedBodyError(
            f"The request body is not valid JSON: {exc}.", position=exc.pos
        ) from None
    if not isinstance(doc, dict):
        raise MalformedBodyError("The request body must be a JSON object.")
    return doc


def query(doc: dict[str, Any]) -> str:
    value = doc.get("query")
    if value is None:
        raise InvalidFieldError(
            "Missing required parameter: 'query'.", param="query", reason="missing"
        )
    if not isinstance(value, str) or not value.strip():
        raise InvalidFieldError(
            "'query' must be a non-empty string.", param="query", reason="empty"
        )
    return value


def documents(
    doc: dict[str, Any], field: str, max_documents: int, *, objects: bool
) -> tuple[str, ...]:
    raw = doc.get(field)
    if raw is None:
        raise InvalidFieldError(
            f"Missing required parameter: '{field}'.", param=field, reason="missing"
        )
    if not isinstance(raw, list) or not raw:
        raise InvalidFieldError(
            f"'{field}' must be a non-empty array.", param=field, reason="empty"
        )
    if len(raw) > max_documents:
        raise TooManyInputsError(
            f"'{field}' has {len(raw)} items; at most {max_documents} are allowed per request.",
            param=field,
        )
    texts = []
    for i, entry in enumerate(raw):
        item = entry.get("text") if objects and isinstance(entry, dict) else entry
        if not isinstance(item, str):
            what = "a string or an object with a 'text' string" if objects else "a string"
            raise InvalidFieldError(f"{field}[{i}] must be {what}.", param=field)
        texts.append(item)
    return tuple(texts)


def ranking(items: Any, score_key: str) -> Ranking | None:
    """An answer's results (``[{index, <score_key>, text or document?}]``) as a client
    reads them; None when they are not such a list."""
    if not isinstance(items, list):
        return None
    scores: dict[int, float] = {}
    order: list[int] = []
    carried = False
    for item in items:
        if not isinstance(item, dict) or type(item.get("index")) is not int:
            return None
        score = item.get(score_key)
        if not isinstance(score, int | float) or isinstance(score, bool):
            return None
        scores[item["index"]] = float(score)
        order.append(item["index"])
        carried = carried or "text" in item or "document" in item
    return Ranking(scores, tuple(order), carried)


def documents_request(
    body: bytes, max_documents: int, *, model_required: bool, objects: bool, per_doc: bool
) -> RerankRequest:
    """A ``{model, query, documents, top_n, ...}`` request (Cohere's and Jina's):
    ``objects``: a document may be a ``{"text"}`` object; ``per_doc``: Cohere v2's
    ``max_tokens_per_doc`` (it has no ``return_documents``)."""
    doc = json_object(body)
    model = optional(doc, "model", str)
    if model_required and model is None:
        raise InvalidFieldError(
            "Missing required parameter: 'model'.", param="model", reason="missing"
        )
    return RerankRequest(
        model=model,
        query=query(doc),
        documents=documents(doc, "documents", max_documents, objects=objects),
        top_n=positive(doc, "top_n"),
        return_documents=None if per_doc else optional(doc, "return_documents", bool),
        max_tokens_per_doc=positive(doc, "max_tokens_per_doc") if per_doc else None,
    )


def results(ranked: Sequence[Ranked]) -> list[dict[str, Any]]:
    """``[{index, relevance_score, document?: {text}}]``, best first."""
    return [
        {"index": r.index, "relevance_score": r.score}
        if r.text is None
        else {"index": r.index, "relevance_score": r.score, "document": {"text": r.text}}
        for r in ranked
    ]


def documents_request_body(
    model: str, query_text: str, texts: Sequence[str], options: Mapping[str, Any]
) -> dict[str, Any]:
    """A ``{query, documents, model}`` request as Cohere's and Jina's clients write it."""
    return {"query": query_text, "documents": list(texts), **options, "model": model}


class DocumentsRerank(RerankDialect):
    """A ``{model, query, documents, top_n, ...}`` dialect (Cohere's, Jina's): the
    class attributes say which of the fields it reads (as :func:`documents_request`)."""

    model_required: ClassVar[bool] = True
    objects: ClassVar[bool] = True
    per_doc: ClassVar[bool] = False
    client_options: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "top_n 2": {"top_n": 2},
        "documents back": {"return_documents": True},
    }

    def read_request(self, body: bytes, max_documents: int) -> RerankRequest:
        return documents_request(
            body,
            max_documents,
            model_required=self.model_required,
            objects=self.objects,
            per_doc=self.per_doc,
        )

    def write_request(
        self, model: str, query: str, documents: Sequence[str], **options: Any
    ) -> dict[str, Any]:
        return documents_request_body(model, query, documents, options)
