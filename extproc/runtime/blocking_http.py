"""The package's one HTTP client: blocking, stdlib only (the ``http.client`` module).

:class:`HttpClient` sends requests to one server. Each thread keeps its own keep-alive
connection (so concurrent requests measure the server, not TCP handshakes); every
socket operation has a timeout; a request that fails on a kept-alive connection the
server had already closed is sent once more on a new one (never a request on a fresh
connection: its failure is the server's answer). No exception escapes a request: an
exchange without an HTTP answer is an :class:`HttpResult` with status 0 and the reason.

:func:`request_once` is one request on a connection of its own, for a poll or a single
question; :func:`answers_ok` is a health or readiness check.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

# What a kept-alive connection the server has closed in the meantime raises.
_STALE_CONNECTION_ERRORS = (
    http.client.RemoteDisconnected,
    http.client.BadStatusLine,
    ConnectionResetError,
    BrokenPipeError,
    ConnectionAbortedError,
)


@dataclass(frozen=True)
class HttpResult:
    """One exchange. ``status`` 0 means no HTTP answer (``error`` says why);
    ``elapsed_s`` runs from sending the request to the last byte of the body."""

    status: int
    body: bytes
    elapsed_s: float
    error: str | None = None


def split_url(url: str) -> tuple[str, str]:
    """``(server, target)`` of an http(s) URL: ``scheme://host[:port]`` and the path with
    its query (``/`` when there is no path). ValueError for anything else."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return f"{parts.scheme}://{parts.netloc}", target


class HttpClient:
    """Requests to one server (``scheme://host[:port]``). Thread-safe: each thread
    has its own connection. ``headers`` go with every request and win over the
    defaults a request sets (content-type, accept)."""

    def __init__(
        self, server: str, *, timeout_s: float, headers: Mapping[str, str] | None = None
    ) -> None:
        origin, target = split_url(server)
        if target != "/":
            raise ValueError(f"a server URL has no path or query: {server!r}")
        parts = urlsplit(origin)
        self.server = origin
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._timeout_s = timeout_s
        self._headers = dict(headers or {})
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._all_lock = threading.Lock()

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

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

    def request(
        self,
        method: str,
        target: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpResult:
        """``method`` on ``target`` (a path, with its query), the whole body read."""
        sent = {**(headers or {}), **self._headers}
        for _attempt in range(2):  # the second attempt only after a stale keep-alive
            conn, reused = self._connection()
            started = time.perf_counter()
            try:
                conn.request(method, target, body=body, headers=sent)
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

    def post(self, target: str, body: bytes, content_type: str = "application/json") -> HttpResult:
        return self.request(
            "POST", target, body, {"content-type": content_type, "accept": "application/json"}
        )

    def get(self, target: str) -> HttpResult:
        return self.request("GET", target)

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()


def request_once(
    method: str,
    url: str,
    body: bytes | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: float,
) -> HttpResult:
    """One request to ``url`` on a connection of its own, closed after the answer.
    ValueError for a URL that is not http(s)."""
    server, target = split_url(url)
    with HttpClient(server, timeout_s=timeout_s) as client:
        return client.request(method, target, body, headers)


def answers_ok(url: str, *, timeout_s: float) -> bool:
    """Whether a GET of ``url`` (a health or readiness endpoint) answers 200."""
    return request_once("GET", url, timeout_s=timeout_s).status == 200


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:120]
