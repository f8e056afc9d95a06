"""The loaded contract: a policy plus a ready tokenizer for each of its models."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from extproc.core.policy.model import GatewayPolicy
from extproc.core.tokens import ModelTokenizer, load_tokenizer


@dataclass(frozen=True)
class Contract:
    policy: GatewayPolicy
    tokenizers: Mapping[str, ModelTokenizer]


def load_contract(policy: GatewayPolicy) -> Contract:
    """Load every model's tokenizer once; models sharing a source share it."""
    cache: dict[tuple[object, ...], ModelTokenizer] = {}
    tokenizers: dict[str, ModelTokenizer] = {}
    for name, model in policy.models.items():
        key = (model.tokenizer, model.special_tokens)
        if key not in cache:
            cache[key] = load_tokenizer(model.tokenizer, model.special_tokens)
        tokenizers[name] = cache[key]
    return Contract(policy=policy, tokenizers=tokenizers)
