"""A stand-in for the seed's legacy server on every path but embeddings, as a split
migration (`extproc run --legacy`) sends them to it: it records every request exactly
as it arrived and answers as the legacy FastAPI server did (tests/test_split_migration.py,
tests/test_path_spellings.py)."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import orjson

WAIT_S = 30.0
# What the legacy server's FastAPI answered for a request it could not validate.
LEGACY_422 = b'{"detail":[{"type":"missing","loc":["body","query"],"msg":"Field required"}]}'
LEGACY_500 = b"Internal Server Error"
MODELS = b'{"object":"list","data":[{"id":"Qwen/Qwen3-Embedding-0.6B"},{"id":"bge-reranker"}]}'
STREAM_CHUNKS = [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]


@dataclass(frozen=True)
class Seen:
    """One request as the legacy stand-in received it."""

    method: str
    target: str  # path and query, as on the request line
    headers: list[tuple[str, str]]
    body_sha256: str
    body_bytes: int

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k.lower() == name]
        assert len(values) <= 1, (name, values)
        return values[0] if values else None


@dataclass
class _State:
    seen: list[Seen] = field(default_factory=list)
    body_progress: int = 0  # bytes of the current request body read so far
    stream_release: threading.Event = field(default_factory=threading.Event)


class _LegacyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: ClassVar[_State]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _read_body(self) -> bytes:
        """The whole body, read in 64 KiB pieces so a test can watch it arrive."""
        self.state.body_progress = 0
        chunks: list[bytes] = []
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
                self.state.body_progress += size
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
        else:
            remaining = int(self.headers.get("content-length", "0"))
            while remaining:
                chunk = self.rfile.read(min(remaining, 1 << 16))
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
                self.state.body_progress += len(chunk)
        return b"".join(chunks)

    def _answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.send_header("x-legacy-server", "seed-fastapi")
        self.end_headers()
        self.wfile.write(body)

    def _stream(self) -> None:
        """A chunked answer whose last chunks wait until the test has seen the first."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for index, chunk in enumerate(STREAM_CHUNKS):
            if index == 1:
                self.state.stream_release.wait(WAIT_S)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def _handle(self) -> None:
        body = self._read_body()
        self.state.seen.append(
            Seen(
                self.command,
                self.path,
                list(self.headers.items()),
                hashlib.sha256(body).hexdigest(),
                len(body),
            )
        )
        path = self.path.partition("?")[0]
        if path == "/v1/rerank":
            doc = orjson.loads(body)
            ranked = [
                {"index": i, "relevance_score": 1.0 / (i + 1)} for i in range(len(doc["documents"]))
            ]
            self._answer(200, orjson.dumps({"results": ranked}))
        elif path == "/v1/audio/transcriptions":
            digest = hashlib.sha256(body).hexdigest()
            self._answer(200, orjson.dumps({"text": "hello", "bytes": len(body), "sha256": digest}))
        elif path == "/v1/models":
            self._answer(200, MODELS)
        elif path == "/health":
            self._answer(200, b'{"status":"ok","server":"legacy"}')
        elif path == "/v1/rerank-invalid":
            self._answer(422, LEGACY_422)
        elif path == "/v1/broken":
            self._answer(500, LEGACY_500, "text/plain")
        elif path == "/v1/stream":
            self._stream()
        else:
            self._answer(404, b'{"detail":"Not Found"}')

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()


class LegacyStandIn:
    """Stands in for the seed's legacy server on everything but embeddings: a
    FastAPI-style JSON server for reranking (POST /v1/rerank), speech recognition
    (multipart POST /v1/audio/transcriptions, answering the size and SHA-256 of what
    it got), /v1/models, /health, a 422 validation error, a plain-text 500, and a
    streamed (chunked, server-sent events) answer. It records every request exactly
    as it arrived: method, request target, headers in order, body hash and size."""

    def __init__(self) -> None:
        self.state = _State()
        handler = type("Handler", (_LegacyHandler,), {"state": self.state})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> LegacyStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(WAIT_S)

    def reset(self) -> None:
        self.state.seen.clear()
        self.state.body_progress = 0
        self.state.stream_release.clear()
