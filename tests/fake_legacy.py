"""A fake of the LEGACY embedding server of the seed (Qwen3-Embedding-0.6B behind FastAPI).

Only for tests. It runs no model: its vectors come from ``testing_support/fake_upstream.py``'s
made-up model (a ``FakeUpstream`` that is never started is used as the tokenizer and
vector function), so for the same token ids it gives exactly the vectors the fake
Dynamo gives. The gateway in front of the fake Dynamo is therefore at parity with this
fake exactly when it feeds the upstream the token ids the legacy server fed its model.

Measured legacy behaviour it reproduces (seed, sections 3 and 4):

- POST /v1/embeddings ``{"model", "input": str | [str, ...]}`` answers 200
  ``{"object":"list","data":[{"object":"embedding","index":i,"embedding":[floats]}],
  "model":<served>,"usage":{"prompt_tokens":N,"total_tokens":N}}`` with L2 unit vectors.
- ``input_type: "query"`` or ``instruction: <task>`` applies the Qwen3 prompt
  ``Instruct: {task}\\nQuery:{text}`` (default task: "Given a web search query, retrieve
  relevant passages that answer the query"); ``usage.prompt_tokens`` counts the tokens
  after the prompt (28 for the seed's query instead of 9).
- Every input is cut to ``max_tokens`` (1,024): transformers' ``truncation=True,
  max_length=1024`` with Qwen3's post-processor, i.e. the first 1,023 tokens and then
  ``<|endoftext|>`` (151643). Nothing is ever rejected for length.
- ``dimensions`` d in 32..1024: the first d components, re-normalised.
- ``encoding_format`` is ignored: embeddings are always float arrays.
- One request at a time: inference runs under a global lock (seed, section 5), with an
  optional ``delay_seconds`` of simulated inference per request.

The constructor's parameters make other legacy servers, for `extproc learn`'s tests; each
is a choice of the test, never a measurement:

- prompts: the templates (``query_template``, ``document_template``, ``{instruction}``
  and ``{text}`` as in a policy file), which ``input_type`` values name each role, a
  template of its own for some of them (``alias_templates``), the role given to inputs
  with neither field (``untyped``), and what ``instruction`` does (``instruction``:
  ``"task"`` fills the template, ``"prompt"`` is the whole prompt, ``"ignored"`` as a
  request model without that field, ``"refused"`` as one that forbids extra fields);
- truncation: the token limit (``max_tokens``), the side cut (``cut_side``: ``"left"``
  keeps the end, as ``truncation_side="left"``), whether a cut input keeps its end token
  (``keep_end``; False: ``ids[:max_tokens]`` of the framed ids, so EOS is lost), or
  whether longer inputs are refused (``refuse_long``, raised by the handler);
- Matryoshka: ``min_dimensions`` up to ``max_dimensions`` (default ``dim``), or
  ``allowed_dimensions``, or ``min_dimensions=None`` for ``dim`` alone; whether ``dim``
  itself is accepted (``accepts_native``); whether a cut is re-normalised
  (``renormalise``; False: ``v[:d]`` as it is);
- encoding: whether ``encoding_format: "base64"`` is honoured (``honour_encoding``:
  base64 little-endian float32, as OpenAI answers); whether integers are read in
  pydantic's lax mode (``lax``: ``"256"`` and ``256.0``, read with pydantic itself) and
  whether a UTF-8 BOM before the body is taken (``bom``, default ``lax``: Python's json
  takes one from bytes, not from text); sizes given as a set are a ``Literal``, which
  lax mode reads as integers or integral floats (``64.0``), never strings;
- errors: the body's shape (``error_shape``: ``"fastapi"``, ``"openai"``, ``"flat"``,
  ``"detail_param"`` - ``{"detail": <text>, "param": <field>}``, a handler of its own -
  or ``"error_string"`` - ``{"error": <text>}``), for FastAPI which kinds its request
  model validates (a list ``detail``; ``validated``, the rest its handler raises as a
  text) and the status of each kind of mistake (``error_status``: ``malformed``,
  ``invalid``, ``dimensions``, ``instruction``, ``too_long``, ``unknown_model``,
  ``too_many_inputs``);
- the request: the field that carries the role (``role_field``: ``input_type``,
  ``prompt_name`` or ``task``), what an ``instruction`` with a document role does
  (``document_instruction``: ``"refused"``, ``"ignored"`` or ``"wins"``), whether any
  ``model`` name (or none) is its model (``any_model``), the most inputs a request may
  have (``max_batch``, refused as its request model's ``too_long`` list);
- texts before embedding (``preprocess``): ``"fold_newlines"``, ``"collapse"``,
  ``"strip"``, ``"nfc"``, ``"nfkc"`` or ``"lower"`` (lower-cased: what no policy says);
- other dialects (``dialects``): ``"tei"`` answers TEI's ``POST /embed`` and ``POST /``
  ``{inputs, prompt_name}`` with ``[[floats]]``, ``"ollama_embeddings"`` Ollama's older
  ``POST /api/embeddings`` ``{model, prompt}`` with ``{embedding}`` not normalised (the
  made-up model's pooled norm, as the fake vLLM's ``use_activation: false``), both by
  the embeddings handler above; errors ``{error, error_type}`` and ``{error}``; as TEI's
  router, no input or an empty one is 400 ``Empty``; as Ollama, no prompt is an empty
  ``embedding``;
- ``other_model``: vectors of another model of the same width (the made-up model's,
  turned by a fixed rotation).

The defaults are the measured behaviour above, with strict integers.

ASSUMED, never measured (the seed did not probe the legacy server's errors): FastAPI-like
answers. Validation errors are 422 ``{"detail": [{"type", "loc", "msg", "input"}]}``
(malformed JSON, a body that is not an object, a missing or mistyped ``input``,
``input: []``, ``dimensions`` not an integer in 32..1024, an ``input_type`` other than
query/document/passage, a non-string ``instruction``, ``instruction`` together with a
document ``input_type``); an unknown ``model`` is 404 ``{"detail": "Model '<name>' not
found"}``; an input refused for its length is 422 ``{"detail": "<text>"}``; a missing
``model`` means the served one; token-id input is not accepted (422). Other paths: 404
``{"detail": "Not Found"}``; wrong method: 405.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import socket
import sys
import threading
import time
import unicodedata
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal

import numpy as np
import orjson
from numpy.typing import NDArray
from pydantic import TypeAdapter, ValidationError

from testing_support.fake_upstream import FakeUpstream, default_tokenizer_dir, pooled

__all__ = ["DEFAULT_TASK", "FakeLegacy", "qwen3_query"]

EMBEDDINGS_PATH: Final = "/v1/embeddings"
# The other dialects' paths this fake can serve (``dialects``), by dialect.
_DIALECT_PATHS: Final = {"/embed": "tei", "/": "tei", "/api/embeddings": "ollama_embeddings"}
DEFAULT_TASK: Final = "Given a web search query, retrieve relevant passages that answer the query"
EOS_ID: Final = 151643
QUERY_TYPES: Final = frozenset({"query"})
DOCUMENT_TYPES: Final = frozenset({"document", "passage"})
QWEN3_QUERY_TEMPLATE: Final = "Instruct: {instruction}\nQuery:{text}"
_LAX_INT: Final = TypeAdapter(int)


def qwen3_query(text: str, task: str = DEFAULT_TASK) -> str:
    """The Qwen3-Embedding query prompt, as the legacy server built it."""
    return fill(QWEN3_QUERY_TEMPLATE, text, task)


def fill(template: str, text: str, instruction: str) -> str:
    """A policy-style template applied (never str.format: texts may hold braces)."""
    head, _, tail = template.partition("{text}")
    return head.replace("{instruction}", instruction) + text + tail


# The status of each kind of mistake, as FastAPI answers it by default.
FASTAPI_STATUS: Final = {
    "malformed": 422,
    "invalid": 422,
    "dimensions": 422,
    "instruction": 422,
    "too_long": 422,
    "unknown_model": 404,
    "too_many_inputs": 422,
}
# Kinds a request model validates (a list of errors); the rest a handler raises (text).
_VALIDATED: Final = frozenset({"malformed", "invalid", "dimensions", "instruction"})


class _InvalidError(Exception):
    """A FastAPI/pydantic validation error (422 unless the server says otherwise)."""

    def __init__(
        self, kind: str, loc: Sequence[str | int], msg: str, value: Any, cls: str = "invalid"
    ) -> None:
        super().__init__(msg)
        self.cls = cls
        self.item = {"type": kind, "loc": list(loc), "msg": msg, "input": value}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeLegacy

    def handle_error(self, request: Any, client_address: Any) -> None:
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
        """No access log."""

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        content_type = self.headers.get("content-type", "")
        try:
            status, doc = self.server.fake._answer(self.command, self.path, content_type, body)
            payload = orjson.dumps(doc)
        except Exception as exc:  # a bug in the fake: never pass for a server answer
            status, payload = 599, f"fake_legacy bug: {exc!r}".encode()
        self.send_response_only(status)
        self.send_header("date", self.date_time_string())
        self.send_header("server", "uvicorn")
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()


class FakeLegacy:
    """The fake legacy server; a context manager listening on 127.0.0.1 (free port)."""

    def __init__(
        self,
        *,
        served_model: str = "Qwen/Qwen3-Embedding-0.6B",
        tokenizer_dir: Path | None = None,
        dim: int = 1024,
        max_tokens: int = 1024,
        min_dimensions: int | None = 32,
        allowed_dimensions: Sequence[int] = (),
        default_task: str = DEFAULT_TASK,
        delay_seconds: float = 0.0,
        query_template: str = QWEN3_QUERY_TEMPLATE,
        document_template: str = "{text}",
        query_types: frozenset[str] = QUERY_TYPES,
        document_types: frozenset[str] = DOCUMENT_TYPES,
        keep_end: bool = True,
        refuse_long: bool = False,
        honour_encoding: bool = False,
        lax: bool = False,
        bom: bool | None = None,
        cut_side: str = "right",
        instruction: str = "task",
        untyped: str | None = None,
        alias_templates: Mapping[str, str] | None = None,
        max_dimensions: int | None = None,
        accepts_native: bool = True,
        renormalise: bool = True,
        error_shape: str = "fastapi",
        error_status: Mapping[str, int] | None = None,
        other_model: bool = False,
        validated: frozenset[str] | None = None,
        role_field: str = "input_type",
        document_instruction: str = "refused",
        any_model: bool = False,
        max_batch: int | None = None,
        preprocess: Sequence[str] = (),
        dialects: Sequence[str] = (),
    ) -> None:
        self.served_model = served_model
        self.dim = dim
        self.max_tokens = max_tokens
        self.min_dimensions = min_dimensions
        self.allowed_dimensions = frozenset(allowed_dimensions)
        self.default_task = default_task
        self.delay_seconds = delay_seconds
        self.query_template = query_template
        self.document_template = document_template
        self.query_types = query_types
        self.document_types = document_types
        self.keep_end = keep_end
        self.refuse_long = refuse_long
        self.honour_encoding = honour_encoding
        self.lax = lax
        self.bom = lax if bom is None else bom
        self.cut_side = cut_side
        self.instruction = instruction
        self.untyped = untyped
        self.alias_templates = dict(alias_templates or {})
        self.max_dimensions = dim if max_dimensions is None else max_dimensions
        self.accepts_native = accepts_native
        self.renormalise = renormalise
        self.error_shape = error_shape
        self.error_status = {**FASTAPI_STATUS, **(error_status or {})}
        self.validated = _VALIDATED if validated is None else validated
        self.role_field = role_field
        self.document_instruction = document_instruction
        self.any_model = any_model
        self.max_batch = max_batch
        self.preprocess = tuple(preprocess)
        self.dialects = frozenset(dialects)
        # Another model of the same width: the same geometry, turned by a fixed rotation,
        # so its vectors rank alike among themselves and match nobody else's.
        self._rotation: NDArray[np.float64] | None = None
        if other_model:
            random = np.random.default_rng(20261203).normal(size=(dim, dim))
            self._rotation = np.linalg.qr(random)[0]
        # the fake Dynamo's tokenizer and vector model; it is never started
        self._model = FakeUpstream(
            served_model=served_model,
            dim=dim,
            max_model_len=max_tokens,
            tokenizer_dir=tokenizer_dir if tokenizer_dir is not None else default_tokenizer_dir(),
            eos_id=EOS_ID,
        )
        self.received: list[bytes] = []
        self._received_lock = threading.Lock()
        self._inference_lock = threading.Lock()  # the legacy server's global lock
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeLegacy:
        if self._server is not None:
            raise RuntimeError("already started")
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-legacy-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
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

    def __enter__(self) -> FakeLegacy:
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
            raise RuntimeError("FakeLegacy is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._connections_lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    # ------------------------------------------------------------------ the model

    def tokenize(self, text: str) -> list[int]:
        """The ids the legacy model saw for a text: the tokenizer's ids plus EOS, cut to
        ``max_tokens`` when longer: the first ``max_tokens - 1`` ids plus EOS (the last
        ones with ``cut_side="left"``); ``keep_end=False``: ``ids[:max_tokens]``, EOS lost."""
        ids = self._model.tokenize(text)
        limit = self.max_tokens
        if len(ids) <= limit:
            return ids
        if self.cut_side == "left":
            return ids[-limit:] if not self.keep_end else ids[:-1][-(limit - 1) :] + [EOS_ID]
        return ids[: limit - 1] + [EOS_ID] if self.keep_end else ids[:limit]

    def prompt(self, text: str, input_type: str | None, instruction: str | None) -> str:
        text = self.prepare(text)
        if self.instruction == "ignored":
            instruction = None
        if instruction is not None and input_type in self.document_types:
            if self.document_instruction == "ignored":
                instruction = None
            elif self.document_instruction == "wins":
                input_type = None
        if input_type is None and instruction is None:
            input_type = self.untyped
        if instruction is not None or input_type in self.query_types:
            if instruction is not None and self.instruction == "prompt":
                return instruction + text
            task = instruction if instruction is not None else self.default_task
            template = self.alias_templates.get(input_type or "", self.query_template)
            return fill(template, text, task)
        if input_type in self.document_types:
            template = self.alias_templates.get(input_type or "", self.document_template)
            return fill(template, text, "")
        return text

    def prepare(self, text: str) -> str:
        """The text as this server embeds it (its ``preprocess``, in that order)."""
        for step in self.preprocess:
            if step == "fold_newlines":
                text = text.replace("\r\n", " ").replace("\r", " ").replace("\n", " ")
            elif step == "collapse":
                text = re.sub(r"\s+", " ", text)
            elif step == "strip":
                text = text.strip()
            elif step in ("nfc", "nfkc"):
                text = unicodedata.normalize(step.upper(), text)
            elif step == "lower":
                text = text.lower()
        return text

    def embed_text(
        self,
        text: str,
        *,
        input_type: str | None = None,
        instruction: str | None = None,
        dimensions: int | None = None,
    ) -> NDArray[np.float32]:
        """The vector this server answers for one input."""
        ids = self.tokenize(self.prompt(text, input_type, instruction))
        return self._embed(ids, dimensions)

    def _embed(self, ids: list[int], dimensions: int | None) -> NDArray[np.float32]:
        if self._rotation is None and (self.renormalise or dimensions is None):
            return self._model.embed_ids(ids, dimensions)
        native = self._model.embed_ids(ids)
        if self._rotation is not None:
            native = (self._rotation @ native).astype(np.float32)
        if dimensions is None:
            return native
        head = native[:dimensions].astype(np.float64)
        cut = head / np.linalg.norm(head) if self.renormalise else head
        return cut.astype(np.float32)

    # ------------------------------------------------------------------ answering

    def _answer(
        self, method: str, raw_path: str, content_type: str, body: bytes
    ) -> tuple[int, Any]:
        path = raw_path.split("?", 1)[0]
        if path == "/health":
            return (200, {"status": "ok"}) if method == "GET" else _method_not_allowed()
        if path == "/v1/models":
            if method != "GET":
                return _method_not_allowed()
            model = {"id": self.served_model, "object": "model", "owned_by": "legacy"}
            return 200, {"object": "list", "data": [model]}
        if path in _DIALECT_PATHS and _DIALECT_PATHS[path] in self.dialects:
            if method != "POST":
                return _method_not_allowed()
            return self._dialect(_DIALECT_PATHS[path], content_type, body)
        if path != EMBEDDINGS_PATH:
            return 404, {"detail": "Not Found"}
        if method != "POST":
            return _method_not_allowed()
        with self._received_lock:
            self.received.append(body)
        try:
            return self._embeddings(content_type, body)
        except _InvalidError as err:
            return self._error(err.cls, err.item)

    def _dialect(self, name: str, content_type: str, body: bytes) -> tuple[int, Any]:
        """TEI's ``/embed`` (and ``/``) or Ollama's older ``/api/embeddings``, answered by
        this server's own embeddings handler: its prompts, cuts and sizes."""
        with self._received_lock:
            self.received.append(body)
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            return (
                (422, {"error": "invalid JSON", "error_type": "Validation"})
                if (name == "tei")
                else (400, {"error": "invalid JSON"})
            )
        if name == "tei":
            inputs = doc.get("inputs")
            if inputs == "" or (isinstance(inputs, list) and (not inputs or "" in inputs)):
                return 400, {"error": "`inputs` cannot be empty", "error_type": "Empty"}
            ours = {"model": self.served_model, "input": inputs}
            if doc.get("prompt_name") is not None:
                ours[self.role_field] = doc["prompt_name"]
            if doc.get("dimensions") is not None:
                ours["dimensions"] = doc["dimensions"]
        else:
            if not doc.get("prompt"):  # Ollama loads the model and embeds nothing
                return 200, {"embedding": []}
            ours = {"model": doc.get("model"), "input": [doc.get("prompt")]}
        try:
            status, answer = self._embeddings(content_type, orjson.dumps(ours))
        except _InvalidError as err:
            status, answer = self.error_status[err.cls], {"message": str(err.item)}
        if status != 200:
            text = str(answer)
            if name == "tei":
                return status, {"error": text, "error_type": "Validation"}
            return status, {"error": text}
        rows = [item["embedding"] for item in answer["data"]]
        if name == "tei":
            return 200, rows
        ids = self.tokenize(self.prompt(str(doc.get("prompt")), None, None))
        raw = pooled(np.asarray(rows[0], dtype=np.float32), ids)
        return 200, {"embedding": [float(x) for x in raw]}

    def _error(self, cls: str, item: dict[str, Any] | str) -> tuple[int, Any]:
        """A mistake of kind ``cls`` in this server's dialect: ``item`` is a pydantic
        error (validation) or a handler's text."""
        status = self.error_status[cls]
        text = item if isinstance(item, str) else str(item["msg"])
        if self.error_shape == "openai":
            kind = "invalid_request_error"
            return status, {"error": {"message": text, "type": kind, "param": None, "code": None}}
        if self.error_shape == "flat":
            return status, {"message": text, "type": "Bad Request", "code": status}
        if self.error_shape == "detail_param":
            loc = [] if isinstance(item, str) else item["loc"]
            param = loc[1] if len(loc) > 1 and isinstance(loc[1], str) else None
            return status, {"detail": text, "param": param}
        if self.error_shape == "error_string":
            return status, {"error": text}
        if cls in self.validated and not isinstance(item, str):
            return status, {"detail": [item]}
        return status, {"detail": text}

    def _embeddings(self, content_type: str, body: bytes) -> tuple[int, Any]:
        if content_type.split(";", 1)[0].strip().lower() != "application/json":
            raise _InvalidError(
                "model_attributes_type",
                ["body"],
                "Input should be a valid dictionary or object to extract fields from",
                body.decode("utf-8", errors="replace")[:100],
            )
        try:
            # bytes: Python's json skips a UTF-8 BOM; text: a BOM is an error
            doc = json.loads(body if self.bom else body.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            pos = exc.pos if isinstance(exc, json.JSONDecodeError) else 0
            detail = exc.msg if isinstance(exc, json.JSONDecodeError) else "invalid UTF-8"
            item = _InvalidError("json_invalid", ["body", pos], "JSON decode error", {}).item
            item["ctx"] = {"error": detail}
            return self._error("malformed", item)
        if not isinstance(doc, dict):
            raise _InvalidError(
                "model_attributes_type",
                ["body"],
                "Input should be a valid dictionary or object to extract fields from",
                doc,
                "malformed",
            )
        texts = _texts(doc)
        if self.max_batch is not None and len(texts) > self.max_batch:
            raise _InvalidError(
                "too_long",
                ["body", "input"],
                f"List should have at most {self.max_batch} items after validation, "
                f"not {len(texts)}",
                doc["input"],
                "too_many_inputs",
            )
        model = _optional_str(doc, "model")
        input_type = _optional_str(doc, self.role_field)
        instruction = None
        if self.instruction == "refused" and "instruction" in doc:
            raise _InvalidError(
                "extra_forbidden",
                ["body", "instruction"],
                "Extra inputs are not permitted",
                doc["instruction"],
                "instruction",
            )
        if self.instruction != "ignored":
            instruction = _optional_str(doc, "instruction")
        accepted = self.query_types | self.document_types
        if input_type is not None and input_type not in accepted:
            raise _InvalidError(
                "literal_error",
                ["body", self.role_field],
                "Input should be " + " or ".join(repr(t) for t in sorted(accepted)),
                input_type,
            )
        refused = self.document_instruction == "refused"
        if instruction is not None and input_type in self.document_types and refused:
            raise _InvalidError(
                "value_error",
                ["body", "instruction"],
                "Value error, instruction is only for queries",
                instruction,
            )
        dimensions = self._dimensions(doc)
        if model is not None and model != self.served_model and not self.any_model:
            return self._error("unknown_model", f"Model '{model}' not found")

        with self._inference_lock:
            if self.delay_seconds > 0:
                time.sleep(self.delay_seconds)
            token_lists = [self.tokenize(self.prompt(t, input_type, instruction)) for t in texts]
            if self.refuse_long and any(
                len(self._model.tokenize(self.prompt(t, input_type, instruction))) > self.max_tokens
                for t in texts
            ):
                return self._error("too_long", f"Input is longer than {self.max_tokens} tokens")
            vectors = [self._embed(ids, dimensions) for ids in token_lists]
        tokens = sum(len(ids) for ids in token_lists)
        base64_asked = self.honour_encoding and doc.get("encoding_format") == "base64"
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
                if base64_asked
                else v.tolist(),
            }
            for i, v in enumerate(vectors)
        ]
        return 200, {
            "object": "list",
            "data": data,
            "model": self.served_model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def _dimensions(self, doc: dict[str, Any]) -> int | None:
        value = doc.get("dimensions")
        if value is None:
            return None
        where = ["body", "dimensions"]
        if self.lax and (self.min_dimensions is None or self.allowed_dimensions):
            # sizes as a set: a Literal, which lax mode reads as integers or integral floats
            sizes = (*self.allowed_dimensions, *((self.dim,) if self.accepts_native else ()))
            try:
                value = TypeAdapter(Literal[tuple(sorted(sizes))]).validate_python(value)
            except ValidationError:
                native = (self.dim,) if self.accepts_native else ()
                allowed = sorted({*self.allowed_dimensions, *native})
                raise _InvalidError(
                    "literal_error",
                    where,
                    "Input should be " + " or ".join(str(n) for n in allowed),
                    value,
                    "dimensions",
                ) from None
            return int(value)
        if self.lax:
            try:
                value = _LAX_INT.validate_python(value)
            except ValidationError:
                raise _InvalidError(
                    "int_parsing", where, "Input should be a valid integer", value, "dimensions"
                ) from None
        if not isinstance(value, int) or isinstance(value, bool):
            raise _InvalidError(
                "int_type", where, "Input should be a valid integer", value, "dimensions"
            )
        if value == self.dim and self.accepts_native:
            return value
        if self.min_dimensions is None or self.allowed_dimensions:
            if value not in self.allowed_dimensions:
                native = (self.dim,) if self.accepts_native else ()
                sizes = sorted({*self.allowed_dimensions, *native})
                raise _InvalidError(
                    "literal_error",
                    where,
                    "Input should be " + " or ".join(str(n) for n in sizes),
                    value,
                    "dimensions",
                )
            return value
        if value < self.min_dimensions:
            raise _InvalidError(
                "greater_than_equal",
                where,
                f"Input should be greater than or equal to {self.min_dimensions}",
                value,
                "dimensions",
            )
        if value > self.max_dimensions or value == self.dim:
            raise _InvalidError(
                "less_than_equal",
                where,
                f"Input should be less than or equal to {self.max_dimensions}",
                value,
                "dimensions",
            )
        return value


def _method_not_allowed() -> tuple[int, Any]:
    return 405, {"detail": "Method Not Allowed"}


def _optional_str(doc: dict[str, Any], name: str) -> str | None:
    value = doc.get(name)
    if value is not None and not isinstance(value, str):
        raise _InvalidError("string_type", ["body", name], "Input should be a valid string", value)
    return value


def _texts(doc: dict[str, Any]) -> list[str]:
    if "input" not in doc:
        raise _InvalidError("missing", ["body", "input"], "Field required", doc)
    raw = doc["input"]
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list):
        raise _InvalidError("list_type", ["body", "input"], "Input should be a valid list", raw)
    if not raw:
        raise _InvalidError(
            "too_short",
            ["body", "input"],
            "List should have at least 1 item after validation, not 0",
            raw,
        )
    for i, item in enumerate(raw):
        if not isinstance(item, str):
            raise _InvalidError(
                "string_type", ["body", "input", i], "Input should be a valid string", item
            )
    return list(raw)
