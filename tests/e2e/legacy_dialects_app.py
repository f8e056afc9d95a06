"""A real legacy embedding server speaking the embeddings dialects, for the end-to-end
tier of the gateway's dialects (tests/e2e/test_dialects_real.py).

A FastAPI app of the kind teams ran before vLLM: transformers on the CPU serving
all-MiniLM-L6-v2 as sentence-transformers does (mean pooling over the attention mask,
then L2-normalised; inputs cut to its 256 tokens, ``[CLS]`` and ``[SEP]`` included),
one model answering in several dialects at once, each as its own kind of server
answers:

Text Embeddings Inference (started with ``--auto-truncate``), ``POST /embed`` and
``POST /`` (where ``huggingface_hub``'s ``InferenceClient.feature_extraction``
posts):

- body ``{inputs: str | [str], normalize=true, truncate?, truncation_direction=
  "Right", prompt_name?, dimensions?}``; answer ``[[float, ...], ...]``, one row an
  input even for one string; ``normalize: false`` answers the mean-pooled vectors;
- ``truncate`` unset is the server's ``--auto-truncate`` (cut); ``true`` cuts on
  ``truncation_direction``'s side (``Left``/``Right``, either case); ``false`` refuses
  an input over 256 tokens;
- errors ``{"error", "error_type"}`` as TEI (router and tokenization) answers them:
  ``"Empty"`` 400 for no ``inputs`` or an empty string among them (TEI checks each
  input); ``"Validation"`` 413 for an over-long input and for a ``prompt_name`` (the
  model's sentence-transformers config has no prompts); ``"Validation"`` 422 for a
  ``dimensions`` other than 384 (it is not Matryoshka) and any body pydantic refuses
  (TEI's own JSON rejection is a 422 in plain text: a JSON body here).

Cohere embed, ``POST /v1/embed`` and ``POST /v2/embed``:

- body ``{texts, model (v1: optional), input_type?, embedding_types?, truncate=
  "END"}``, v2 also ``output_dimension?`` and ``max_tokens?``; answer ``{id, embeddings,
  texts, meta: {api_version: {version}, billed_units: {input_tokens}}, response_type}``:
  v1 without ``embedding_types`` a list of float rows (``embeddings_floats``), else
  (and v2 always, ``["float"]`` by default) an object by type (``embeddings_by_type``);
- ``input_type`` is checked and otherwise unused (MiniLM has no prompts);
  ``truncate``: ``NONE`` refuses an input over 256 tokens, ``START`` cuts its start,
  ``END`` its end; ``max_tokens`` cuts every input to that many tokens;
  ``output_dimension`` only 384;
- types: ``float``; ``int8`` ``round(127 * clip(x, -1, 1))``, ``uint8``
  ``round(127.5 * (clip(x, -1, 1) + 1))`` (the symmetric rule); ``ubinary``
  ``packbits(x > 0)`` (first component in the highest bit), ``binary`` those bytes
  less 128 (sentence-transformers' ``quantize_embeddings``); v2 also ``base64``, the
  little-endian float32 bytes;
- ``billed_units.input_tokens`` is the tokens embedded (after any cut), ``[CLS]`` and
  ``[SEP]`` included;
- errors ``{"message"}``: 400 for what it refuses (empty or missing ``texts``, an
  unknown type, a long input under ``NONE``, any body pydantic refuses), 404 for a
  model other than ``all-MiniLM-L6-v2``.

Ollama, ``POST /api/embed`` and ``POST /api/embeddings``, as Ollama's server answers:

- ``/api/embed`` ``{model, input: str | [str], truncate=true, dimensions?, options?,
  keep_alive?}`` answered ``{model, embeddings, total_duration, load_duration,
  prompt_eval_count}``: ``model`` as sent, L2-normalised rows, durations in
  nanoseconds, ``prompt_eval_count`` the tokens embedded; no input (``""`` or ``[]``)
  loads the model and answers ``{model, embeddings: []}`` (200), as Ollama does;
  ``truncate: false`` refuses an input over 256 tokens (400); ``dimensions`` cuts and
  re-normalises;
- ``/api/embeddings`` ``{model, prompt, options?, keep_alive?}`` answered
  ``{embedding}``: one text's mean-pooled vector, NOT normalised (Ollama's older
  route); an empty prompt answers ``{"embedding": []}``;
- errors ``{"error"}``: 400 (``model is required``, a body it cannot read, a long
  input refused), 404 ``model '<name>' not found``.

The test's choices, not computed: the served name, the messages, the limit of 256
tokens, Ollama's durations. Unknown fields are dropped. ``GET /health`` answers.
The quantisation here is written apart from the gateway's on purpose.

Run it with the vLLM environment's Python (torch, transformers, fastapi, uvicorn):
``python tests/e2e/legacy_dialects_app.py --model-dir DIR --port N``.
"""

