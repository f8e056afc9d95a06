"""vLLM's OpenAI-compatible server (``vllm serve``) running an embedding model.

What it answers (docs/upstreams.md): OpenAI-shaped success bodies; errors as
``{"error": {"message", "type", "param", "code": <int>}}`` with a 400 for every
request it refuses (context length, ``dimensions``, ``truncate_prompt_tokens``) and
a 404 for a model it does not serve. ``truncate_prompt_tokens`` is applied;
``dimensions`` only when the model was started Matryoshka
(``--hf-overrides '{"is_matryoshka": true}'`` or ``matryoshka_dimensions``).
"""

from __future__ import annotations

from typing import Final

from extproc.core.embeddings_body import EmbeddingsBody, parse_embeddings_body
from extproc.core.upstream_errors import UpstreamError, parse_upstream_error
from extproc.core.upstreams.adapter import Capabilities, VectorsEncoding


class VllmAdapter:
    name: Final = "vllm"
    summary: Final = "vLLM OpenAI-compatible server (vllm serve)"
    defaults: Final = Capabilities(truncate_prompt_tokens=True)
    vectors_encoding: Final[VectorsEncoding] = "base64"

    def parse_success(self, body: bytes, *, input_count: int, dimensions: int) -> EmbeddingsBody:
        return parse_embeddings_body(body, input_count=input_count, dimensions=dimensions)

    def parse_error(self, status: int, body: bytes) -> UpstreamError:
        return parse_upstream_error(body)


ADAPTER = VllmAdapter()
