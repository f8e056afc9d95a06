"""The contract a command starts from: the policy file, with the tokenizer overrides of
its flags and environment, and its tokenizers; or one readable error line (file,
field and reason) instead of a traceback."""

from __future__ import annotations

import sys
from pathlib import Path

from extproc.core.contract import Contract
from extproc.core.policy import PolicyError
from extproc.core.tokens import TokenizerLoadError
from extproc.service.contract_loading import load_contract
from extproc.service.policy_file import load_policy_file
from extproc.service.tokenizer_files import check_tokenizer_dirs
from extproc.service.tokenizer_overrides import tokenizer_overrides


def load_contract_or_report(
    config: Path, tokenizer_flags: list[str], *, tokenizers: bool = True
) -> Contract | None:
    """The policy and its tokenizers, or None after printing file, field and reason.
    Without ``tokenizers`` none is loaded: the policy alone, its tokenizer directories
    checked (each holds a tokenizer.json)."""
    try:
        overrides = tokenizer_overrides(tokenizer_flags)
        policy = load_policy_file(config, tokenizer_overrides=overrides)
        if not tokenizers:
            check_tokenizer_dirs(policy)
            return Contract(policy=policy, tokenizers={})
        return load_contract(policy)
    except PolicyError as exc:
        print(f"error: {exc.source}: {exc.field}: {exc.reason}", file=sys.stderr)
    except (TokenizerLoadError, ValueError, OSError) as exc:
        print(f"error: {config}: tokenizer: {exc}", file=sys.stderr)
    return None
