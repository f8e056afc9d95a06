"""A real legacy embedding server, for the end-to-end tier of `extproc learn`.

A FastAPI app of the kind teams wrote before Dynamo: transformers on the CPU serving
all-MiniLM-L6-v2 (mean pooling, L2-normalised, as its sentence-transformers config
says), with one of two contracts (``--contract``).

``e5`` (the default): an E5-style contract a person would recognise and write as a
policy:

- ``input_type: "query"`` prepends ``"query: "``; ``"passage"`` or ``"document"``
  prepends ``"passage: "``; no field embeds the text as sent; ``instruction`` alone
  means a query (E5 has no task slot: its text is not used); any other type is a 422;
- every input is cut to 128 tokens by the tokenizer (``truncation=True``), so
  ``[SEP]`` ends every input;
- ``dimensions`` 32..384: the first components, re-normalised;
- ``encoding_format`` is accepted and ignored: float arrays always;
- request fields validated by pydantic in its default (lax) mode; FastAPI's 422s;
  an unknown ``model`` is a 404.

``plain``: what a quicker-written server does, off the seed's contract in several ways
at once:

- its request model has no ``instruction`` field, and FastAPI drops unknown fields:
  ``instruction`` is ignored (the input embedded as its ``input_type`` says);
- ``encoding_format: "base64"`` is honoured, while pydantic's lax mode still takes
  ``64.0`` for its ``Literal`` sizes (not ``"64"``), and Python's JSON parser a UTF-8
  byte order mark;
- ``dimensions`` one of 64, 128, 256 (a ``Literal``): the native 384 is refused;
- a cut is the first components as they are (``v[:d]``), not re-normalised;
- the same E5 prompts and 128-token cut; FastAPI's 422s; an unknown ``model`` is a 404.

``handler``: a server whose own handler checks much of the request, as many do:

- its request model takes the role from ``prompt_name`` (sentence-transformers'
  spelling), any ``model`` name or none, and leaves ``dimensions`` and the batch to
  the handler; pydantic still validates the types (FastAPI's 422 list ``detail``);
- the handler answers ``dimensions`` outside 32..384 with FastAPI's ``HTTPException``
  (400, a text ``detail``), an empty ``input`` and more than 16 inputs with an error of
  its own (``{"detail": <text>, "param": <field>}``, 400 and 413);
- ``instruction`` with a document role is ignored; line breaks are folded to spaces
  before embedding; the same E5 prompts and 128-token cut, cuts re-normalised.

Run it with the vLLM environment's Python (torch, transformers, fastapi, uvicorn):
``python tests/e2e/legacy_minilm_app.py --model-dir DIR --port N``.
"""

from __future__ import annotations

import argparse
import base64
from typing import Any, Literal

import torch
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, model_validator
from transformers import AutoModel, AutoTokenizer

SERVED_MODEL = "all-MiniLM-L6-v2"
MAX_TOKENS = 128
NATIVE = 384
PROMPTS = {"query": "query: ", "passage": "passage: ", "document": "passage: "}


class EmbeddingsRequest(BaseModel):
    model: str = SERVED_MODEL
    input: str | list[str] = Field(min_length=1)
    input_type: Literal["query", "passage", "document"] | None = None
    instruction: str | None = None
    dimensions: int | None = Field(default=None, ge=32, le=NATIVE)
    encoding_format: Literal["float", "base64"] | None = None

    @model_validator(mode="after")
    def instruction_is_for_queries(self) -> EmbeddingsRequest:
        if self.instruction is not None and self.input_type in ("passage", "document"):
            raise ValueError("instruction is only for queries")
        return self


class PlainRequest(BaseModel):
    """The ``plain`` contract's request model: no ``instruction``, sizes as a set."""

    model: str = SERVED_MODEL
    input: str | list[str] = Field(min_length=1)
    input_type: Literal["query", "passage", "document"] | None = None
    dimensions: Literal[64, 128, 256] | None = None
    encoding_format: Literal["float", "base64"] | None = None


class HandlerRequest(BaseModel):
    """The ``handler`` contract's request model: the role in ``prompt_name``; sizes and
    the batch are the handler's to check."""

    model: str | None = None
    input: str | list[str]
    prompt_name: Literal["query", "passage", "document"] | None = None
    instruction: str | None = None
    dimensions: int | None = None
    encoding_format: Literal["float", "base64"] | None = None


class ProblemError(Exception):
    """An error the ``handler`` contract's own code answers."""

    def __init__(self, status: int, message: str, field: str) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


MAX_BATCH = 16


def build_app(model_dir: str, contract: str = "e5") -> FastAPI:
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.exception_handler(ProblemError)
    def problem(_: Request, exc: ProblemError) -> JSONResponse:
        return JSONResponse({"detail": exc.message, "param": exc.field}, status_code=exc.status)

    def embed(request: EmbeddingsRequest | PlainRequest | HandlerRequest) -> dict[str, Any]:
        texts = [request.input] if isinstance(request.input, str) else request.input
        instruction = getattr(request, "instruction", None)
        if isinstance(request, HandlerRequest):
            if not texts:
                raise ProblemError(400, "input must hold at least one text", "input")
            if len(texts) > MAX_BATCH:
                raise ProblemError(413, f"at most {MAX_BATCH} inputs per request", "input")
            dims = request.dimensions
            if dims is not None and not 32 <= dims <= NATIVE:
                raise HTTPException(400, f"dimensions must be between 32 and {NATIVE}")
            texts = [t.replace("\r\n", " ").replace("\n", " ") for t in texts]
            role_given = request.prompt_name
            if role_given in ("passage", "document"):
                instruction = None
        else:
            if request.model != SERVED_MODEL:
                raise HTTPException(404, f"Model '{request.model}' not found")
            role_given = request.input_type
        role = role_given or ("query" if instruction is not None else None)
        prefix = PROMPTS[role] if role else ""
        batch = tokenizer(
            [prefix + t for t in texts],
            truncation=True,
            max_length=MAX_TOKENS,
            padding=True,
            return_tensors="pt",
        )
        with torch.inference_mode():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        vectors = torch.nn.functional.normalize(pooled, dim=-1)
        if request.dimensions is not None:
            vectors = vectors[:, : request.dimensions]
            if contract in ("e5", "handler"):
                vectors = torch.nn.functional.normalize(vectors, dim=-1)
        tokens = int(batch["attention_mask"].sum())
        as_base64 = contract == "plain" and request.encoding_format == "base64"
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(v.numpy().astype("<f4").tobytes()).decode()
                if as_base64
                else v.tolist(),
            }
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return {"object": "list", "data": data, "model": SERVED_MODEL, "usage": usage}

    if contract == "plain":

        @app.post("/v1/embeddings")
        def plain_embeddings(request: PlainRequest) -> dict[str, Any]:
            return embed(request)

    elif contract == "handler":

        @app.post("/v1/embeddings")
        def handler_embeddings(request: HandlerRequest) -> dict[str, Any]:
            return embed(request)

    else:

        @app.post("/v1/embeddings")
        def embeddings(request: EmbeddingsRequest) -> dict[str, Any]:
            return embed(request)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--contract", choices=("e5", "plain", "handler"), default="e5")
    args = parser.parse_args()
    app = build_app(args.model_dir, args.contract)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
