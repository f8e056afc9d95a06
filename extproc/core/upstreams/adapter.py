"""The interface every upstream adapter implements, and what an upstream can do itself.

An adapter holds everything that differs between upstream kinds: the encoding the
gateway asks for when it must read the vectors, how success and error bodies are
read, and which parts of the contract the upstream can apply itself. It imports
nothing from the policy or the plan, so both can name adapters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from extproc.core.embeddings_body import EmbeddingsBody
from extproc.core.upstream_errors import UpstreamError

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
    """One upstream kind (a policy's ``upstream.kind``)."""

    @property
    def name(self) -> str:
        """The kind's name in policy files and in the response plan."""
        ...

    @property
    def summary(self) -> str:
        """One line for people: what this adapter talks to."""
        ...

    @property
    def defaults(self) -> Capabilities:
        """What every deployment of this kind does itself (a policy may declare more)."""
        ...

    @property
    def vectors_encoding(self) -> VectorsEncoding:
        """``encoding_format`` the gateway asks for when it rewrites the vectors (base64
        wherever the upstream writes it: decoding it beats parsing float JSON)."""
        ...

    def parse_success(self, body: bytes, *, input_count: int, dimensions: int) -> EmbeddingsBody:
        """A 2xx body checked against what was asked; BadVectorsError otherwise."""
        ...

    def parse_error(self, status: int, body: bytes) -> UpstreamError:
        """What a non-2xx answer says, in words a client or an operator can use."""
        ...
