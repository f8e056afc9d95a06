"""Checks on an embeddings request's line and headers, before any body is read (sans-I/O).

The ext_proc server reads the request headers in the one-filter shape
(envoy/single-filter.yaml, the Istio and Envoy Gateway configurations), whose
matchers send it every request that names the endpoint in any spelling. These
checks decide, from the request line and headers alone, whether such a request
goes through the contract and what the upstream is told:

- a path is compared as a route (:func:`route_of`: no query string, repeated slashes
  as one, as Envoy's ``merge_slashes`` counts them) against the contract's route
  table (extproc/core/routes.py): the embeddings endpoint's two spellings,
  ``/v1/embeddings`` and its alias ``/embeddings``, and the policy's rerank paths.
  The upstream gets the endpoint's own path (the embeddings endpoint takes no query
  parameters, and an upstream that 404s on an unknown one would read as a lost
  model). Every other path that reached the gateway (another case, ``;params``, a
  path below the endpoint) is a 404 (:func:`unknown_path`), never forwarded raw.
- only ``POST`` is an embeddings request (405), and a POST whose headers end the
  request has no body to embed (400).
- a compressed body is refused (415), never read as text nor forwarded
  mislabelled; ``identity`` is the only coding accepted. This shape has no decoder
  and cannot get one (Envoy Gateway gives it only the ext_proc filter).
- only a JSON body (or one whose type is not declared) is read (415), and a body
  whose declared ``Content-Length`` is over the limit is refused (413) before Envoy
  buffers it; the body as received is held to the same limit
  (:func:`check_body_size`), since a chunked body declares no length.

envoy/standalone.yaml makes the same decisions with routes and Lua filters before
its ext_proc stream opens (it skips the request headers); the answers are the same,
but for gzip and br bodies, which it decodes (extproc/core/request_coding.py). The
content type then arrives with the body and is checked there.
"""

from __future__ import annotations

import re
from typing import Final

from extproc.core.api_errors import ApiError, MalformedBodyError, TooLargeError, quoted
from extproc.core.policy.model import Limits

UPSTREAM_PATH: Final = "/v1/embeddings"
_SLASHES: Final = re.compile("/{2,}")
_JSON_TYPES: Final = ("application/json", "text/json")


def route_of(path: str) -> str:
    """``path`` as routes compare it: no query string, runs of slashes as one."""
    return _SLASHES.sub("/", path.split("?", 1)[0])


def unknown_path() -> ApiError:
    """The 404 for a path no endpoint serves (extproc/core/routes.py)."""
    return ApiError(
        404, "Unknown path; the embeddings endpoint is POST /v1/embeddings.", code="unknown_url"
    )


def check_method(method: str) -> None:
    if method != "POST":
        raise ApiError(
            405,
            "Use POST for /v1/embeddings.",
            code="method_not_allowed",
        )


def check_content_encoding(content_encoding: str | None) -> None:
    """Only an uncompressed body (no ``Content-Encoding``, or ``identity``) is read."""
    if content_encoding is None or content_encoding.strip(" \t").lower() == "identity":
        return
    raise ApiError(
        415,
        "Compressed request bodies are not accepted; send the JSON body uncompressed "
        "(no Content-Encoding).",
        code="unsupported_content_encoding",
    )


def check_has_body(end_of_stream: bool) -> None:
    """A POST whose headers end the request has no body to embed."""
    if end_of_stream:
        raise MalformedBodyError(
            "The request body is empty; send a JSON object.", code="invalid_json"
        )


def check_content_type(content_type: str | None) -> None:
    """Only JSON bodies (or none declared) are embeddings requests."""
    if content_type is None:
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media in _JSON_TYPES or media.endswith("+json"):
        return
    raise ApiError(
        415,
        f"Unsupported Content-Type {quoted(media)}; send the request as application/json.",
        code="unsupported_media_type",
    )


def declared_length(content_length: str | None) -> int | None:
    """The body size a ``Content-Length`` value declares, or None when it declares
    none (absent: a chunked or HTTP/2 body of unknown length)."""
    # ASCII digits only: str.isdigit() also takes '²' (a latin-1 header byte), which
    # int() refuses, and int() refuses more than 4,300 digits: neither may raise here.
    # A value with more digits than any limit is over it. Envoy refuses anything else
    # before it gets here.
    if content_length is None or not (content_length.isascii() and content_length.isdigit()):
        return None
    digits = content_length.lstrip("0") or "0"
    return int(digits) if len(digits) <= 20 else 10**20


def check_declared_length(content_length: str | None, limits: Limits) -> None:
    """Refuse a body whose declared size is over the limit before it is buffered."""
    size = declared_length(content_length)
    if size is not None:
        check_body_size(size, limits)


def check_body_size(size: int, limits: Limits) -> None:
    """The body-size limit (413), for a declared size and for a received body alike."""
    if size > limits.max_request_bytes:
        raise TooLargeError(
            f"Request body is {size} bytes; the limit is {limits.max_request_bytes}."
        )
