"""Stand-ins for reranking, for the fast tier (the end-to-end tier runs a real vLLM
serving a real cross-encoder, tests/e2e/): a rerank upstream and a legacy rerank
server sharing one made-up scorer, so the gateway in front of the upstream is at
parity with the legacy server exactly when it translates dialects, scores, order,
top_n and documents as the legacy server did.

The scorer (not a measurement): a (query, document) pair's logit is a float32 from
the words they share and a hash of the pair, so documents rank apart and ties are rare.

Measured behaviour the upstream reproduces (docs/upstreams.md, "Reranking"):

- ``vllm``: POST ``/rerank`` ``{model, query, documents, top_n?, use_activation?,
  truncate_prompt_tokens?}`` answers ``{id, model, usage, results: [{index,
  document: {text}, relevance_score}]}`` best first, the document text always there;
  ``relevance_score`` the sigmoid of the logit, the logit itself with
  ``use_activation: false``; a pair over ``max_tokens`` a 400 unless
  ``truncate_prompt_tokens`` is sent; an unknown model a 404; errors as
  ``{"error": {message, type, param, code}}``.
- ``dynamo``: POST ``/v1/rerank`` answers a bare array ``[{score, index}]`` (the
  sigmoid), as Dynamo's SGLang backend's source shapes it (no SGLang runs here).

The legacy server speaks TEI (POST ``/rerank``) or Cohere (v1 at POST ``/v1/rerank``,
and with ``cohere_v2`` also v2 at ``/v2/rerank``: a model named, documents as strings,
never returned), as docs/rerank.md describes them; its errors are TEI's ``{error,
error_type}`` or FastAPI's ``{"detail": ...}``; with ``any_model`` a Cohere server
answers any model name as its own. A pair over ``max_tokens`` is cut (Cohere; TEI with
``truncate: true``: the document's words after the budget dropped) or refused (TEI
without it: 413). Every request body it receives is kept (``received``).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import socket
import threading
import uuid
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import orjson
import tokenizers
from tokenizers import models, pre_tokenizers, processors

from testing_support.beir_sample import WORDS


def write_word_tokenizer(folder: Path, words: Sequence[str] = WORDS) -> Path:
    """The made-up model's tokenizer into ``folder``: a token a word of ``words`` (any
    other word [UNK]), [CLS] a [SEP] b [SEP] for a pair; returns ``folder``."""
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def logit(query: str, document: str) -> float:
    """The made-up cross-encoder's raw score (a float32)."""
    q, d = set(query.lower().split()), set(document.lower().split())
    shared = len(q & d) / max(len(q), 1)
    digest = hashlib.blake2b(f"{query}\0{document}".encode(), digest_size=4).digest()
    noise = int.from_bytes(digest, "little") / 2**32 - 0.5
    return float(np.float32(4.0 * shared - 2.0 + noise))


def sigmoid(x: float) -> float:
    return float(np.float32(1.0 / (1.0 + math.exp(-x))))


def pair_tokens(query: str, document: str) -> int:
    """Tokens of a pair for the made-up model: a word each, and [CLS] [SEP] [SEP]."""
    return len(query.split()) + len(document.split()) + 3


