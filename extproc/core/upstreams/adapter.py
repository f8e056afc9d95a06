"""The base class of the upstream adapters, and what an upstream can do itself.

An adapter holds everything that differs between upstream kinds, in both
directions: what the upstream is asked (the encoding the gateway asks for when it
must read the vectors, and how a request - native capabilities included - is
written in the upstream's body), how its answers are read (success and error
bodies) and what its errors become for the client (status and envelope), plus which
parts of the contract the upstream can apply itself. The base class speaks OpenAI's
shapes; a kind overrides what differs. It imports nothing from the policy or the
plan, so both can name adapters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import orjson

from extproc.core.embeddings_body import EmbeddingsBody, parse_embeddings_body
from extproc.core.error_envelope import UPSTREAM_CODE, ApiError, type_for_status
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


def client_error(status: int, upstream: UpstreamError, model: str | None) -> ApiError:
    """An upstream's non-2xx answer as the client's error (``model``: the one asked
    for, None when the gateway never matched the request to one). Its 4xx keep their
    status, but a 404 for a model the gateway serves is a fault (Dynamo answers an
    empty 404 once its worker is gone): 503. Its 5xx stay 5xx: the gateway answers
    every client mistake itself, so a 5xx is never a 400. Anything else is a 502."""
    detail = upstream.message or "no details given"
    if model is not None and status == 404:
        return ApiError(
            503,
            f"The upstream does not serve model {model!r} right now (it answered 404: {detail}).",
            type="server_error",
            code="model_unavailable",
        )
    if 500 <= status < 600:
        return ApiError(
            status,
            f"The upstream failed to process the request (HTTP {status}: {detail}).",
            type="server_error",
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
    return ApiError(
        502,
        f"The upstream answered HTTP {status}, not an embeddings response.",
        type="server_error",
        code="bad_upstream_response",
    )


def _asks(sent: Mapping[str, Any], ask: UpstreamAsk) -> bool:
    """``sent``, in OpenAI's shape, already says exactly ``ask``."""
    return (
        sent.get("model") == ask.model
        and ask.input is None
        and _same_int(sent.get("dimensions"), ask.dimensions)
        and _same_int(sent.get("truncate_prompt_tokens"), ask.truncate_prompt_tokens)
        and sent.get("encoding_format", "float") == ask.encoding
    )


def _same_int(value: Any, expected: int | None) -> bool:
    """``value`` is absent when ``expected`` is, else that integer as a JSON integer."""
    if expected is None:
        return value is None
    return type(value) is int and value == expected
