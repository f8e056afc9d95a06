"""Loading a contract: every tokenizer a policy names (each directory checked first), once
per source, then the checks that need them
(:func:`~extproc.core.contract.check_prompt_budgets`)."""

from __future__ import annotations

import os
from collections.abc import Hashable

from extproc.core.contract import Contract, check_prompt_budgets
from extproc.core.policy.model import GatewayPolicy, SpecialTokens, TokenizerSource
from extproc.core.tokens import ModelTokenizer
from extproc.service.tokenizer_files import check_tokenizer_dirs, load_tokenizer


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
    PolicyError for a tokenizer directory without a tokenizer.json
    (:func:`check_tokenizer_dirs`), and for a prompt that leaves too little room for
    inputs (:func:`check_prompt_budgets`: it needs the tokenizer).

    With ``reuse``, a model whose :func:`tokenizer_key` is also in that contract gets
    its already-loaded tokenizer: the tokenizers library holds the interpreter lock
    while it loads one, pausing every other thread and the event loop for that long.
    """
    check_tokenizer_dirs(policy)
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
