"""What every command shares beyond its options: loading a contract with a readable error.

The gateway commands (``extproc.commands.cli``) and the tools (probe, shadow) both
import from here and from ``extproc.commands.options``, so that no tool depends on the
CLI module that registers it.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

from extproc.core.contract import Contract, load_contract
from extproc.core.policy import PolicyError, load_policy_file
from extproc.core.policy.loader import parse_tokenizer_overrides
from extproc.core.tokens import TokenizerLoadError
from extproc.service.memory import fix_mmap_threshold, trim_heap


def load_contract_or_report(
    config: Path, tokenizer_flags: list[str], *, tokenizers: bool = True
) -> Contract | None:
    """The policy and its tokenizers, or None after printing file, field and reason."""
    try:
        overrides = parse_tokenizer_overrides(",".join(tokenizer_flags))
        policy = load_policy_file(config, tokenizer_overrides=overrides)
        if not tokenizers:
            return Contract(policy=policy, tokenizers={})
        return load_contract(policy)
    except PolicyError as exc:
        print(f"error: {exc.source}: {exc.field}: {exc.reason}", file=sys.stderr)
    except (TokenizerLoadError, ValueError, OSError) as exc:
        print(f"error: {config}: tokenizer: {exc}", file=sys.stderr)
    return None


def launcher_contract(config: Path, tokenizer_flags: list[str], workers: int) -> Contract | None:
    """What a launcher (`extproc run`, `extproc shadow`) starts from, or None after the
    error line. The whole contract is checked here, tokenizers included (a prompt's
    length needs them), so that a policy that cannot be served stops the command with
    one line rather than once per worker. Worker processes load their own tokenizers:
    with them the launcher keeps the policy alone and gives the tokenizers' memory back."""
    fix_mmap_threshold()  # before the tokenizers load (extproc/service/memory.py)
    contract = load_contract_or_report(config, tokenizer_flags)
    if contract is None or workers == 1:
        return contract
    policy = contract.policy
    del contract
    gc.collect()
    trim_heap()
    return Contract(policy=policy, tokenizers={})
