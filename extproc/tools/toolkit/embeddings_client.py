"""A client of one embeddings endpoint, on the package's HTTP client
(:mod:`extproc.runtime.blocking_http`: keep-alive per thread, timeouts, the
stale-connection retry).

The endpoint is named by any URL of its server (:func:`endpoint_url`); the client
POSTs request bodies to it and GETs the paths next to it (``/models`` under ``/v1``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from extproc.runtime.blocking_http import HttpClient, HttpResult, split_url

ENDPOINT = "/embeddings"
DEFAULT_TIMEOUT_S = 60.0  # per socket operation: an embeddings batch on a busy CPU server


def endpoint_url(base: str) -> str:
    """The embeddings endpoint for a server URL: ``http://h:p`` and ``http://h:p/v1``
    get ``/v1/embeddings`` appended; a URL already ending in ``/embeddings`` is kept.
    Raises ValueError for anything but an http(s) URL with a host."""
    parts = urlsplit(base.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {base!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"URL must not have a query or fragment: {base!r}")
    path = parts.path.rstrip("/")
    if not path.endswith(ENDPOINT):
        path = path + ENDPOINT if path.endswith("/v1") else path + "/v1" + ENDPOINT
    return f"{parts.scheme}://{parts.netloc}{path}"


class EmbeddingsClient:
    """POSTs to one embeddings endpoint. Thread-safe: each thread has its own connection."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.url = endpoint_url(url)
        server, self.path = split_url(self.url)
        # the API root the endpoint sits in ("/v1"): other paths of the API are under it
        self.api_root = self.path[: -len(ENDPOINT)]
        self._http = HttpClient(server, timeout_s=timeout_s, headers=headers)

    def post(self, body: bytes, content_type: str = "application/json") -> HttpResult:
        return self._http.post(self.path, body, content_type)

    def post_json(self, doc: Any) -> HttpResult:
        return self.post(orjson.dumps(doc))

    def get(self, path: str) -> HttpResult:
        """GET ``path`` under the API root (``/models`` is ``/v1/models``)."""
        return self._http.get(self.api_root + path)

    def close(self) -> None:
        self._http.close()
