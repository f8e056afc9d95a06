"""Where an embeddings request is sent and how its body is coded (sans-I/O).

The ext_proc server reads the request headers in the one-filter shape
(envoy/single-filter.yaml, the Istio and Envoy Gateway configurations), whose
matchers send it every request that names the endpoint in any spelling. These
checks decide, from the request line and headers alone, whether such a request
goes through the contract and what the upstream is told:

- the endpoint has two spellings, ``/v1/embeddings`` and its alias ``/embeddings``
  (some OpenAI-compatible servers serve it too), with or without a query string;
  the upstream always gets :data:`UPSTREAM_PATH` (the endpoint takes no query
  parameters, and an upstream that 404s on an unknown one would read as a lost
  model). Repeated slashes count as one, as Envoy's ``merge_slashes`` counts them.
  Every other spelling that reached the gateway (another case, ``;params``, a
  path below the endpoint) is a 404: no such endpoint, never forwarded raw.
- a compressed body is refused (415), never read as text nor forwarded
  mislabelled; ``identity`` is the only coding accepted. This shape has no decoder
  and cannot get one (Envoy Gateway gives it only the ext_proc filter).

envoy/standalone.yaml makes the same decisions with routes and Lua filters before
its ext_proc stream opens (it skips the request headers); the answers are the same,
but for gzip and br bodies, which it decodes (extproc/core/request_coding.py).
"""

from __future__ import annotations

import re
from typing import Final

from extproc.core.errors import ApiError, invalid_request

UPSTREAM_PATH: Final = "/v1/embeddings"
_ENDPOINT_PATHS: Final = frozenset({UPSTREAM_PATH, "/embeddings"})
_SLASHES: Final = re.compile("/{2,}")


def upstream_path(path: str) -> str:
    """The path the upstream gets for a request to ``path`` (as Envoy hands it over,
    query string included), or a 404 :class:`ApiError` when ``path`` is not a
    spelling of the endpoint."""
    route = _SLASHES.sub("/", path.split("?", 1)[0])
    if route not in _ENDPOINT_PATHS:
        raise ApiError(
            404,
            "Unknown path; the embeddings endpoint is POST /v1/embeddings.",
            type="invalid_request_error",
            code="unknown_url",
        )
    return UPSTREAM_PATH


def check_method(method: str) -> None:
    if method != "POST":
        raise ApiError(
            405,
            "Use POST for /v1/embeddings.",
            type="invalid_request_error",
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
        type="invalid_request_error",
        code="unsupported_content_encoding",
    )


def check_has_body(end_of_stream: bool) -> None:
    """A POST whose headers end the request has no body to embed."""
    if end_of_stream:
        raise invalid_request("The request body is empty; send a JSON object.", code="invalid_json")
