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


def load_contract(policy: GatewayPolicy, *, reuse: Contract | None = None) -> Contract:
    """Load every model's tokenizer once; models sharing a source share it.

    With ``reuse``, a model whose tokenizer source and special tokens are also in that
    contract gets its already-loaded tokenizer (loading one takes ~0.5 s and holds the
    interpreter lock throughout).
    """
    cache: dict[tuple[object, ...], ModelTokenizer] = {}
    if reuse is not None:
        for name, tokenizer in reuse.tokenizers.items():
            old = reuse.policy.models[name]
            cache[(old.tokenizer, old.special_tokens)] = tokenizer
    tokenizers: dict[str, ModelTokenizer] = {}
    for name, model in policy.models.items():
        key = (model.tokenizer, model.special_tokens)
        if key not in cache:
            cache[key] = load_tokenizer(model.tokenizer, model.special_tokens)
        tokenizers[name] = cache[key]
    return Contract(policy=policy, tokenizers=tokenizers)
