"""A small blocking HTTP client for one embeddings endpoint (stdlib only).

One keep-alive connection per thread (so the concurrent phase measures the server,
not TCP handshakes); every socket operation has a timeout; a request that fails on a
kept-alive connection the server had already closed is retried once on a new one.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

DEFAULT_TIMEOUT_S = 60.0
_STALE_CONNECTION_ERRORS = (
    http.client.RemoteDisconnected,
    http.client.BadStatusLine,
    ConnectionResetError,
    BrokenPipeError,
    ConnectionAbortedError,
)


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
    if not path.endswith("/embeddings"):
        path = path + "/embeddings" if path.endswith("/v1") else path + "/v1/embeddings"
    return f"{parts.scheme}://{parts.netloc}{path}"


@dataclass(frozen=True)
class HttpResult:
    """One exchange. ``status`` 0 means no HTTP answer (``error`` says why);
    ``elapsed_s`` runs from sending the request to the last byte of the body."""

    status: int
    body: bytes
    elapsed_s: float
    error: str | None = None


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
        parts = urlsplit(self.url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._path = parts.path
        self._timeout_s = timeout_s
        self._headers = dict(headers or {})
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._all_lock = threading.Lock()

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection and whether it was used before."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        if self._https:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout_s)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)
        self._local.conn = conn
        with self._all_lock:
            self._all.append(conn)
        return conn, False

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        self._local.conn = None

    def post(self, body: bytes, content_type: str = "application/json") -> HttpResult:
        headers = {
            "content-type": content_type,
            "accept": "application/json",
            **self._headers,
        }
        for _attempt in range(2):  # the second attempt only after a stale keep-alive
            conn, reused = self._connection()
            started = time.perf_counter()
            try:
                conn.request("POST", self._path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except _STALE_CONNECTION_ERRORS as exc:
                self._drop(conn)
                if reused:
                    continue
                return HttpResult(0, b"", time.perf_counter() - started, _describe(exc))
            except (OSError, http.client.HTTPException, ValueError) as exc:
                self._drop(conn)
                return HttpResult(0, b"", time.perf_counter() - started, _describe(exc))
            elapsed = time.perf_counter() - started
            if response.will_close:
                self._drop(conn)
            return HttpResult(response.status, data, elapsed)
        return HttpResult(0, b"", 0.0, "connection closed twice")

    def post_json(self, doc: Any) -> HttpResult:
        return self.post(orjson.dumps(doc))

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:120]
