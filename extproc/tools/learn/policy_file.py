"""The learned values as a policy file that `extproc run`, `serve` and `check-config`
load as is.

Every field is written out (no preset: the file says everything it relies on).
A field whose finding has a problem is still written, so the file loads, with a
``# NOT LEARNED`` comment above it saying what is known. Values are written as JSON,
which is YAML: a prompt's newline stays ``\\n`` on one line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from extproc.core.policy.model import TokenizerSource
from extproc.tools.learn.dimensions import Dimensions
from extproc.tools.learn.findings import Finding
from extproc.tools.learn.local import Layout
from extproc.tools.learn.prompts import Prompts

# Which policy key a finding's field is about (its first word or dotted part).
_KEY_OF = {
    "model": "name",
    "instruction": "prompts",
    "input_type": "prompts",
    "candidate": "max_tokens",
}


@dataclass(frozen=True)
class Learned:
    model: str
    upstream_model: str
    tokenizer: TokenizerSource
    layout: Layout
    max_tokens: int
    native: int
    dimensions: Dimensions
    prompts: Prompts
    profile: str  # LEGACY or OPENAI
    kind: str
    truncate_prompt_tokens: bool


def policy_entry(learned: Learned) -> dict[str, Any]:
    """The model's entry, in the policy file's schema (key order as written)."""
    tokenizer: dict[str, Any] = (
        {"path": str(learned.tokenizer.path)}
        if learned.tokenizer.path is not None
        else {"hf_id": learned.tokenizer.hf_id}
    )
    tokenizer["special_tokens"] = learned.layout.policy()
    prompts: dict[str, Any] = {"query": learned.prompts.query, "document": learned.prompts.document}
    if learned.prompts.default_instruction:
        prompts["default_instruction"] = learned.prompts.default_instruction
    if learned.prompts.extra:
        prompts["extra"] = dict(learned.prompts.extra)
    dims = learned.dimensions
    entry: dict[str, Any] = {"name": learned.model}
    if learned.upstream_model != learned.model:
        entry["upstream_model"] = learned.upstream_model
    entry |= {"max_tokens": learned.max_tokens, "native_dimensions": learned.native}
    if dims.min_dimensions is not None:
        entry["matryoshka"] = {"min_dimensions": dims.min_dimensions}
    elif dims.matryoshka:
        entry["matryoshka"] = {"allowed": list(dims.allowed)}
    native = {
        "dimensions": dims.native_cut,
        "truncate_prompt_tokens": learned.truncate_prompt_tokens,
    }
    entry |= {
        "encoding_profile": learned.profile,
        "upstream": {"kind": learned.kind, "native": native},
        "tokenizer": tokenizer,
        "prompts": prompts,
    }
    return entry


def policy_text(learned: Learned, findings: Sequence[Finding], header: Sequence[str]) -> str:
    problems: dict[str, list[str]] = {}
    for item in findings:
        if item.problem:
            head = item.field.split()[0].split(".")[0]
            problems.setdefault(_KEY_OF.get(head, head), []).append(f"{item.field}: {item.problem}")
    lines = [f"# {line}" for line in header]
    lines.append("models:")
    for index, (key, value) in enumerate(policy_entry(learned).items()):
        for problem in problems.get(key, []):
            lines.append(f"    # NOT LEARNED: {' '.join(problem.split())}")
        lead = "  - " if index == 0 else "    "
        lines.append(f"{lead}{key}: {json.dumps(value, ensure_ascii=False)}")
    return "\n".join(lines) + "\n"