def cut_document(query: str, document: str, max_tokens: int) -> str:
    budget = max(max_tokens - 3 - len(query.split()), 0)
    return " ".join(document.split()[:budget])


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: _Base


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """No access log."""

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        owner = self.server.owner
        with owner.lock:
            owner.received.append((self.path, body))
        status, doc = owner.answer(self.path, body)
        payload = orjson.dumps(doc)
        self.send_response_only(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        payload = orjson.dumps(self.server.owner.get(self.path))
        self.send_response_only(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class _Base:
    """A context manager serving on 127.0.0.1 (a free port)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()
        self._server: _Server | None = None

    def answer(self, path: str, body: bytes) -> tuple[int, Any]:
        raise NotImplementedError

    def get(self, path: str) -> Any:
        return {"status": "ok"}

    def __enter__(self) -> Any:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.owner = self
        self._server = server
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            with contextlib.suppress(OSError):
                server.socket.shutdown(socket.SHUT_RDWR)
            server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def paths(self) -> list[str]:
        with self.lock:
            return [path for path, _ in self.received]


class FakeRerankUpstream(_Base):
    def __init__(self, *, kind: str = "vllm", served_model: str = "reranker", max_tokens: int = 64):
        super().__init__()
        self.kind = kind
        self.served_model = served_model
        self.max_tokens = max_tokens

    def get(self, path: str) -> Any:
        """/v1/models as vLLM lists a model (its limit included)."""
        model = {"id": self.served_model, "object": "model", "owned_by": "vllm"}
        return {"object": "list", "data": [{**model, "max_model_len": self.max_tokens}]}

    def answer(self, path: str, body: bytes) -> tuple[int, Any]:
        expected = "/rerank" if self.kind == "vllm" else "/v1/rerank"
        if path.split("?", 1)[0] != expected:
            return 404, {
                "error": {
                    "message": "Not Found",
                    "type": "NotFoundError",
                    "param": None,
                    "code": 404,
                }
            }
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return 400, _openai_error("Invalid JSON")
        query, documents = doc.get("query"), doc.get("documents")
        if doc.get("model") != self.served_model:
            return 404, _openai_error(f"The model `{doc.get('model')}` does not exist.")
        if not isinstance(query, str) or not isinstance(documents, list) or not documents:
            return 400, _openai_error("query and documents are required")
        truncate = doc.get("truncate_prompt_tokens")
        texts = []
        for document in documents:
            text = document
            if pair_tokens(query, text) > self.max_tokens:
                if truncate is None:
                    return 400, _openai_error(
                        f"This model's maximum context length is {self.max_tokens} tokens."
                    )
                text = cut_document(query, text, truncate)
            texts.append(text)
        logits = [logit(query, t) for t in texts]
        if self.kind == "dynamo":
            return 200, [{"index": i, "score": sigmoid(x)} for i, x in enumerate(logits)]
        raw = doc.get("use_activation") is False
        scores = [x if raw else sigmoid(x) for x in logits]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        tokens = sum(pair_tokens(query, t) for t in texts)
        results = [
            {"index": i, "document": {"text": documents[i]}, "relevance_score": scores[i]}
            for i in order
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return 200, {
            "id": f"rerank-{uuid.uuid4().hex}",
            "model": self.served_model,
            "usage": usage,
            "results": results,
        }


def _openai_error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}


class FakeLegacyRerank(_Base):
    """The legacy rerank server, in the TEI or Cohere v1 dialect."""

    def __init__(
        self,
        *,
        dialect: str = "tei",
        served_model: str = "reranker",
        max_tokens: int = 64,
        cohere_v2: bool = False,
        any_model: bool = False,
    ):
        super().__init__()
        self.dialect = dialect
        self.served_model = served_model
        self.max_tokens = max_tokens
        self.cohere_v2 = cohere_v2
        self.any_model = any_model

    def answer(self, path: str, body: bytes) -> tuple[int, Any]:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return self._invalid("json_invalid", ["body", 0], "JSON decode error")
        if not isinstance(doc, dict):
            return self._invalid("model_attributes_type", ["body"], "Input should be an object")
        if self.dialect == "tei":
            if path != "/rerank":
                return 404, {"error": "Not Found", "error_type": "Validation"}
            return self._tei(doc)
        if path == "/v2/rerank" and self.cohere_v2:
            return self._cohere(doc, version="2")
        if path != "/v1/rerank":
            return 404, {"detail": "Not Found"}
        return self._cohere(doc)

    def _invalid(self, kind: str, loc: list[Any], msg: str) -> tuple[int, Any]:
        if self.dialect == "tei":
            return 422, {"error": msg, "error_type": "Validation"}
        return 422, {"detail": [{"type": kind, "loc": loc, "msg": msg, "input": None}]}

    def _tei(self, doc: dict[str, Any]) -> tuple[int, Any]:
        query, texts = doc.get("query"), doc.get("texts")
        if not isinstance(query, str) or not query:
            return self._invalid("string_type", ["body", "query"], "query must be a string")
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            return self._invalid(
                "list_type", ["body", "texts"], "texts must be a non-empty list of strings"
            )
        truncate = doc.get("truncate") is True
        cut = []
        for original in texts:
            text = original
            if pair_tokens(query, text) > self.max_tokens:
                if not truncate:
                    return 413, {
                        "error": f"Input validation error: inputs must have less than {self.max_tokens} tokens",
                        "error_type": "Validation",
                    }
                text = cut_document(query, text, self.max_tokens)
            cut.append(text)
        logits = [logit(query, t) for t in cut]
        raw = doc.get("raw_scores") is True
        scores = [x if raw else sigmoid(x) for x in logits]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        with_text = doc.get("return_text") is True
        return 200, [
            {"index": i, "score": scores[i], **({"text": texts[i]} if with_text else {})}
            for i in order
        ]

    def _cohere(self, doc: dict[str, Any], version: str = "1") -> tuple[int, Any]:
        if version == "2" and "model" not in doc:
            return self._invalid("missing", ["body", "model"], "Field required")
        model = doc.get("model", self.served_model)
        if model != self.served_model and not self.any_model:
            return 404, {"detail": f"Model '{model}' not found"}
        query, documents = doc.get("query"), doc.get("documents")
        if not isinstance(query, str) or not query:
            return self._invalid("string_type", ["body", "query"], "Input should be a valid string")
        if not isinstance(documents, list) or not documents:
            return self._invalid(
                "too_short", ["body", "documents"], "List should have at least 1 item"
            )
        objects = version == "1"
        texts = [d.get("text") if objects and isinstance(d, dict) else d for d in documents]
        if not all(isinstance(t, str) for t in texts):
            return self._invalid(
                "string_type", ["body", "documents"], "Input should be a valid string"
            )
        top_n = doc.get("top_n")
        if top_n is not None and (
            not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1
        ):
            return self._invalid("greater_than_equal", ["body", "top_n"], "Input should be >= 1")
        logits = [logit(query, cut_document(query, t, self.max_tokens)) for t in texts]
        scores = [sigmoid(x) for x in logits]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[: top_n or len(scores)]
        with_docs = doc.get("return_documents") is True and version == "1"
        results = [
            {
                "index": i,
                "relevance_score": scores[i],
                **({"document": {"text": texts[i]}} if with_docs else {}),
            }
            for i in order
        ]
        return 200, {
            "id": str(uuid.uuid4()),
            "results": results,
            "meta": {"api_version": {"version": version}},
        }
