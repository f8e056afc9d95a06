"""The base class of the upstream adapters, and what an upstream can do itself.

An adapter holds everything that differs between upstream kinds, for every task
and in both directions: what the upstream is asked (for embeddings: the encoding
the gateway asks for when it must read the vectors, and how a request - native
capabilities included - is written; for reranking: its path, and whether it can
give raw logits and cut documents), how its answers are read (success and error
bodies) and what its errors become for the client, plus which parts of the
contract the upstream can apply itself. The base class speaks vLLM's shapes
(OpenAI's for embeddings, vLLM's ``/rerank``); a kind overrides what differs. It
imports nothing from the policy or the plans, so both can name adapters.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import orjson

from extproc.core.api_errors import UPSTREAM_CODE, ApiError, ServerError, type_for_status
from extproc.core.embeddings_body import EmbeddingsBody, parse_embeddings_body
from extproc.core.upstream_errors import UpstreamError, parse_upstream_error

VectorsEncoding = Literal["float", "base64"]


@dataclass(frozen=True)
class Capabilities:
    """Parts of the contract an upstream applies itself, so the gateway need not."""

    # Matryoshka `dimensions`: the upstream answers vectors cut to that size and
    # re-normalised. Depends on how the model was started, so a policy declares it.
    dimensions: bool = False
    # vLLM's `truncate_prompt_tokens`: the upstream keeps that many tokens of each input.
    truncate_prompt_tokens: bool = False


class BadRerankAnswerError(ValueError):
    """The upstream's 2xx answer is not a rerank answer for this request."""


@dataclass(frozen=True)
class UpstreamScores:
    """One score per document, by the document's position in the request."""

    scores: tuple[float, ...]
    raw: bool  # logits, or their sigmoid
    prompt_tokens: int | None


@dataclass(frozen=True)
class UpstreamAsk:
    """What the gateway asks the upstream for, in no kind's terms: decided from the
    client's request and the model's policy, written into the body by the adapter."""

    model: str  # the upstream's name for the model
    # The input the upstream gets (token ids after truncation, prompted texts, ids the
    # client spelled otherwise), or None: the client's, as sent.
    input: list[str] | list[int] | list[list[int]] | None
    encoding: VectorsEncoding  # how the answer's vectors must be encoded
    dimensions: int | None = None  # the Matryoshka size the upstream cuts to itself
    truncate_prompt_tokens: int | None = None  # the client's (valid) value, passed on
    raw: bool = False  # the vectors as pooled, before the model's normalisation


@dataclass(frozen=True)
class RerankAsk:
    """What the gateway asks an upstream reranker for, whatever its dialect."""

    model: str
    query: str
    documents: Sequence[str]
    truncate_to: int | None = None  # each pair cut to this many tokens by the upstream
    max_tokens_per_doc: int | None = None  # each document cut before the pair is framed


class UpstreamAdapter:
    """One upstream kind (a policy's ``upstream.kind``). An adapter module subclasses
    this and sets the class attributes; the methods write and read OpenAI's shapes,
    and a kind overrides those where its own differ."""

    name: ClassVar[str]  # the kind's name in policy files and in the response plan
    summary: ClassVar[str]  # one line for people: what this adapter talks to
    # what every deployment does itself (a policy may declare more)
    defaults: ClassVar[Capabilities]
    # ``encoding_format`` the gateway asks for when it rewrites the vectors (base64
    # wherever the upstream writes it: decoding it beats parsing float JSON).
    vectors_encoding: ClassVar[VectorsEncoding]
    # Whether it answers the vectors as pooled, before the model normalises them
    # (vLLM's `use_activation: false`, measured).
    raw_vectors: ClassVar[bool] = True
    # Reranking: where the gateway sends a rerank request; whether the upstream can
    # answer raw logits (else its scores are read as their sigmoid) and cut each
    # document to a number of tokens itself (`max_tokens_per_doc`).
    rerank_path: ClassVar[str] = "/rerank"
    rerank_answers_raw: ClassVar[bool] = True
    cuts_documents: ClassVar[bool] = True

    def write_request(
        self, ask: UpstreamAsk, sent: Mapping[str, Any], *, force: bool
    ) -> bytes | None:
        """The upstream's body for ``ask``, or None when the client's body already asks
        exactly that and may be forwarded byte for byte.

        ``sent``: the client's top-level fields that may reach the upstream (none null,
        none the gateway consumes), as parsed; ``force``: the client's body holds more
        than ``sent`` (or a byte order mark), so it is written anew in any case. Fields
        the gateway does not interpret go upstream as sent. OpenAI's shape: ``dimensions``
        only when the upstream cuts to it, integers as JSON integers whatever the
        client's spelling, ``encoding_format`` left out for float (every upstream's
        default)."""
        if not force and _asks(sent, ask):
            return None
        fields = dict(sent)
        fields["model"] = ask.model
        if ask.input is not None:
            fields["input"] = ask.input
        if ask.dimensions is None:
            fields.pop("dimensions", None)
        else:
            fields["dimensions"] = ask.dimensions
        if ask.truncate_prompt_tokens is not None:
            fields["truncate_prompt_tokens"] = ask.truncate_prompt_tokens
        if ask.encoding == "float":
            fields.pop("encoding_format", None)
        else:
            fields["encoding_format"] = ask.encoding
        if ask.raw:
            fields["use_activation"] = False
        return orjson.dumps(fields)

    def parse_success(self, body: bytes, *, input_count: int, dimensions: int) -> EmbeddingsBody:
        """A 2xx body checked against what was asked; BadVectorsError otherwise."""
        return parse_embeddings_body(body, input_count=input_count, dimensions=dimensions)

    def parse_error(self, status: int, body: bytes) -> UpstreamError:
        """What a non-2xx answer says, in words a client or an operator can use."""
        return parse_upstream_error(body)

    def client_error(self, status: int, body: bytes, model: str) -> ApiError:
        """What the client gets for this upstream's non-2xx answer to a request for
        ``model`` (which the gateway serves, so a 404 means the upstream lost it)."""
        return client_error(status, self.parse_error(status, body), model)

    # -- reranking -------------------------------------------------------------------

    def write_rerank(self, ask: RerankAsk) -> bytes:
        """vLLM's ``/rerank`` body: raw logits asked for wherever the upstream gives
        them (``use_activation: false``), so the gateway picks the client's scale;
        a pair cut to ``truncate_to`` tokens by the upstream's own pair truncation;
        each document's token ids cut to ``max_tokens_per_doc`` before the pair is
        framed (measured, docs/upstreams.md)."""
        body: dict[str, Any] = {
            "model": ask.model,
            "query": ask.query,
            "documents": list(ask.documents),
            "use_activation": False,
        }
        if ask.truncate_to is not None:
            body["truncate_prompt_tokens"] = ask.truncate_to
        if ask.max_tokens_per_doc is not None:
            body["max_tokens_per_doc"] = ask.max_tokens_per_doc
        return orjson.dumps(body)

    def read_scores(self, body: bytes, count: int) -> UpstreamScores:
        """vLLM's answer ``{id, model, usage, results: [{index, document,
        relevance_score}]}``, every document once; BadRerankAnswerError otherwise."""
        doc = read_json(body)
        results = doc.get("results") if isinstance(doc, dict) else None
        if not isinstance(results, list):
            raise BadRerankAnswerError("it has no 'results' array")
        scores = scores_in_order(results, "relevance_score", count)
        usage = doc.get("usage")
        tokens = None
        if isinstance(usage, dict):
            found = usage.get("prompt_tokens", usage.get("total_tokens"))
            tokens = found if type(found) is int else None
        return UpstreamScores(scores, self.rerank_answers_raw, tokens)


