"""NVIDIA Dynamo 1.6.x frontend in front of a vLLM embedding worker.

What it is asked: OpenAI's shape, the interface's writer. Its frontend takes
``dimensions`` only as a JSON unsigned integer and ``encoding_format`` only as
``float`` or ``base64``: the writer sends integers whatever the client's spelling,
and the gateway never asks for another encoding.

What it answers (docs/upstreams.md): OpenAI-shaped success bodies (no ``id`` or
``created``; ``usage`` has ``prompt_tokens`` and ``total_tokens``); errors as a flat
``{"message", "type", "code"}``; every validation error raised in the worker
(context length, ``dimensions``, an out-of-range ``truncate_prompt_tokens``) as a
bare 500 whose reason is only in the worker's log; an empty 404 once no worker
serves the model. Valid ``truncate_prompt_tokens`` values reach the worker and are
applied; ``dimensions`` works only when the worker's model was started Matryoshka.

Reranking: Dynamo 1.6's ``/v1/rerank`` (its SGLang backend, cross-encoders only) is
asked ``{model, query, documents, return_documents}`` and answers a bare JSON array
``[{score, index, document?}]``. It has no switch for the activation and no cut:
its scores are read as the sigmoid (the cross-encoder's usual head), turned back
into logits where a raw score is wanted.
"""

from __future__ import annotations

from typing import ClassVar

import orjson

from extproc.core.upstream_errors import UpstreamError, parse_upstream_error
from extproc.core.upstreams.adapter import (
    Capabilities,
    RerankAsk,
    UpstreamAdapter,
    UpstreamScores,
    VectorsEncoding,
    read_json,
    scores_in_order,
)

GENERIC_500_MESSAGE = "Internal server error"


class DynamoAdapter(UpstreamAdapter):
    name = "dynamo"
    summary = "NVIDIA Dynamo 1.6.x frontend + vLLM embedding worker"
    defaults = Capabilities(truncate_prompt_tokens=True)
    vectors_encoding: ClassVar[VectorsEncoding] = "base64"
    raw_vectors: ClassVar[bool] = False  # no switch for it in its frontend
    rerank_path: ClassVar[str] = "/v1/rerank"
    rerank_answers_raw: ClassVar[bool] = False
    cuts_documents: ClassVar[bool] = False

    def parse_error(self, status: int, body: bytes) -> UpstreamError:
        error = parse_upstream_error(body)
        if status == 404 and error.message is None:
            return UpstreamError("empty answer: no Dynamo worker serves the model", shape="empty")
        if status == 500 and error.message == GENERIC_500_MESSAGE:
            return UpstreamError(
                f"{GENERIC_500_MESSAGE}; Dynamo writes the worker's reason only to its logs",
                shape="flat",
            )
        return error

    def write_rerank(self, ask: RerankAsk) -> bytes:
        # No activation switch and no cut; the documents are never wanted back.
        body = {"model": ask.model, "query": ask.query, "documents": list(ask.documents)}
        return orjson.dumps({**body, "return_documents": False})

    def read_scores(self, body: bytes, count: int) -> UpstreamScores:
        return UpstreamScores(scores_in_order(read_json(body), "score", count), False, None)


ADAPTER = DynamoAdapter()
