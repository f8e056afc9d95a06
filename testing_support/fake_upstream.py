"""A fake embeddings upstream: Dynamo 1.6.1 (default) or plain vLLM 0.32 on POST /v1/embeddings.

Only use this in tests that cannot run the real upstream. The real stacks run on this
machine (see ``scripts/README-real-upstream.md``), and the e2e tests use them. This fake
does not run a model. It gives back the status codes, error bodies and response shapes that
``docs/upstreams.md`` records, and its vectors are made up but deterministic, so
gateway tests can work out the expected answer with :meth:`FakeUpstream.embed_ids`.

Measured behaviours it reproduces (the answers are tabled in ``docs/upstreams.md``; the
letters below only label them).

Dynamo 1.6.1 frontend + vLLM embedding worker (``flavour="dynamo"``):

- (a) 200 ``{"object":"list","data":[{"object":"embedding","index":i,"embedding":[...]}],
  "model":<served>,"usage":{"prompt_tokens":N,"total_tokens":N}}``: floats are printed as
  the shortest float32 repr, and there is **no** ``id``/``created``. The vectors are L2 unit
  vectors.
- (b)(c) any integer ``dimensions`` (even the native size) gives **500**
  ``{"message":"Internal server error","type":"Internal Server Error","code":500}``. With
  ``is_matryoshka=True``, 1 <= d <= dim gives 200 with the first d components
  re-normalised, and anything else gives 500. (Dynamo was not measured with is_matryoshka;
  this follows vLLM's measured 200 plus Dynamo's rule that worker validation errors become 500.)
- (d) unknown fields (``input_type``, ``instruction``, anything else) are ignored
  silently. The vector is the same as without them.
- (e) an input over ``max_model_len`` tokens, or a text input over ``18 * max_model_len``
  characters, gives the generic **500**. One over-long item fails the whole batch.
- (f) ``encoding_format:"base64"``: each embedding is the base64 of its little-endian
  float32 bytes, the same bits as the float form.
- (g) token-id input ``[...]`` / ``[[...],...]`` is used as it is (no special tokens added).
  Text gets the tokenizer's ids plus ``eos_id`` (Qwen3-Embedding's ``<|endoftext|>``).
  ``usage.prompt_tokens`` is the number of tokens over the whole batch.
- (h) ``truncate_prompt_tokens`` k keeps the last k tokens (vLLM's left truncation), and
  -1 means ``max_model_len``. Then usage counts the truncated tokens. k > max_model_len
  gives the generic 500. With truncation set, the character pre-check is skipped.
- (i) malformed JSON: 400 flat ``{"message":"Failed to deserialize the JSON body into the
  target type: ... at line L column C","type":"Bad Request","code":400}``. The EOF case has
  the measured wording, and other syntax errors carry orjson's wording.
- (j) ``"input": []`` gives 400 ``{"message":"Invalid request","type":"Bad Request",
  "code":400}``. ``""`` and ``[""]`` give 200 (the embedding of the EOS token alone).
- (k) a wrong ``model`` gives 404 ``{"message":"Model not found","type":"Not Found","code":404}``.
- a missing ``model`` gives a flat 400 with "missing field `model`". A ``content-type`` that
  is not JSON gives **415**. An ``encoding_format`` other than float/base64 gives a flat 400.
- GET /health gives 200 JSON ``{"status":"healthy","endpoints":[...],"instances":[...]}``.
  GET /v1/models gives 200 with ``{"id","object","created","owned_by":"nvidia",
  "context_window"}``.
- worker gone (``fault="worker_gone"``): /v1/embeddings gives 404 with an **empty** body, no
  content-type and ``content-length: 0``. /v1/models gives an empty list.

Plain vLLM 0.32 (``flavour="vllm"``):

- (a) the same success body, plus ``id`` and ``created``. usage also carries
  ``completion_tokens: 0`` and ``prompt_tokens_details: null``. Floats are printed as
  float32 shortest repr, not vLLM's float64 repr (``-0.06277176`` rather than
  ``-0.0627717599272728``). Both parse to the same float32.
- errors come as ``{"error":{"message","type","param","code"}}``:
  - ``dimensions`` on a model that is not Matryoshka gives 400 ``Model '<served>' does not
    support Matryoshka embeddings; dimensions must be unset (received dimensions=N).`` With
    ``is_matryoshka=True`` this is vLLM 0.32 started with
    ``--hf-overrides '{"is_matryoshka": true}'``: 1 <= d <= dim gives 200 with the first d
    components re-normalised (what the gateway's emulation computes), and a d outside the
    range gives 400 ``Model '<served>' only supports dimensions in range [1, E], got N.``
  - too long gives 400 ``This model's maximum context length is L tokens. However, your
    prompt contains at least L+1 input tokens...`` (param ``input_tokens``). The character
    pre-check gives ``...your prompt contains C characters (more than 18L characters...``
    (param ``input_text``).
  - a wrong model gives 404 ``NotFoundError``. A missing model uses the served model.
  - ``"input": []`` gives 400 ``You must pass at least one prompt``.
  - malformed JSON gives 400 with type ``Bad Request`` and param ``body.N``. A content-type
    that is not JSON gives 400 ``Unsupported Media Type``.
  - ``truncate_prompt_tokens`` > max_model_len gives 400.
- ``use_activation: false`` answers the pooled vector before its normalisation (its
  norm is not 1; the fake's: :func:`pooled`).
- GET /health gives 200 with an empty body.

Not measured, so chosen here (each one a guess; check it against the real stacks if it matters):
the order of the checks (model, then empty input, then truncation size, then per-item
length, then dimensions); ``dimensions: null`` and ``encoding_format: null`` are taken as
absent; an empty token list (``[[]]``) is a plain ValueError (Dynamo 400 "Invalid
request"); ids that are negative or >= 2**32 are a deserialisation 400. Token ids outside
the vocabulary are *not* rejected (the real engines do reject them). vLLM's ``bytes`` and
``bytes_only`` encodings are not reproduced (the fake answers 501 to say so). The exact
wording of Dynamo's 415 body, of the serde messages other than the measured ones, and of
vLLM's pydantic validation messages is also chosen here.

Fault modes, set with the ``fault`` attribute: ``"http500"`` answers every request with
the generic 500, ``"worker_gone"`` is as above, and ``"slow"`` sleeps ``slow_seconds``
before answering normally. A bug inside the fake gives 599 text/plain (an answer no real
upstream gives) and prints the traceback.

Vectors: the sum over positions i of ``w(i) * T[token_i] * M[i]``, then L2-normalised and
stored as float32. ``T`` is a pseudo-random vector per token id (uniform in [-1, 1), from a
splitmix64 hash of the token id), ``M[i]`` is a pseudo-random per-position mask of factors
0.25/1.75, and ``w(i) = 1 / (1 + i/128)``. The result depends on the order of the tokens:
the same token at two positions gives two contributions with a cosine of about 0.6. A Qwen3
instructed query therefore has a cosine of about 0.4 with the bare query. No component is
ever exactly 0. 1,000 tokens take about 1.5 ms once their rows are cached (about 10 ms the
first time).
"""

