"""Two real legacy rerank servers, for the end-to-end tier of reranking.

FastAPI apps of the kind teams run before moving to vLLM: transformers on the CPU
serving the MiniLM cross-encoder that scripts/setup-real-upstream.sh makes (its
``RERANKER_DIR``, the one vLLM serves as ``minilm-reranker``), in one of two dialects
(``--dialect``).

What is computed, the same way in both: each (query, text) pair is tokenized as a
pair (``[CLS] query [SEP] text [SEP]``, token types 0 then 1) and run through
``BertForSequenceClassification`` in float32; its one logit is the raw score, and
``sigmoid(logit)`` (float32) the relevance score. This is exactly what vLLM computes
for the same pair (docs/upstreams.md, "Reranking"), so its raw logits equal these.
A cut, where one is made, is the tokenizer's own pair truncation (``truncation=True``,
longest first) to 256 tokens, the length vLLM serves; a right cut is also what vLLM's
``truncate_prompt_tokens`` makes.

``tei`` (a Text Embeddings Inference style server), ``POST /rerank``:

- body ``{query, texts, raw_scores=false, return_text=false, truncate=false,
  truncation_direction="Right"}`` (``"Left"`` cuts from the start: the tokenizer's
  ``truncation_side``); answer ``[{"index", "score", "text"?}]``, best first (a
  stable sort: equal scores keep their order), the logit when ``raw_scores``, else
  its sigmoid; ``text`` only with ``return_text``;
- a pair over 256 tokens is cut with ``truncate: true``, else the request is a 413;
- errors are ``{"error": "...", "error_type": "Validation"}``: 413 for an over-long
  pair, 422 for an empty ``texts`` and for any body pydantic (lax mode) refuses,
  malformed JSON included.

``cohere`` (Cohere's v1 rerank), ``POST /v1/rerank``:

- body ``{model?, query, documents: [str | {"text"}], top_n?, return_documents=false}``;
  answer ``{"id": <uuid4>, "results": [{"index", "relevance_score", "document"?:
  {"text"}}], "meta": {"api_version": {"version": "1"}}}``, best first, the first
  ``top_n``; ``relevance_score`` is the sigmoid; ``document`` only with
  ``return_documents``;
- a pair over 256 tokens is always cut from the right;
- FastAPI's own 422 ``{"detail": [...]}`` for what pydantic refuses (``documents``
  empty, ``top_n`` below 1, malformed JSON); a ``model`` other than
  ``minilm-reranker`` is a 404 ``{"detail": "..."}``.

The test's choices, not computed: the routes, field names and defaults above, the
limit of 256 tokens, the messages, the statuses (413 and 422 as TEI answers them),
the served name, ``top_n`` at least 1, the uuid4 ``id`` and the ``meta`` block;
unknown fields are dropped (``max_chunks_per_doc`` among them). Both answer
``GET /health``.

Run it with the vLLM environment's Python (torch, transformers, fastapi, uvicorn):
``python tests/e2e/legacy_rerank_app.py --model-dir DIR --port N --dialect tei``.
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any, Literal

import torch
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from transformers import AutoModelForSequenceClassification, AutoTokenizer

SERVED_MODEL = "minilm-reranker"
MAX_TOKENS = 256


class TeiRerankRequest(BaseModel):
    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False
    truncation_direction: Literal["Right", "Left"] = "Right"


class CohereDocument(BaseModel):
    text: str


class CohereRerankRequest(BaseModel):
    model: str | None = None
    query: str
    documents: list[str | CohereDocument] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False


class Reranker:
    """The cross-encoder: raw logits of (query, text) pairs, in float32."""

    def __init__(self, model_dir: str) -> None:
        torch.set_num_threads(1)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForSequenceClassification.from_pretrained(
            model_dir, dtype=torch.float32
        ).eval()

    def pair_tokens(self, query: str, text: str) -> int:
        return len(self.tokenizer(query, text)["input_ids"])

    def logits(self, query: str, texts: list[str], side: str = "right") -> torch.Tensor:
        """One logit per text; pairs longer than 256 tokens are cut on ``side``."""
        self.tokenizer.truncation_side = side
        try:
            batch = self.tokenizer(
                [query] * len(texts),
                texts,
                truncation=True,
                max_length=MAX_TOKENS,
                padding=True,
                return_tensors="pt",
            )
        finally:
            self.tokenizer.truncation_side = "right"
        with torch.inference_mode():
            return self.model(**batch).logits[:, 0].float()


def build_app(model_dir: str, dialect: str = "tei") -> FastAPI:
    reranker = Reranker(model_dir)
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    if dialect == "tei":

        @app.exception_handler(RequestValidationError)
        async def tei_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
            first = exc.errors()[0] if exc.errors() else {}
            if first.get("type") == "json_invalid":
                return tei_error(422, "Input validation error: the body is not valid JSON")
            where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
            return tei_error(422, f"Input validation error: {where}: {first.get('msg')}")

        @app.post("/rerank", response_model=None)
        def tei_rerank(request: TeiRerankRequest) -> list[dict[str, Any]] | JSONResponse:
            if not request.texts:
                return tei_error(422, "Input validation error: `texts` cannot be empty")
            if not request.truncate:
                for text in request.texts:
                    tokens = reranker.pair_tokens(request.query, text)
                    if tokens > MAX_TOKENS:
                        return tei_error(
                            413,
                            f"Input validation error: `inputs` must have less than "
                            f"{MAX_TOKENS} tokens. Given: {tokens}",
                        )
            side = request.truncation_direction.lower()
            logits = reranker.logits(request.query, request.texts, side)
            scores = logits if request.raw_scores else torch.sigmoid(logits)
            ranked = sorted(range(len(request.texts)), key=lambda i: -float(scores[i]))
            results: list[dict[str, Any]] = []
            for i in ranked:
                result: dict[str, Any] = {"index": i, "score": float(scores[i])}
                if request.return_text:
                    result["text"] = request.texts[i]
                results.append(result)
            return results

    else:

        @app.post("/v1/rerank")
        def cohere_rerank(request: CohereRerankRequest) -> dict[str, Any]:
            if request.model is not None and request.model != SERVED_MODEL:
                raise HTTPException(404, f"model '{request.model}' not found")
            texts = [d if isinstance(d, str) else d.text for d in request.documents]
            scores = torch.sigmoid(reranker.logits(request.query, texts))
            ranked = sorted(range(len(texts)), key=lambda i: -float(scores[i]))
            if request.top_n is not None:
                ranked = ranked[: request.top_n]
            results: list[dict[str, Any]] = []
            for i in ranked:
                result: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
                if request.return_documents:
                    result["document"] = {"text": texts[i]}
                results.append(result)
            return {
                "id": str(uuid.uuid4()),
                "results": results,
                "meta": {"api_version": {"version": "1"}},
            }

    return app


def tei_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "error_type": "Validation"}, status_code=status)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dialect", choices=("tei", "cohere"), default="tei")
    args = parser.parse_args()
    app = build_app(args.model_dir, args.dialect)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
