"""The loaded contract: a policy, a ready tokenizer for each of its models, and its
route table."""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from extproc.core.policy.errors import PolicyError
from extproc.core.policy.model import GatewayPolicy, ModelPolicy, SpecialTokens, TokenizerSource
from extproc.core.prompts import policy_prompts, prompt_budget_problem
from extproc.core.routes import Routes, routes_of
from extproc.core.tokens import ModelTokenizer, load_tokenizer


@dataclass(frozen=True)
class Contract:
    policy: GatewayPolicy
    tokenizers: Mapping[str, ModelTokenizer]
    # Per model (and per reranker, by RerankPolicy.key), what its tokenizer was loaded
    # from (tokenizer_key): a reload reuses it.
    tokenizer_keys: Mapping[str, Hashable] = field(default_factory=dict)

    @cached_property
    def routes(self) -> Routes:
        """Which endpoint serves each path (made once per contract)."""
        return routes_of(self.policy)


def tokenizer_key(source: TokenizerSource, special: SpecialTokens) -> Hashable:
    """What a loaded tokenizer stands for: its source and special tokens and, for a
    directory, the identity of its tokenizer.json (a file replaced in place is new).
    A Hugging Face id is taken as fixed for a given ``revision``."""
    file: tuple[int, int, int] | None = None
    if source.path is not None:
        try:
            st = os.stat(source.path / "tokenizer.json")
            file = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            file = None  # load_tokenizer says why
    return (source, special, file)


def load_contract(policy: GatewayPolicy, *, reuse: Contract | None = None) -> Contract:
    """Load every model's tokenizer once; models sharing a source share it. Raises
    PolicyError for a prompt that leaves too little room for inputs
    (:func:`check_prompt_budgets`: it needs the tokenizer).

    With ``reuse``, a model whose :func:`tokenizer_key` is also in that contract gets
    its already-loaded tokenizer: the tokenizers library holds the interpreter lock
    while it loads one, pausing every other thread and the event loop for that long.
    """
    cache: dict[Hashable, ModelTokenizer] = {}
    if reuse is not None:
        for name, tokenizer in reuse.tokenizers.items():
            if name in reuse.tokenizer_keys:
                cache[reuse.tokenizer_keys[name]] = tokenizer
    tokenizers: dict[str, ModelTokenizer] = {}
    keys: dict[str, Hashable] = {}
    sources = [(name, m.tokenizer, m.special_tokens) for name, m in policy.models.items()]
    sources += [
        (r.key, r.tokenizer, r.special_tokens) for r in policy.rerankers if r.tokenizer is not None
    ]
    for name, source, special in sources:
        # before loading: a change meanwhile loads again later
        key = tokenizer_key(source, special)
        if key not in cache:
            cache[key] = load_tokenizer(source, special)
        tokenizers[name] = cache[key]
        keys[name] = key
    for index, (name, model) in enumerate(policy.models.items()):
        check_prompt_budgets(policy.source, index, model, tokenizers[name])
    return Contract(policy=policy, tokenizers=tokenizers, tokenizer_keys=keys)


def check_prompt_budgets(
    source: str, index: int, model: ModelPolicy, tokenizer: ModelTokenizer
) -> None:
    """Raise PolicyError naming file, model and field when a prompt of the policy's own
    leaves too few of ``max_tokens`` for the input (extproc.core.prompts)."""
    for prompt in policy_prompts(model.prompts):
        (ids,) = tokenizer.encode([prompt.prefix])
        problem = prompt_budget_problem(
            prompt, len(ids), max_tokens=model.max_tokens, special_tokens=tokenizer.special_count
        )
        if problem is not None:
            raise PolicyError(
                source, f"models[{index}].{prompt.field}", f"model {model.name!r}: {problem}"
            )
