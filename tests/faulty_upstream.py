"""A scripted raw-socket upstream: answers that real vLLM/Dynamo cannot be made to give.

``testing_support/fake_upstream.py`` reproduces what the real upstreams were measured to answer;
this one reproduces how upstreams (and what stands between them and Envoy) *break*. It
is a bounded threaded TCP server on 127.0.0.1: each connection reads one HTTP/1.1
request (head, then a ``content-length`` or chunked body), then plays the current
:class:`Script` step by step: send these exact bytes, sleep, close (FIN) or reset (RST).
One request per connection; every scripted response says ``connection: close``, so
Envoy never reuses a connection the script has broken.

The scripts (:func:`scripts`) and the real failure each stands for:

- ``ok``: a valid Dynamo-shaped 200 (float arrays). The control: the gateway works
  against this server at all.
- ``down``: nothing listens on the port (connection refused): the upstream process is
  not running, or its pod has no endpoint yet.
- ``reset``: the request is read, then the connection is reset (RST): the worker process
  crashed or was OOM-killed mid-request, or a load balancer/conntrack dropped the flow.
- ``close_no_answer``: the request is read, then a clean close (FIN) with no byte
  written: the server shut down (or hit an uncaught error) before answering.
- ``not_http``: a non-HTTP banner: the upstream address points at the wrong service
  (another protocol, a TLS port).
- ``slow``: a valid 200, but only after ``slow_seconds``: a stalled GPU worker, a queue
  backlog, a model loading after a restart.
- ``headers_then_close``: 200 headers with ``content-length``, then a close before any
  body byte: a crash right after the headers were flushed.
- ``mid_body_close`` / ``mid_body_reset``: 200 headers with ``content-length``, half the
  body, then FIN / RST: a crash (or a proxy idle timeout, a broken network path) while a
  large vector answer was being written.
- ``chunked_mid_body_close``: a chunked 200 whose terminating chunk never comes: the
  same crash on a server that streams its body.
- ``truncated_json``: 200 with a JSON body cut in half and a ``content-length`` that
  matches the cut body: a buggy serializer or a proxy that truncates at a buffer limit
  and recomputes the length. Complete at the HTTP level, garbage at the JSON level.
- ``wrong_dimension``: 200 with well-formed 384-d vectors instead of the model's size:
  another model (e.g. all-MiniLM-L6-v2) deployed under the served name.
- ``nan_literal``: 200 with a bare ``NaN`` in a vector: a server serialising a diverged
  (fp16 overflow) output with Python's ``json.dumps(allow_nan=True)``.
- ``nan_as_null``: the same overflow serialised by serde_json (Dynamo's frontend) or
  orjson, which write a non-finite float as ``null``.
- ``huge_number``: 200 with ``1e400`` in a vector (beyond a double: infinity once
  parsed): the same overflow written by a formatter that prints it as a number.
- ``nan_base64``: 200 with base64 vectors whose float32 bytes hold NaN: the overflow in
  ``encoding_format: base64`` mode (vLLM encodes whatever the tensor holds).
- ``wrong_count``: 200 with one embedding for a two-input request: a batching bug that
  drops or merges an input.
- ``non_json``: 200 ``text/html``: a proxy or captive page answering in the upstream's
  place with a success status.
- ``index_duplicate`` / ``index_out_of_range``: 200 with the right number of vectors but
  ``index`` values [0, 0] or [1, 2]: a reordering/batching bug that would pair vectors
  with the wrong inputs.

The vector scripts are built for a request of ``count`` inputs (default 2) of a
``dim``-dimensional model (default 1024, Qwen3-Embedding-0.6B), whatever the request
actually says: a test sends that shape. Every request is recorded in ``received``.
"""

from __future__ import annotations

import base64
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final, TypeAlias

import numpy as np
import orjson

__all__ = [
    "Close",
    "FaultyUpstream",
    "RawRequest",
    "Reset",
    "Script",
    "Send",
    "Sleep",
    "http_response",
    "scripts",
]

MAX_HEAD_BYTES: Final = 64 * 1024
MAX_BODY_BYTES: Final = 64 * 1024 * 1024
IO_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True)
class Send:
    data: bytes


@dataclass(frozen=True)
class Sleep:
    """Wait this long (cut short when the server stops)."""

    seconds: float


@dataclass(frozen=True)
class Close:
    """A clean close (FIN)."""


@dataclass(frozen=True)
class Reset:
    """An abortive close (RST): SO_LINGER 0, then close."""


Step: TypeAlias = Send | Sleep | Close | Reset


@dataclass(frozen=True)
class Script:
    name: str
    stands_for: str
    steps: tuple[Step, ...] = ()
    listening: bool = True  # False: the port is closed (connection refused)


@dataclass(frozen=True)
class RawRequest:
    head: bytes
    body: bytes

    @property
    def request_line(self) -> str:
        return self.head.split(b"\r\n", 1)[0].decode("latin-1")


