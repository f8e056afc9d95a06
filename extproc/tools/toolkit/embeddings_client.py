"""A client of one embeddings endpoint, on the package's HTTP client
(:mod:`extproc.runtime.blocking_http`: keep-alive per thread, timeouts, the
stale-connection retry).

The endpoint is named by any URL of its server (:func:`endpoint_url`); the client
POSTs request bodies to it and GETs the paths next to it (``/models`` under ``/v1``).
A client of a server that speaks another dialect (TEI, Cohere, Ollama) is given it:
it is then asked in OpenAI's terms as every tool asks, and says each request as that
dialect's clients do, at that dialect's path (:func:`dialect_url`); its answers are
read by the same dialect (:meth:`extproc.tools.parity.Answer.read`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from extproc.core.dialects import EMBEDDINGS_DIALECTS
from extproc.core.registry import named
from extproc.core.tasks.embed import EmbeddingsDialect
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


def dialect_url(base: str, dialect: EmbeddingsDialect | None) -> str:
    """The endpoint a ``dialect``'s clients post to on the server at ``base``: OpenAI's
    (:func:`endpoint_url`) for OpenAI's and Jina's; else ``base`` when it already ends
    in one of the dialect's paths, or the server's root and the dialect's first path."""
    if dialect is None or not dialect.own_shape:
        return endpoint_url(base)
    endpoint_url(base)  # the same checks
    parts = urlsplit(base.strip())
    path = parts.path.rstrip("/")
    if path and any(path.endswith(p) for p in dialect.paths if p != "/"):
        return f"{parts.scheme}://{parts.netloc}{path}"
    return f"{parts.scheme}://{parts.netloc}{dialect.paths[0]}"


def embeddings_dialect(name: str | None) -> EmbeddingsDialect | None:
    """A dialect by its name (``tei``, ``cohere_v2``, ...); None for OpenAI's, or no name.
    UnknownNameError naming the known ones for any other."""
    if name is None or name == "openai":
        return None
    return named(EMBEDDINGS_DIALECTS, name.lower(), "embeddings dialect")


class EmbeddingsClient:
    """POSTs to one embeddings endpoint, in OpenAI's dialect or ``dialect``'s.
    Thread-safe: each thread has its own connection."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        headers: Mapping[str, str] | None = None,
        dialect: EmbeddingsDialect | None = None,
    ) -> None:
        self.dialect = dialect
        self.url = dialect_url(url, dialect)
        server, self.path = split_url(self.url)
        # the API root the endpoint sits in ("/v1"): other paths of the API are under it
        self.api_root = self.path[: -len(ENDPOINT)] if self.path.endswith(ENDPOINT) else "/v1"
        self._http = HttpClient(server, timeout_s=timeout_s, headers=headers)

    def post(self, body: bytes, content_type: str = "application/json") -> HttpResult:
        """``body``, an OpenAI request, as this client's dialect says it: a request the
        dialect has no words for is not sent (status 0, ``error`` says so); a body
        that is not a JSON object goes as it is (the tools send malformed ones on
        purpose)."""
        said = say(self.dialect, body)
        if said is None:
            return unsaid(self.dialect)
        return self._http.post(self.path, said, content_type)

    def post_json(self, doc: Any) -> HttpResult:
        return self.post(orjson.dumps(doc))

    def get(self, path: str) -> HttpResult:
        """GET ``path`` under the API root (``/models`` is ``/v1/models``)."""
        return self._http.get(self.api_root + path)

    def close(self) -> None:
        self._http.close()


def say(dialect: EmbeddingsDialect | None, body: bytes) -> bytes | None:
    """An OpenAI request body in ``dialect``'s words (None: it has none for it);
    as it is for OpenAI's (no dialect)."""
    if dialect is None:
        return body
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(doc, dict):
        return body
    written = dialect.write_request(doc)
    return None if written is None else orjson.dumps(written)


def unsaid(dialect: EmbeddingsDialect | None) -> HttpResult:
    """What asking a request ``dialect`` cannot say gives: nothing sent, no answer."""
    name = "an OpenAI" if dialect is None else f"a {dialect.name}"
    return HttpResult(0, b"", 0.0, f"{name} client cannot say this request")
