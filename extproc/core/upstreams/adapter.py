"""The interface every upstream adapter implements, and what an upstream can do itself.

An adapter holds everything that differs between upstream kinds: the encoding the
gateway asks for when it must read the vectors, how success and error bodies are
read, and which parts of the contract the upstream can apply itself. It imports
nothing from the policy or the plan, so both can name adapters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from extproc.core.embeddings_body import EmbeddingsBody, parse_embeddings_body
from extproc.core.upstream_errors import UpstreamError, parse_upstream_error

VectorsEncoding = Literal["float", "base64"]


@dataclass(frozen=True)
class Capabilities:
    """Parts of the contract an upstream applies itself, so the gateway need not."""

    # Matryoshka `dimensions`: the upstream answers vectors cut to that size and
    # re-normalised. Depends on how the model was started, so a policy declares it.
    dimensions: bool = False
    # vLLM's `truncate_prompt_tokens`: the upstream keeps that many tokens of each input.
    truncate_prompt_tokens: bool = False


class UpstreamAdapter(Protocol):
    """One upstream kind (a policy's ``upstream.kind``). An adapter module subclasses
    this and sets the attributes; the methods read the OpenAI shapes unless the kind
    answers differently."""

    name: str  # the kind's name in policy files and in the response plan
    summary: str  # one line for people: what this adapter talks to
    defaults: Capabilities  # what every deployment does itself (a policy may declare more)
    # ``encoding_format`` the gateway asks for when it rewrites the vectors (base64
    # wherever the upstream writes it: decoding it beats parsing float JSON).
    vectors_encoding: VectorsEncoding

    def parse_success(self, body: bytes, *, input_count: int, dimensions: int) -> EmbeddingsBody:
        """A 2xx body checked against what was asked; BadVectorsError otherwise."""
        return parse_embeddings_body(body, input_count=input_count, dimensions=dimensions)

    def parse_error(self, status: int, body: bytes) -> UpstreamError:
        """What a non-2xx answer says, in words a client or an operator can use."""
        return parse_upstream_error(body)