def http_response(
    status: int,
    body: bytes,
    *,
    reason: str = "OK",
    content_type: str | None = "application/json",
    content_length: int | None = None,
) -> bytes:
    """The exact bytes of an HTTP/1.1 response with ``connection: close``.
    ``content_length`` overrides the declared length (to promise more than is sent)."""
    length = len(body) if content_length is None else content_length
    head = [f"HTTP/1.1 {status} {reason}", "date: Mon, 01 Jan 2024 00:00:00 GMT"]
    if content_type is not None:
        head.append(f"content-type: {content_type}")
    head += [f"content-length: {length}", "connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def _unit_rows(count: int, dim: int) -> np.ndarray[tuple[int, int], np.dtype[np.float32]]:
    rows = np.random.default_rng(1234).standard_normal((count, dim))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows.astype(np.float32)


def _embeddings_doc(model: str, embeddings: Sequence[object], indices: list[int]) -> bytes:
    data = [
        {"object": "embedding", "index": i, "embedding": e}
        for i, e in zip(indices, embeddings, strict=True)
    ]
    usage = {"prompt_tokens": 2 * len(data), "total_tokens": 2 * len(data)}
    return orjson.dumps(
        {"object": "list", "data": data, "model": model, "usage": usage},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


def _poison_first_value(body: bytes, token: bytes) -> bytes:
    """``body`` with the first number of the first embedding replaced by ``token``."""
    start = body.index(b'"embedding":[') + len(b'"embedding":[')
    end = body.index(b",", start)
    return body[:start] + token + body[end:]


def scripts(
    *, model: str, count: int = 2, dim: int = 1024, slow_seconds: float = 5.0
) -> dict[str, Script]:
    """Every script, by name (see the module docstring for what each stands for)."""
    rows = _unit_rows(count, dim)
    floats = [list(r) for r in rows]
    good = _embeddings_doc(model, floats, list(range(count)))
    half = good[: len(good) // 2]
    nan_row = rows[0].copy()
    nan_row[3] = np.nan
    b64 = [base64.b64encode(r.astype("<f4").tobytes()).decode() for r in (nan_row, *rows[1:])]
    chunked_head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    )
    all_scripts = [
        Script("ok", "a valid answer (control)", (Send(http_response(200, good)), Close())),
        Script("down", "no process listens on the port", listening=False),
        Script("reset", "worker crashed / OOM-killed mid-request", (Reset(),)),
        Script("close_no_answer", "server exited before answering", (Close(),)),
        Script(
            "not_http",
            "upstream address points at another protocol",
            (Send(b"SSH-2.0-OpenSSH_9.6\r\n"), Close()),
        ),
        Script(
            "slow",
            "stalled worker, queue backlog",
            (Sleep(slow_seconds), Send(http_response(200, good)), Close()),
        ),
        Script(
            "headers_then_close",
            "crash right after the headers",
            (Send(http_response(200, b"", content_length=len(good))), Close()),
        ),
        Script(
            "mid_body_close",
            "crash / proxy timeout while writing the body (FIN)",
            (Send(http_response(200, half, content_length=len(good))), Close()),
        ),
        Script(
            "mid_body_reset",
            "crash / broken path while writing the body (RST)",
            (Send(http_response(200, half, content_length=len(good))), Sleep(0.05), Reset()),
        ),
        Script(
            "chunked_mid_body_close",
            "streaming server crashed before its last chunk",
            (Send(chunked_head + f"{len(half):x}\r\n".encode() + half + b"\r\n"), Close()),
        ),
        Script(
            "truncated_json",
            "serializer bug / truncating proxy with a recomputed length",
            (Send(http_response(200, half)), Close()),
        ),
        Script(
            "wrong_dimension",
            "another model deployed under the served name",
            (
                Send(
                    http_response(
                        200,
                        _embeddings_doc(
                            model, [list(r) for r in _unit_rows(count, 384)], list(range(count))
                        ),
                    )
                ),
                Close(),
            ),
        ),
        Script(
            "nan_literal",
            "diverged output via json.dumps(allow_nan=True)",
            (Send(http_response(200, _poison_first_value(good, b"NaN"))), Close()),
        ),
        Script(
            "nan_as_null",
            "diverged output via serde_json / orjson (NaN -> null)",
            (Send(http_response(200, _poison_first_value(good, b"null"))), Close()),
        ),
        Script(
            "huge_number",
            "diverged output printed as an out-of-range number",
            (Send(http_response(200, _poison_first_value(good, b"1e400"))), Close()),
        ),
        Script(
            "nan_base64",
            "diverged output in base64 mode",
            (
                Send(http_response(200, _embeddings_doc(model, list(b64), list(range(count))))),
                Close(),
            ),
        ),
        Script(
            "wrong_count",
            "batching bug: an input dropped",
            (
                Send(
                    http_response(200, _embeddings_doc(model, floats[:-1], list(range(count - 1))))
                ),
                Close(),
            ),
        ),
        Script(
            "non_json",
            "a proxy page answering 200 in the upstream's place",
            (
                Send(http_response(200, b"<html><body>OK</body></html>", content_type="text/html")),
                Close(),
            ),
        ),
        Script(
            "index_duplicate",
            "reordering bug: index values [0, 0, ...]",
            (Send(http_response(200, _embeddings_doc(model, floats, [0] * count))), Close()),
        ),
        Script(
            "index_out_of_range",
            "reordering bug: index values [1, 2, ...]",
            (
                Send(http_response(200, _embeddings_doc(model, floats, list(range(1, count + 1))))),
                Close(),
            ),
        ),
    ]
    return {s.name: s for s in all_scripts}


@dataclass
class FaultyUpstream:
    """Serves the current ``script`` to every connection. Use as a context manager.

    At most ``max_connections`` connections are handled at once (the rest wait in the
    listen backlog); every socket operation has a timeout; ``stop()`` wakes sleeping
    scripts, closes every connection and joins every thread (bounded)."""

    script: Script
    max_connections: int = 16
    received: list[RawRequest] = field(default_factory=list)
    _port: int = 0
    _listener: socket.socket | None = None
    _accept_thread: threading.Thread | None = None
    _listener_lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _slots: threading.BoundedSemaphore | None = None
    _workers: set[threading.Thread] = field(default_factory=set)
    _connections: set[socket.socket] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FaultyUpstream:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._stopping.clear()
        self._open_listener()
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"faulty-upstream-{self._port}", daemon=True
        )
        self._accept_thread.start()
        self.use(self.script)
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._close_listener()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5)
        with self._lock:
            connections, workers = list(self._connections), list(self._workers)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for worker in workers:
            worker.join(timeout=5)

    def __enter__(self) -> FaultyUpstream:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def use(self, script: Script) -> None:
        """Play ``script`` from the next connection on; open or close the port to match."""
        self.script = script
        with self._lock:
            self.received.clear()
        if script.listening:
            self._open_listener()
        else:
            self._close_listener()

    # ------------------------------------------------------------------ listening

    def _open_listener(self) -> None:
        with self._listener_lock:
            if self._listener is not None:
                return
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self._port))  # port 0 the first time, then the same
            listener.listen(64)
            listener.settimeout(0.05)
            self._port = int(listener.getsockname()[1])
            self._listener = listener

    def _close_listener(self) -> None:
        with self._listener_lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None

    def _accept_loop(self) -> None:
        assert self._slots is not None
        while not self._stopping.is_set():
            if not self._slots.acquire(timeout=0.05):
                continue
            conn = self._accept_one()
            if conn is None:
                self._slots.release()
                continue
            worker = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self._lock:
                self._connections.add(conn)
                self._workers.add(worker)
            worker.start()

    def _accept_one(self) -> socket.socket | None:
        # Under the lock (an accept waits 50 ms at most), so that use() never closes
        # the listener in the middle of an accept.
        with self._listener_lock:
            listener = self._listener
            if listener is not None:
                try:
                    conn, _ = listener.accept()
                except (TimeoutError, OSError):
                    return None
                conn.settimeout(IO_TIMEOUT_S)
                return conn
        time.sleep(0.05)
        return None

    # ------------------------------------------------------------------ one connection

    def _serve(self, conn: socket.socket) -> None:
        script = self.script
        try:
            request = _read_request(conn)
            if request is not None:
                with self._lock:
                    self.received.append(request)
            self._play(conn, script)
        except OSError:
            pass  # the peer (Envoy) went away: nothing to answer
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            with self._lock:
                self._connections.discard(conn)
                self._workers.discard(threading.current_thread())
            assert self._slots is not None
            self._slots.release()

    def _play(self, conn: socket.socket, script: Script) -> None:
        for step in script.steps:
            if isinstance(step, Send):
                conn.sendall(step.data)
            elif isinstance(step, Sleep):
                if self._stopping.wait(step.seconds):
                    return
            elif isinstance(step, Reset):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
                return
            else:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_WR)
                # Let the peer read to the FIN before the socket goes (no RST for
                # unread request bytes).
                with contextlib.suppress(OSError):
                    conn.settimeout(1.0)
                    while conn.recv(65536):
                        pass
                return


