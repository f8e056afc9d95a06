"""What every command shares: the shipped policy, loading a contract with a readable
error, and the policy options (``--config``, ``--tokenizer``, ``--metrics``, ``--grace``).

The gateway commands (``extproc.commands.cli``) and the tools (probe, shadow) both
import from here, so that no tool depends on the CLI module that registers it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from extproc.core.contract import Contract, load_contract
from extproc.core.policy import PolicyError, load_policy_file
from extproc.core.policy.loader import parse_tokenizer_overrides
from extproc.core.tokens import TokenizerLoadError

SHIPPED_POLICY = Path(__file__).resolve().parents[1] / "policies" / "qwen3-embedding-0.6b.yaml"


def add_policy_options(parser: argparse.ArgumentParser, *, grace_s: float = 30.0) -> None:
    """``--config``, ``--tokenizer``, ``--metrics`` and ``--grace`` on ``parser``."""
    parser.add_argument(
        "--config",
        type=Path,
        default=Path(os.environ.get("EXTPROC_CONFIG", SHIPPED_POLICY)),
        help="policy file (default: $EXTPROC_CONFIG, else the shipped Qwen3 policy)",
    )
    parser.add_argument(
        "--tokenizer",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="use the tokenizer.json in DIR for model (or tokenizer hf_id) NAME; "
        "repeatable; also $EXTPROC_TOKENIZER_OVERRIDES=NAME=DIR,...",
    )
    parser.add_argument(
        "--metrics",
        default=os.environ.get("EXTPROC_METRICS"),
        metavar="HOST:PORT",
        help="serve Prometheus metrics here (default: off)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=grace_s,
        help="seconds to let in-flight streams finish on SIGTERM",
    )


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
