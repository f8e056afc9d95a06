"""A success body as the legacy server wrote it, where the upstream's differs: its
keys, their order and its constants, with slots the gateway fills (pure; the
templates are :mod:`extproc.core.json_templates`').

The body's slots: ``{data}`` (one item per input, in input order), ``{model}`` (the
model's name as the client sent it), ``{prompt_tokens}`` and ``{total_tokens}``
(the upstream's usage), ``{id}`` and ``{created}`` (the upstream's, else a new id and
0: a value nobody reads but its type). An item's: ``{index}``, ``{embedding}`` (the
vector in the client's encoding).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from extproc.core.json_templates import Template, fill

BODY_SLOTS: Final = ("data", "model", "prompt_tokens", "total_tokens", "id", "created")
ITEM_SLOTS: Final = ("index", "embedding")


@dataclass(frozen=True)
class AnswerLayout:
    body: Template
    item: Template


def lay_out(
    layout: AnswerLayout,
    *,
    model: str,
    embeddings: Sequence[Any],
    upstream: dict[str, Any],
    prompt_tokens: int | None,
) -> Any:
    """The client's body: ``embeddings`` (each already in the client's encoding) in
    ``layout``, the rest from the ``upstream``'s parsed body."""
    usage = upstream.get("usage")
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    values = {
        "data": [fill(layout.item, {"index": i, "embedding": e}) for i, e in enumerate(embeddings)],
        "model": model,
        "prompt_tokens": prompt_tokens,
        "total_tokens": total if type(total) is int else prompt_tokens,
        "id": upstream.get("id")
        if isinstance(upstream.get("id"), str)
        else f"embd-{uuid.uuid4().hex}",
        "created": upstream.get("created") if type(upstream.get("created")) is int else 0,
    }
    return fill(layout.body, values)
