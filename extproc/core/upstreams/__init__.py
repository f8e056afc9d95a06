"""Upstream adapters: one module per upstream kind, found by name, for every task.

A policy names the upstream kind of each model and reranker (``upstream.kind``); a
plan carries the name from the request to the response. ``adapter`` holds the base
class (vLLM's shapes); ``dynamo`` and ``vllm`` are the kinds. Adding an upstream is
one module exporting ``ADAPTER`` (an :class:`UpstreamAdapter`), its line in
``ADAPTERS`` and its tests (docs/upstreams.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from extproc.core.registry import named, table
from extproc.core.upstreams import dynamo, vllm
from extproc.core.upstreams.adapter import (
    BadRerankAnswerError,
    Capabilities,
    RerankAsk,
    UpstreamAdapter,
    UpstreamAsk,
    UpstreamScores,
    VectorsEncoding,
)

ADAPTERS: Final[Mapping[str, UpstreamAdapter]] = table(dynamo.ADAPTER, vllm.ADAPTER)


def adapter_for(kind: str) -> UpstreamAdapter:
    return named(ADAPTERS, kind, "upstream kind")


__all__ = [
    "ADAPTERS",
    "BadRerankAnswerError",
    "Capabilities",
    "RerankAsk",
    "UpstreamAdapter",
    "UpstreamAsk",
    "UpstreamScores",
    "VectorsEncoding",
    "adapter_for",
]
