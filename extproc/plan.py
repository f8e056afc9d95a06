"""What the response phase must do, decided once while the request is rewritten."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from extproc.policy.model import UpstreamFlavour


class Encoding(enum.Enum):
    FLOAT = "float"
    BASE64 = "base64"


@dataclass(frozen=True)
class ResponsePlan:
    """The contract the client expects back, and what the upstream was asked for.

    ``dimensions`` is set only when the gateway emulates Matryoshka (cut and
    re-normalise); a request for the native size needs no work.
    """

    model: str
    input_count: int
    native_dimensions: int
    flavour: UpstreamFlavour
    client_encoding: Encoding
    upstream_encoding: Encoding
    dimensions: int | None = None

    @property
    def rewrites_vectors(self) -> bool:
        return self.dimensions is not None or self.client_encoding is not self.upstream_encoding


@dataclass(frozen=True)
class RequestStats:
    """Per-request facts for metrics: no request text, only counts."""

    inputs: int
    prompted: bool = False
    truncated_inputs: int = 0
    tokens_cut: int = 0
    dimensions_emulated: bool = False
    fields_stripped: int = 0