from __future__ import annotations

import argparse
import base64
import time
import uuid
from typing import Any, Literal

import numpy as np
import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from transformers import AutoModel, AutoTokenizer

SERVED_MODEL = "all-MiniLM-L6-v2"
MAX_TOKENS = 256
NATIVE = 384
COHERE_INPUT_TYPES = ("search_document", "search_query", "classification", "clustering")
COHERE_V1_TYPES = ("float", "int8", "uint8", "binary", "ubinary")
COHERE_V2_TYPES = (*COHERE_V1_TYPES, "base64")


class DialectError(Exception):
    """An error answered in the dialect's body at ``status``."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(str(body))
        self.status, self.body = status, body


def tei_error(status: int, message: str, kind: str = "Validation") -> DialectError:
    return DialectError(status, {"error": message, "error_type": kind})


def cohere_error(status: int, message: str) -> DialectError:
    return DialectError(status, {"message": message})


def ollama_error(status: int, message: str) -> DialectError:
    return DialectError(status, {"error": message})


class TeiRequest(BaseModel):
    inputs: str | list[str]
    normalize: bool = True
    truncate: bool | None = None
    truncation_direction: Literal["Left", "Right", "left", "right"] = "Right"
    prompt_name: str | None = None
    dimensions: int | None = None


class CohereRequest(BaseModel):
    texts: list[str] | None = None
    model: str | None = None
    input_type: str | None = None
    embedding_types: list[str] | None = None
    truncate: Literal["NONE", "START", "END"] = "END"
    output_dimension: int | None = None
    max_tokens: int | None = None


class OllamaEmbedRequest(BaseModel):
    model: str = ""
    input: str | list[str] | None = None
    truncate: bool = True
    dimensions: int | None = None
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None


class OllamaEmbeddingsRequest(BaseModel):
    model: str = ""
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None


class Embedder:
    """MiniLM as sentence-transformers runs it: mean-pooled token states, float32."""

    def __init__(self, model_dir: str) -> None:
        torch.set_num_threads(1)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()

    def count(self, text: str) -> int:
        """The tokens of ``text`` uncut, ``[CLS]`` and ``[SEP]`` included."""
        return len(self.tokenizer(text)["input_ids"])

    def pooled(
        self, texts: list[str], *, limit: int = MAX_TOKENS, left: bool = False
    ) -> tuple[np.ndarray, int]:
        """The mean-pooled vectors of ``texts`` (each cut to ``limit`` tokens on the
        left or the right) and the tokens embedded."""
        self.tokenizer.truncation_side = "left" if left else "right"
        try:
            batch = self.tokenizer(
                texts, truncation=True, max_length=limit, padding=True, return_tensors="pt"
            )
        finally:
            self.tokenizer.truncation_side = "right"
        with torch.inference_mode():
            hidden = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return pooled.numpy().astype(np.float32), int(batch["attention_mask"].sum())


def normalised(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def quantised(vectors: np.ndarray, kind: str) -> list[Any]:
    """``vectors`` as Cohere's embedding type ``kind``."""
    if kind == "float":
        return [[float(x) for x in row] for row in vectors]
    if kind == "base64":
        return [base64.b64encode(row.astype("<f4").tobytes()).decode() for row in vectors]
    if kind in ("binary", "ubinary"):
        bits = np.packbits((vectors > 0).astype(np.uint8), axis=-1)
        if kind == "binary":
            return (bits.astype(np.int32) - 128).tolist()  # type: ignore[no-any-return]
        return bits.astype(np.int32).tolist()  # type: ignore[no-any-return]
    unit = np.clip(vectors.astype(np.float64), -1.0, 1.0)
    if kind == "int8":
        return np.round(unit * 127.0).astype(np.int32).tolist()  # type: ignore[no-any-return]
    return np.round((unit + 1.0) * 127.5).astype(np.int32).tolist()  # type: ignore[no-any-return]


