"""What each rerank upstream kind is asked and how its answers read (pure).

- ``vllm``: vLLM's ``/rerank`` (``--runner pooling``, a cross-encoder). Asked
  ``{model, query, documents, use_activation, truncate_prompt_tokens?}``; answers
  ``{id, model, usage, results: [{index, document: {text}, relevance_score}]}`` best
  first. ``use_activation: false`` gives the raw logit, its default the sigmoid
  (docs/upstreams.md, measured).
- ``dynamo``: Dynamo 1.6's ``/v1/rerank`` (its SGLang backend, cross-encoders only).
  Asked ``{model, query, documents, return_documents}``; answers a bare JSON array
  ``[{score, index, document?}]``. It has no switch for the activation: its scores are
  taken as the sigmoid (the cross-encoder's usual head), turned back into logits where
  a raw score is wanted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import orjson


class BadRerankAnswerError(ValueError):
    """The upstream's 2xx answer is not a rerank answer for this request."""


@dataclass(frozen=True)
class UpstreamScores:
    """One score per document, by the document's position in the request."""

    scores: tuple[float, ...]
    raw: bool  # logits, or their sigmoid
    prompt_tokens: int | None


class RerankUpstream:
    """One rerank upstream kind; the base class is vLLM's shape."""

    name: ClassVar[str] = "vllm"
    path: ClassVar[str] = "/rerank"  # where the gateway sends a rerank request
    can_answer_raw: ClassVar[bool] = True
    cuts_documents: ClassVar[bool] = True  # takes max_tokens_per_doc

    def write_request(
        self,
        model: str,
        query: str,
        documents: Sequence[str],
        *,
        raw: bool,
        truncate_to: int | None,
        max_tokens_per_doc: int | None = None,
    ) -> bytes:
        body: dict[str, Any] = {"model": model, "query": query, "documents": list(documents)}
        self.add_options(body, raw=raw, truncate_to=truncate_to, per_doc=max_tokens_per_doc)
        return orjson.dumps(body)

    def add_options(
        self, body: dict[str, Any], *, raw: bool, truncate_to: int | None, per_doc: int | None
    ) -> None:
        if raw:
            body["use_activation"] = False
        if truncate_to is not None:
            body["truncate_prompt_tokens"] = truncate_to
        if per_doc is not None:
            # Each document's token ids cut before the pair is framed (measured).
            body["max_tokens_per_doc"] = per_doc

    def read_scores(self, body: bytes, count: int, *, raw: bool) -> UpstreamScores:
        doc = _json(body)
        results = doc.get("results") if isinstance(doc, dict) else None
        if not isinstance(results, list):
            raise BadRerankAnswerError("it has no 'results' array")
        pairs = [(_index(r), _score(r, "relevance_score")) for r in results]
        usage = doc.get("usage")
        tokens = None
        if isinstance(usage, dict):
            found = usage.get("prompt_tokens", usage.get("total_tokens"))
            tokens = found if type(found) is int else None
        return UpstreamScores(_in_order(pairs, count), raw, tokens)


class DynamoRerank(RerankUpstream):
    name: ClassVar[str] = "dynamo"
    path: ClassVar[str] = "/v1/rerank"
    can_answer_raw: ClassVar[bool] = False
    cuts_documents: ClassVar[bool] = False

    def add_options(
        self, body: dict[str, Any], *, raw: bool, truncate_to: int | None, per_doc: int | None
    ) -> None:
        # No activation switch and no cut: its scores are read as the sigmoid.
        body["return_documents"] = False

    def read_scores(self, body: bytes, count: int, *, raw: bool) -> UpstreamScores:
        doc = _json(body)
        if not isinstance(doc, list):
            raise BadRerankAnswerError("it is not an array of results")
        pairs = [(_index(r), _score(r, "score")) for r in doc]
        return UpstreamScores(_in_order(pairs, count), False, None)


RERANK_UPSTREAMS: Final = {u.name: u for u in (RerankUpstream(), DynamoRerank())}


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def logit(p: float) -> float:
    """The logit whose sigmoid is ``p`` (float64; infinite at 0 and 1)."""
    if p <= 0.0:
        return -math.inf
    if p >= 1.0:
        return math.inf
    return math.log(p / (1.0 - p))


def _json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadRerankAnswerError("the body is not JSON") from None


def _index(item: Any) -> int:
    index = item.get("index") if isinstance(item, dict) else None
    if type(index) is not int:
        raise BadRerankAnswerError("a result has no integer 'index'")
    return index


def _score(item: dict[str, Any], key: str) -> float:
    value = item.get(key)
    if (type(value) is not int and type(value) is not float) or not math.isfinite(value):
        raise BadRerankAnswerError(f"a result has no finite '{key}'")
    return float(value)


def _in_order(pairs: list[tuple[int, float]], count: int) -> tuple[float, ...]:
    """Scores by document position: every index 0..count-1 exactly once."""
    if sorted(i for i, _ in pairs) != list(range(count)):
        raise BadRerankAnswerError(f"its results are not documents 0 to {count - 1}, each once")
    scores = [0.0] * count
    for index, score in pairs:
        scores[index] = score
    return tuple(scores)