from __future__ import annotations

import base64
import contextlib
import socket
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, NamedTuple, TypeAlias

import numpy as np
import orjson
from numpy.typing import NDArray
from tokenizers import Tokenizer

from testing_support.qwen import qwen_tokenizer_dir as default_tokenizer_dir

__all__ = ["FakeUpstream", "Fault", "Flavour", "Received", "default_tokenizer_dir"]

Flavour: TypeAlias = Literal["dynamo", "vllm"]
Fault: TypeAlias = Literal["none", "http500", "worker_gone", "slow"]
Prompt: TypeAlias = str | list[int]

EMBEDDINGS_PATH: Final = "/v1/embeddings"
MODELS_PATH: Final = "/v1/models"
HEALTH_PATH: Final = "/health"
CHARS_PER_TOKEN_BOUND: Final = 18  # vLLM's character pre-check: 18 characters per token
_U32_LIMIT: Final = 2**32
_POSITION_SCALE: Final = 128.0
_TOKEN_SALT: Final = 0x5EED_0001
_MASK_SALT: Final = 0x5EED_0002
_JSON_OPTIONS: Final = orjson.OPT_SERIALIZE_NUMPY


@dataclass(frozen=True)
class Received:
    """One request the fake got. Header names are lower-cased, and repeated headers are
    joined with ", ". ``body`` is the de-chunked body, and ``json`` is that body parsed,
    or None if it was not JSON."""

    path: str
    method: str
    headers: dict[str, str]
    body: bytes
    json: Any | None


