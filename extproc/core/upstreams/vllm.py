"""vLLM's OpenAI-compatible server (``vllm serve``) running an embedding model.

What it is asked: OpenAI's shape, the interface's writer.

What it answers (docs/upstreams.md): OpenAI-shaped success bodies; errors as
``{"error": {"message", "type", "param", "code": <int>}}`` with a 400 for every
request it refuses (context length, ``dimensions``, ``truncate_prompt_tokens``) and
a 404 for a model it does not serve: the interface's default readers. It applies
``truncate_prompt_tokens``; ``dimensions`` only when the model was started
Matryoshka (``--hf-overrides '{"is_matryoshka": true}'`` or ``matryoshka_dimensions``).
"""

from __future__ import annotations

from typing import ClassVar

from extproc.core.upstreams.adapter import Capabilities, UpstreamAdapter, VectorsEncoding


class VllmAdapter(UpstreamAdapter):
    name = "vllm"
    summary = "vLLM OpenAI-compatible server (vllm serve)"
    defaults = Capabilities(truncate_prompt_tokens=True)
    vectors_encoding: ClassVar[VectorsEncoding] = "base64"


ADAPTER = VllmAdapter()