def _read_request(conn: socket.socket) -> RawRequest | None:
    """One request: the head up to the blank line, then the body it announces."""
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buffer += chunk
        if len(buffer) > MAX_HEAD_BYTES:
            raise OSError("request head too large")
    head, _, rest = buffer.partition(b"\r\n\r\n")
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        return RawRequest(head, _read_chunked(conn, rest))
    length = int(headers.get(b"content-length", b"0") or b"0")
    if length > MAX_BODY_BYTES:
        raise OSError("request body too large")
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return RawRequest(head, rest[:length])


def _read_chunked(conn: socket.socket, buffer: bytes) -> bytes:
    body = b""
    while True:
        while b"\r\n" not in buffer:
            chunk = conn.recv(65536)
            if not chunk:
                return body
            buffer += chunk
        size_line, _, buffer = buffer.partition(b"\r\n")
        size = int(size_line.split(b";", 1)[0] or b"0", 16)
        if size == 0:
            return body  # trailers, if any, are ignored
        while len(buffer) < size + 2:
            chunk = conn.recv(65536)
            if not chunk:
                return body + buffer
            buffer += chunk
        body += buffer[:size]
        buffer = buffer[size + 2 :]
        if len(body) > MAX_BODY_BYTES:
            raise OSError("request body too large")