@lru_cache(maxsize=4)
def _load_tokenizer(tokenizer_json: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tokenizer_json))


# --------------------------------------------------------------------------- vectors


def _splitmix64(keys: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """The splitmix64 finaliser, vectorised. uint64 arithmetic wraps around, as intended."""
    z = keys + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _hash_rows(row_ids: NDArray[np.uint64], width: int, salt: int) -> NDArray[np.uint64]:
    """``width`` 64-bit hashes for each row id: an array of shape (len(row_ids), width)."""
    salted = _splitmix64(row_ids ^ np.uint64(salt))
    cols = np.arange(width, dtype=np.uint64)
    return _splitmix64(salted[:, None] * np.uint64(0x100000001B3) + cols[None, :])


class _VectorModel:
    """The made-up embedding function. It is thread-safe, and the answer does not depend
    on what is already in the caches. Token rows live in one growing float32 table
    (uniform in [-1, 1), four 16-bit values per hash). The position masks live in another
    (64 mask bits per hash, and each bit gives a factor of 0.25 or 1.75). An embedding is
    then one gather, one multiply and one weighted column sum."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._lock = threading.Lock()
        self._row_of: dict[int, int] = {}
        self._table: NDArray[np.float32] = np.empty((0, dim), dtype=np.float32)
        self._masks: NDArray[np.float32] = np.empty((0, dim), dtype=np.float32)

    def _new_token_rows(self, ids: list[int]) -> NDArray[np.float32]:
        words = -(-self.dim // 4)
        h = _hash_rows(np.array(ids, dtype=np.uint64), words, _TOKEN_SALT)
        u16 = h.astype("<u8", copy=False).view("<u2").reshape(len(ids), 4 * words)[:, : self.dim]
        # the half step keeps every component away from zero
        return (u16.astype(np.float32) + np.float32(0.5)) / np.float32(32768.0) - np.float32(1.0)

    def _new_masks(self, first: int, stop: int) -> NDArray[np.float32]:
        words = -(-self.dim // 64)
        h = _hash_rows(np.arange(first, stop, dtype=np.uint64), words, _MASK_SALT)
        bits = np.unpackbits(h.astype("<u8", copy=False).view(np.uint8), axis=1)[:, : self.dim]
        # 0.25 or 1.75 per component, never 0: short inputs get no exact zeros
        return np.float32(0.25) + np.float32(1.5) * bits.astype(np.float32)

    def _rows(self, ids: list[int]) -> list[int]:
        with self._lock:
            missing = sorted({t for t in ids if t not in self._row_of})
            if missing:
                base = self._table.shape[0]
                self._table = np.concatenate([self._table, self._new_token_rows(missing)])
                for offset, t in enumerate(missing):
                    self._row_of[t] = base + offset
            return [self._row_of[t] for t in ids]

    def _position_masks(self, n: int) -> NDArray[np.float32]:
        with self._lock:
            have = self._masks.shape[0]
            if n > have:
                grow = max(n, 2 * have, 1024)
                self._masks = np.concatenate([self._masks, self._new_masks(have, grow)])
            return self._masks[:n]

    def warm(self, positions: int) -> None:
        """Build the position masks ahead of time, so that the first request is fast."""
        self._position_masks(positions)

    def embed(self, ids: list[int]) -> NDArray[np.float32]:
        if not ids:
            # an embedding of nothing: a fixed vector, so that callers never divide by zero
            ids = [_U32_LIMIT - 1]
        rows = self._rows(ids)
        masks = self._position_masks(len(ids))
        with self._lock:
            table = self._table  # replaced, never mutated, when it grows
        picked = table[rows]
        np.multiply(picked, masks, out=picked)
        weights = 1.0 / (1.0 + np.arange(len(ids), dtype=np.float32) / np.float32(_POSITION_SCALE))
        # einsum, not ``@``: a BLAS matvec wakes its thread pool, which costs milliseconds
        # on a busy 2-core machine
        return _unit(np.einsum("i,ij->j", weights, picked))


def pooled(unit: NDArray[np.float32], ids: list[int]) -> NDArray[np.float32]:
    """vLLM's ``use_activation: false``: the vector before its normalisation. Made up
    here as the unit vector times a norm that grows with the input (1 + tokens/4);
    measured on vLLM with MiniLM, a norm of about 5.7."""
    return (unit * np.float32(1 + len(ids) / 4)).astype(np.float32)


def _unit(vector: NDArray[np.floating[Any]]) -> NDArray[np.float32]:
    v64 = vector.astype(np.float64)
    norm = float(np.linalg.norm(v64))
    if norm == 0.0:
        v64 = np.ones_like(v64)
        norm = float(np.linalg.norm(v64))
    return (v64 / norm).astype(np.float32)


# --------------------------------------------------------------------------- answers


class _Reply(NamedTuple):
    status: int
    body: bytes
    content_type: str | None = "application/json"


def _json_reply(status: int, obj: Any) -> _Reply:
    return _Reply(status, orjson.dumps(obj, option=_JSON_OPTIONS))


class _ParseError(Exception):
    """Deserialisation failed. ``detail`` is the serde-style text without its position."""

    def __init__(self, detail: str, *, at: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.at = at  # byte offset of the error; None means the end of the document


class _WorkerError(Exception):
    """An error raised in the vLLM engine. ``value`` means a plain ValueError (Dynamo maps
    it to a 400), and ``validation`` means a VLLMValidationError (Dynamo answers a bare 500)."""

    def __init__(
        self, kind: Literal["value", "validation"], message: str, param: str | None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param


@dataclass(frozen=True)
class _Request:
    model: str | None
    prompts: list[Prompt]
    encoding_format: Literal["float", "base64"]
    dimensions: int | None
    truncate_prompt_tokens: int | None


def _line_col(body: bytes, at: int | None) -> tuple[int, int]:
    """serde_json's 1-based line and column. ``at=None`` means the last non-blank byte
    (the end of the document, where serde reports a missing field)."""
    if at is None:
        if not body.strip():
            return 1, 0
        at = len(body.rstrip()) - 1
    head = body[:at]
    line = head.count(b"\n") + 1
    col = len(head) - (head.rfind(b"\n") + 1) + 1
    return line, col


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_prompts(raw: Any) -> list[Prompt]:
    """The forms that OpenAI's ``input`` allows: str, list[str], list[int], list[list[int]]."""
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list):
        if not raw:
            return []
        if all(isinstance(x, str) for x in raw):
            return list(raw)
        if all(_is_int(x) and 0 <= x < _U32_LIMIT for x in raw):
            return [list(raw)]
        if all(
            isinstance(x, list) and all(_is_int(t) and 0 <= t < _U32_LIMIT for t in x) for x in raw
        ):
            return [list(x) for x in raw]
    raise _ParseError("input: data did not match any variant of untagged enum EmbeddingInput")


