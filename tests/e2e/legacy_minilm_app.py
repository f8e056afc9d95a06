"""A real legacy embedding server, for the end-to-end tier of `extproc learn`.

A FastAPI app of the kind teams wrote before Dynamo: transformers on the CPU serving
all-MiniLM-L6-v2 (mean pooling, L2-normalised, as its sentence-transformers config
says), with an E5-style contract a person would recognise and write as a policy:

- ``input_type: "query"`` prepends ``"query: "``; ``"passage"`` or ``"document"``
  prepends ``"passage: "``; no field embeds the text as sent; ``instruction`` alone
  means a query (E5 has no task slot: its text is not used); any other type is a 422;
- every input is cut to 128 tokens by the tokenizer (``truncation=True``), so
  ``[SEP]`` ends every input;
- ``dimensions`` 32..384: the first components, re-normalised;
- ``encoding_format`` is accepted and ignored: float arrays always;
- request fields validated by pydantic in its default (lax) mode; FastAPI's 422s;
  an unknown ``model`` is a 404.

Run it with the vLLM environment's Python (torch, transformers, fastapi, uvicorn):
``python tests/e2e/legacy_minilm_app.py --model-dir DIR --port N``.
"""

from __future__ import annotations

import argparse
from typing import Any, Literal

import torch
import uvicorn
from fastapi import FastAPI, HTTPException
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


def build_app(model_dir: str) -> FastAPI:
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/embeddings")
    def embeddings(request: EmbeddingsRequest) -> dict[str, Any]:
        if request.model != SERVED_MODEL:
            raise HTTPException(404, f"Model '{request.model}' not found")
        texts = [request.input] if isinstance(request.input, str) else request.input
        role = request.input_type or ("query" if request.instruction is not None else None)
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
            vectors = torch.nn.functional.normalize(vectors[:, : request.dimensions], dim=-1)
        tokens = int(batch["attention_mask"].sum())
        data = [
            {"object": "embedding", "index": i, "embedding": v.tolist()}
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return {"object": "list", "data": data, "model": SERVED_MODEL, "usage": usage}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(build_app(args.model_dir), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