def build_app(model_dir: str) -> FastAPI:
    embedder = Embedder(model_dir)
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.exception_handler(DialectError)
    def dialect_error(_: Request, exc: DialectError) -> JSONResponse:
        return JSONResponse(exc.body, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        path = request.url.path
        if path in ("/embed", "/"):
            error = tei_error(422, f"Input validation error: {message}")
        elif path.startswith("/api/"):
            error = ollama_error(400, message)
        else:
            error = cohere_error(400, f"invalid request: {message}")
        return JSONResponse(error.body, status_code=error.status)

    # --- Text Embeddings Inference -------------------------------------------------

    def tei_embed(request: TeiRequest) -> list[list[float]]:
        texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
        if not texts or any(t == "" for t in texts):
            raise tei_error(400, "`inputs` cannot be empty", "Empty")
        if request.prompt_name is not None:
            raise tei_error(
                413,
                f"`default-prompt-name` is set to `{request.prompt_name}` but no prompts were "
                "found in the Sentence Transformers configuration",
            )
        if request.dimensions is not None and request.dimensions != NATIVE:
            raise tei_error(422, "Input validation error: the model is not Matryoshka")
        if request.truncate is False:
            for text in texts:
                tokens = embedder.count(text)
                if tokens > MAX_TOKENS:
                    raise tei_error(
                        413,
                        f"Input validation error: `inputs` must have less than "
                        f"{MAX_TOKENS} tokens. Given: {tokens}",
                    )
        left = request.truncation_direction.lower() == "left"
        vectors, _ = embedder.pooled(texts, left=left)
        if request.normalize:
            vectors = normalised(vectors)
        return quantised(vectors, "float")

    @app.post("/embed")
    def tei(request: TeiRequest) -> list[list[float]]:
        return tei_embed(request)

    @app.post("/")
    def tei_root(request: TeiRequest) -> list[list[float]]:
        return tei_embed(request)

    # --- Cohere embed ----------------------------------------------------------------

    def cohere_embed(request: CohereRequest, version: str) -> dict[str, Any]:
        if version == "2" and request.model is None:
            raise cohere_error(400, "invalid request: model must be specified")
        if request.model is not None and request.model != SERVED_MODEL:
            raise cohere_error(
                404,
                f"model '{request.model}' not found, make sure the correct model ID was "
                "used and that you have access to the model.",
            )
        texts = request.texts or []
        if not texts:
            raise cohere_error(400, "invalid request: texts must not be empty")
        if request.input_type is not None and request.input_type not in COHERE_INPUT_TYPES:
            raise cohere_error(
                400,
                f"invalid request: input_type must be one of {', '.join(COHERE_INPUT_TYPES)}",
            )
        allowed = COHERE_V2_TYPES if version == "2" else COHERE_V1_TYPES
        asked = request.embedding_types
        kinds = list(dict.fromkeys(asked)) if asked is not None else []
        if asked is not None and not kinds:
            raise cohere_error(400, "invalid request: embedding_types must not be empty")
        for kind in kinds:
            if kind not in allowed:
                raise cohere_error(
                    400, f"invalid request: embedding type '{kind}' is not supported"
                )
        if version == "2" and not kinds:
            kinds = ["float"]
        if request.output_dimension is not None and request.output_dimension != NATIVE:
            raise cohere_error(
                400, f"invalid request: output_dimension must be {NATIVE} for this model"
            )
        limit = MAX_TOKENS
        if version == "2" and request.max_tokens is not None:
            if request.max_tokens < 1:
                raise cohere_error(400, "invalid request: max_tokens must be positive")
            limit = min(limit, request.max_tokens)
        if request.truncate == "NONE":
            for text in texts:
                tokens = embedder.count(text)
                if tokens > limit:
                    raise cohere_error(
                        400,
                        f"invalid request: too many tokens: the text has {tokens} tokens, "
                        f"the model takes at most {limit}; use truncate START or END",
                    )
        pooled, tokens = embedder.pooled(texts, limit=limit, left=request.truncate == "START")
        vectors = normalised(pooled)
        embeddings: Any
        if kinds:
            embeddings = {kind: quantised(vectors, kind) for kind in kinds}
            response_type = "embeddings_by_type"
        else:
            embeddings = quantised(vectors, "float")
            response_type = "embeddings_floats"
        return {
            "id": str(uuid.uuid4()),
            "embeddings": embeddings,
            "texts": texts,
            "meta": {
                "api_version": {"version": version},
                "billed_units": {"input_tokens": tokens},
            },
            "response_type": response_type,
        }

    @app.post("/v1/embed")
    def cohere_v1(request: CohereRequest) -> dict[str, Any]:
        return cohere_embed(request, "1")

    @app.post("/v2/embed")
    def cohere_v2(request: CohereRequest) -> dict[str, Any]:
        return cohere_embed(request, "2")

    # --- Ollama ----------------------------------------------------------------------

    def ollama_model(name: str) -> None:
        if not name:
            raise ollama_error(400, "model is required")
        if name != SERVED_MODEL:
            raise ollama_error(404, f"model '{name}' not found")

    @app.post("/api/embed")
    def ollama_embed(request: OllamaEmbedRequest) -> dict[str, Any]:
        started = time.perf_counter_ns()
        if isinstance(request.input, str):
            texts = [request.input] if request.input else []
        else:
            texts = list(request.input or [])
        ollama_model(request.model)
        loaded = time.perf_counter_ns()
        if not texts:
            return {"model": request.model, "embeddings": []}
        if not request.truncate:
            for text in texts:
                if embedder.count(text) > MAX_TOKENS:
                    raise ollama_error(400, "input length exceeds maximum context length")
        pooled, tokens = embedder.pooled(texts)
        vectors = normalised(pooled)
        if request.dimensions is not None:
            if not 0 < request.dimensions <= NATIVE:
                raise ollama_error(400, f"dimensions must be between 1 and {NATIVE}")
            vectors = normalised(vectors[:, : request.dimensions])
        return {
            "model": request.model,
            "embeddings": quantised(vectors, "float"),
            "total_duration": time.perf_counter_ns() - started,
            "load_duration": loaded - started,
            "prompt_eval_count": tokens,
        }

    @app.post("/api/embeddings")
    def ollama_embeddings(request: OllamaEmbeddingsRequest) -> dict[str, Any]:
        ollama_model(request.model)
        if not request.prompt:
            return {"embedding": []}
        pooled, _ = embedder.pooled([request.prompt])
        return {"embedding": quantised(pooled, "float")[0]}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--paths", default="", help="comma-separated: serve only these embeddings paths"
    )
    args = parser.parse_args()
    app = build_app(args.model_dir)
    if args.paths:  # a server of one dialect: the others' paths are its 404s
        keep = {*args.paths.split(","), "/health"}
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", "") in keep]
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