def _describe(value: Any) -> str:
    """How serde names a JSON value in an ``invalid type`` error."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, list):
        return "sequence"
    return "map"


def _parse_request(doc: Any, *, model_required: bool) -> _Request:
    if not isinstance(doc, dict):
        raise _ParseError(f"invalid type: {_describe(doc)}, expected struct EmbeddingRequest")
    model = doc.get("model")
    if model is None and model_required:
        raise _ParseError("missing field `model`")
    if model is not None and not isinstance(model, str):
        raise _ParseError(f"model: invalid type: {_describe(model)}, expected a string")
    if "input" not in doc:
        raise _ParseError("missing field `input`")
    prompts = _parse_prompts(doc["input"])
    fmt = doc.get("encoding_format")
    if fmt is None:
        fmt = "float"
    if fmt not in ("float", "base64"):
        raise _ParseError(
            f"encoding_format: unknown variant `{fmt}`, expected `float` or `base64`"
            if isinstance(fmt, str)
            else f"encoding_format: invalid type: {_describe(fmt)}, expected a string"
        )
    dims = doc.get("dimensions")
    if dims is not None and not (_is_int(dims) and 0 <= dims < _U32_LIMIT):
        raise _ParseError(f"dimensions: invalid value: {_describe(dims)}, expected u32")
    trunc = doc.get("truncate_prompt_tokens")
    if trunc is not None and not (_is_int(trunc) and trunc >= -1):
        raise _ParseError(
            f"truncate_prompt_tokens: invalid value: {_describe(trunc)}, expected i32 >= -1"
        )
    return _Request(
        model=model,
        prompts=prompts,
        encoding_format="base64" if fmt == "base64" else "float",
        dimensions=dims,
        truncate_prompt_tokens=trunc,
    )


# --------------------------------------------------------------------------- the server


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeUpstream

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet about clients that hang up (or stop()) while we answer; loud about the rest."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.fake._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.fake._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        """No access log on stderr."""

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size_line = self.rfile.readline(65537)
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline(65537)  # the CRLF after each chunk
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _handle(self) -> None:
        body = self._read_body()
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        try:
            reply = self.server.fake._answer(self.command, self.path, headers, body)
        except Exception as exc:  # a bug in the fake: say so, never pass for an upstream answer
            traceback.print_exc()
            reply = _Reply(599, f"fake_upstream bug: {exc!r}".encode(), "text/plain")
        self.send_response_only(reply.status)
        self.send_header("date", self.date_time_string())
        if self.server.fake.flavour == "vllm":
            self.send_header("server", "uvicorn")
        if reply.content_type is not None:
            self.send_header("content-type", reply.content_type)
        self.send_header("content-length", str(len(reply.body)))
        if self.close_connection:
            self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(reply.body)
        self.wfile.flush()

    # BaseHTTPRequestHandler dispatches on these names
    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()


class FakeUpstream:
    """The fake Dynamo/vLLM embeddings server. Use it as a context manager, or call
    ``start()``/``stop()``. It listens on 127.0.0.1 on a free port, and ``url`` is
    ``http://127.0.0.1:PORT``."""

    def __init__(
        self,
        *,
        flavour: Flavour = "dynamo",
        served_model: str = "Qwen/Qwen3-Embedding-0.6B",
        dim: int = 1024,
        max_model_len: int = 1024,
        tokenizer_dir: Path | None = None,
        eos_id: int | None = 151643,
        is_matryoshka: bool = False,
    ) -> None:
        if flavour not in ("dynamo", "vllm"):
            raise ValueError(f"unknown flavour {flavour!r}")
        self.flavour: Flavour = flavour
        self.served_model = served_model
        self.dim = dim
        self.max_model_len = max_model_len
        self.tokenizer_dir = tokenizer_dir if tokenizer_dir is not None else default_tokenizer_dir()
        self.eos_id = eos_id
        self.is_matryoshka = is_matryoshka
        self.fault: Fault = "none"
        self.slow_seconds: float = 2.0
        self.received: list[Received] = []
        self._received_lock = threading.Lock()
        self._tokenizer = _load_tokenizer(self.tokenizer_dir / "tokenizer.json")
        self._vectors = _VectorModel(dim)
        self._vectors.warm(max_model_len)
        self._created = int(time.time())
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> FakeUpstream:
        if self._server is not None:
            raise RuntimeError("already started")
        self._stopping.clear()
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-upstream-{self.flavour}-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening, end the slow answers and close the kept-alive connections."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        with self._connections_lock:
            open_connections = list(self._connections)
        for conn in open_connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeUpstream:
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
        if self._server is None:
            raise RuntimeError("FakeUpstream is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        """Forget the requests it got, and go back to no fault (slow_seconds to 2.0)."""
        with self._received_lock:
            self.received.clear()
        self.fault = "none"
        self.slow_seconds = 2.0

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._connections_lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    # ---------------------------------------------------------------- the model

    def tokenize(self, text: str) -> list[int]:
        """What it counts for a text input: the tokenizer's ids, plus [eos_id] if eos_id is set."""
        ids = list(self._tokenizer.encode(text, add_special_tokens=False).ids)
        if self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def embed_ids(self, ids: list[int], dimensions: int | None = None) -> NDArray[np.float32]:
        """The float32 unit vector it returns for these token ids. With ``dimensions`` (the
        Matryoshka cut), the first ``dimensions`` components, re-normalised."""
        vector = self._vectors.embed(list(ids))
        if dimensions is not None:
            vector = _unit(vector[:dimensions])
        return vector

    # ---------------------------------------------------------------- answering

    def _answer(self, method: str, raw_path: str, headers: dict[str, str], body: bytes) -> _Reply:
        try:
            parsed: Any | None = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            parsed = None
        with self._received_lock:
            self.received.append(Received(raw_path, method, headers, body, parsed))

        fault = self.fault
        if fault == "slow":
            self._stopping.wait(self.slow_seconds)
        if fault == "http500":
            return self._internal_error()

        path = raw_path.split("?", 1)[0]
        if path == EMBEDDINGS_PATH:
            if method != "POST":
                return self._method_not_allowed()
            return self._embeddings(headers, body, worker_gone=fault == "worker_gone")
        if path == MODELS_PATH and method == "GET":
            return self._models(worker_gone=fault == "worker_gone")
        if path == HEALTH_PATH and method == "GET":
            return self._health(worker_gone=fault == "worker_gone")
        if path in (MODELS_PATH, HEALTH_PATH):
            return self._method_not_allowed()
        return self._not_found_path()

    # errors, each in the flavour's envelope

    def _flat(self, status: int, message: str, kind: str) -> _Reply:
        return _json_reply(status, {"message": message, "type": kind, "code": status})

    def _openai(self, status: int, message: str, kind: str, param: str | None = None) -> _Reply:
        error = {"message": message, "type": kind, "param": param, "code": status}
        return _json_reply(status, {"error": error})

    def _internal_error(self) -> _Reply:
        if self.flavour == "dynamo":
            return self._flat(500, "Internal server error", "Internal Server Error")
        return self._openai(500, "Internal server error", "InternalServerError")

    def _method_not_allowed(self) -> _Reply:
        if self.flavour == "dynamo":
            return _Reply(405, b"", None)
        return _json_reply(405, {"detail": "Method Not Allowed"})

    def _not_found_path(self) -> _Reply:
        if self.flavour == "dynamo":
            return self._flat(404, "Not Found", "Not Found")
        return _json_reply(404, {"detail": "Not Found"})

    def _bad_json(self, body: bytes, detail: str, at: int | None) -> _Reply:
        line, col = _line_col(body, at)
        if self.flavour == "dynamo":
            message = f"Failed to deserialize the JSON body into the target type: {detail}"
            return self._flat(400, f"{message} at line {line} column {col}", "Bad Request")
        offset = len(body) if at is None else at
        message = (
            "1 validation error:\n"
            f"  {{'type': 'json_invalid', 'loc': ('body', {offset}), 'msg': 'JSON decode error', "
            f"'input': {{}}, 'ctx': {{'error': {detail!r}}}}}"
        )
        return self._openai(400, message, "Bad Request", f"body.{offset}")

    def _bad_field(self, body: bytes, err: _ParseError) -> _Reply:
        if self.flavour == "dynamo":
            return self._bad_json(body, err.detail, err.at)
        return self._openai(400, f"1 validation error: {err.detail}", "Bad Request")

    def _worker_error(self, err: _WorkerError) -> _Reply:
        if self.flavour == "vllm":
            return self._openai(400, err.message, "BadRequestError", err.param)
        if err.kind == "value":
            return self._flat(400, "Invalid request", "Bad Request")
        return self._internal_error()

    # endpoints

    def _models(self, *, worker_gone: bool) -> _Reply:
        data: list[dict[str, Any]] = []
        if not worker_gone:
            if self.flavour == "dynamo":
                data.append(
                    {
                        "id": self.served_model,
                        "object": "model",
                        "created": self._created,
                        "owned_by": "nvidia",
                        "context_window": self.max_model_len,
                    }
                )
            else:
                data.append(
                    {
                        "id": self.served_model,
                        "object": "model",
                        "created": self._created,
                        "owned_by": "vllm",
                        "root": self.served_model,
                        "parent": None,
                        "max_model_len": self.max_model_len,
                        "permission": [
                            {
                                "id": "modelperm-fake",
                                "object": "model_permission",
                                "created": self._created,
                                "allow_create_engine": False,
                                "allow_sampling": True,
                                "allow_logprobs": True,
                                "allow_search_indices": False,
                                "allow_view": True,
                                "allow_fine_tuning": False,
                                "organization": "*",
                                "group": None,
                                "is_blocking": False,
                            }
                        ],
                    }
                )
        return _json_reply(200, {"object": "list", "data": data})

    def _health(self, *, worker_gone: bool) -> _Reply:
        if self.flavour == "vllm":
            return _Reply(200, b"", None)
        instances: list[dict[str, Any]] = []
        if not worker_gone:
            instances.append(
                {
                    "component": "backend",
                    "endpoint": "generate",
                    "namespace": "dynamo",
                    "instance_id": 1,
                    "transport": {"tcp": "127.0.0.1:0"},
                }
            )
        return _json_reply(
            200,
            {
                "status": "healthy",
                "endpoints": ["dyn://dynamo.backend.generate"] if not worker_gone else [],
                "instances": instances,
            },
        )

    def _embeddings(self, headers: dict[str, str], body: bytes, *, worker_gone: bool) -> _Reply:
        media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "application/json" and not (
            media.startswith("application/") and media.endswith("+json")
        ):
            if self.flavour == "dynamo":
                return self._flat(
                    415,
                    "Expected request with `Content-Type: application/json`",
                    "Unsupported Media Type",
                )
            return self._openai(
                400, "Unsupported Media Type: Only 'application/json' is allowed", "BadRequestError"
            )

        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            at_end = exc.pos >= len(body.rstrip())
            if self.flavour == "dynamo" and at_end:
                return self._bad_json(body, "EOF while parsing a value", None)
            return self._bad_json(body, exc.msg, None if at_end else exc.pos)

        if (
            self.flavour == "vllm"
            and isinstance(doc, dict)
            and doc.get("encoding_format") in ("bytes", "bytes_only")
        ):
            # vLLM accepts these and answers a binary body; the fake says plainly it does not
            message = f"fake_upstream does not reproduce encoding_format={doc['encoding_format']}"
            return self._openai(501, message, "NotImplementedError")
        try:
            request = _parse_request(doc, model_required=self.flavour == "dynamo")
        except _ParseError as err:
            return self._bad_field(body, err)

        model = request.model if request.model is not None else self.served_model
        if worker_gone:
            return _Reply(404, b"", None)
        if model != self.served_model:
            if self.flavour == "dynamo":
                return self._flat(404, "Model not found", "Not Found")
            return self._openai(404, f"The model `{model}` does not exist.", "NotFoundError")

        try:
            token_lists = self._prepare(request)
        except _WorkerError as err:
            return self._worker_error(err)

        vectors = [self.embed_ids(ids, request.dimensions) for ids in token_lists]
        if self.flavour == "vllm" and isinstance(doc, dict) and doc.get("use_activation") is False:
            vectors = [
                pooled(vector, ids) for vector, ids in zip(vectors, token_lists, strict=True)
            ]
        data: list[dict[str, Any]] = []
        for index, vector in enumerate(vectors):
            embedding: Any = (
                base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
                if request.encoding_format == "base64"
                else vector
            )
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        prompt_tokens = sum(len(ids) for ids in token_lists)
        if self.flavour == "dynamo":
            answer: dict[str, Any] = {
                "object": "list",
                "data": data,
                "model": self.served_model,
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
            }
        else:
            answer = {
                "id": f"embd-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": self.served_model,
                "data": data,
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "total_tokens": prompt_tokens,
                    "completion_tokens": 0,
                    "prompt_tokens_details": None,
                },
            }
        return _json_reply(200, answer)

    def _prepare(self, request: _Request) -> list[list[int]]:
        """The engine's share: tokenise, truncate, check the lengths and the dimensions."""
        limit = self.max_model_len
        if not request.prompts:
            raise _WorkerError("value", "You must pass at least one prompt", None)
        trunc = request.truncate_prompt_tokens
        if trunc is not None and trunc > limit:
            raise _WorkerError(
                "validation",
                f"truncate_prompt_tokens value ({trunc}) is greater than max_model_len "
                f"({limit}). Please, select a smaller truncation size.",
                None,
            )
        keep = limit if trunc == -1 else trunc
        token_lists: list[list[int]] = []
        for prompt in request.prompts:
            if isinstance(prompt, str):
                char_bound = CHARS_PER_TOKEN_BOUND * limit
                if keep is None and len(prompt) > char_bound:
                    raise _WorkerError(
                        "validation",
                        f"This model's maximum context length is {limit} tokens. However, your "
                        f"prompt contains {len(prompt)} characters (more than {char_bound} "
                        f"characters, which is the upper bound for {limit} input tokens). "
                        "Please reduce the length of the input prompt.",
                        "input_text",
                    )
                ids = self.tokenize(prompt)
            else:
                ids = list(prompt)
            if keep is not None and keep >= 0 and len(ids) > keep:
                ids = ids[-keep:] if keep > 0 else []
            if len(ids) > limit:
                raise _WorkerError(
                    "validation",
                    f"This model's maximum context length is {limit} tokens. However, your "
                    f"prompt contains at least {limit + 1} input tokens. Please reduce the "
                    "length of the input prompt.",
                    "input_tokens",
                )
            if not ids:
                raise _WorkerError("value", "The decoder prompt cannot be empty", None)
            token_lists.append(ids)

        dims = request.dimensions
        if dims is not None:
            if not self.is_matryoshka:
                raise _WorkerError(
                    "validation",
                    f"Model '{self.served_model}' does not support Matryoshka embeddings; "
                    f"dimensions must be unset (received dimensions={dims}).",
                    None,
                )
            if not 1 <= dims <= self.dim:
                raise _WorkerError(
                    "validation",
                    f"Model '{self.served_model}' only supports dimensions in range "
                    f"[1, {self.dim}], got {dims}.",
                    None,
                )
        return token_lists