def client_error(status: int, upstream: UpstreamError, model: str | None) -> ApiError:
    """An upstream's non-2xx answer as the client's error (``model``: the one asked
    for, None when the gateway never matched the request to one). Its 4xx keep their
    status, but a 404 for a model the gateway serves is a fault (Dynamo answers an
    empty 404 once its worker is gone): 503. Its 5xx stay 5xx: the gateway answers
    every client mistake itself, so a 5xx is never a 400. Anything else is a 502."""
    detail = upstream.message or "no details given"
    if model is not None and status == 404:
        return ServerError(
            503,
            f"The upstream does not serve model {model!r} right now (it answered 404: {detail}).",
            code="model_unavailable",
        )
    if 500 <= status < 600:
        return ServerError(
            status,
            f"The upstream failed to process the request (HTTP {status}: {detail}).",
            code=UPSTREAM_CODE,
        )
    if 400 <= status < 500:
        return ApiError(
            status,
            upstream.message or f"The upstream rejected the request with HTTP {status}.",
            type=type_for_status(status),
            param=upstream.param,
            code=UPSTREAM_CODE,
        )
    # 1xx/3xx on an embeddings call: nothing a client can use. So is a status HTTP
    # does not have (>= 600, or garbage read as 0), which must never reach the
    # client as its status (Envoy's status is an int32; 10**300 is not).
    return ServerError(
        502,
        f"The upstream answered HTTP {status}, not an embeddings response.",
        code="bad_upstream_response",
    )


def _asks(sent: Mapping[str, Any], ask: UpstreamAsk) -> bool:
    """``sent``, in OpenAI's shape, already says exactly ``ask``."""
    return (
        sent.get("model") == ask.model
        and ask.input is None
        and not ask.raw
        and _same_int(sent.get("dimensions"), ask.dimensions)
        and _same_int(sent.get("truncate_prompt_tokens"), ask.truncate_prompt_tokens)
        and sent.get("encoding_format", "float") == ask.encoding
    )


def _same_int(value: Any, expected: int | None) -> bool:
    """``value`` is absent when ``expected`` is, else that integer as a JSON integer."""
    if expected is None:
        return value is None
    return type(value) is int and value == expected


def read_json(body: bytes) -> Any:
    """A rerank answer's JSON; BadRerankAnswerError when it is not JSON."""
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


def scores_in_order(results: Any, key: str, count: int) -> tuple[float, ...]:
    """Scores by document position from a list of ``{index, <key>}`` results: every
    index 0..count-1 exactly once (a subclass reading another shape uses it)."""
    if not isinstance(results, list):
        raise BadRerankAnswerError("it is not an array of results")
    return _in_order([(_index(r), _score(r, key)) for r in results], count)


def _in_order(pairs: list[tuple[int, float]], count: int) -> tuple[float, ...]:
    """Scores by document position: every index 0..count-1 exactly once."""
    if sorted(i for i, _ in pairs) != list(range(count)):
        raise BadRerankAnswerError(f"its results are not documents 0 to {count - 1}, each once")
    scores = [0.0] * count
    for index, score in pairs:
        scores[index] = score
    return tuple(scores)
