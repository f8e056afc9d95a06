"""The learned values as a policy file that `extproc run`, `serve` and `check-config`
load as is: a model's entry (``models``) or a rerank path's (``rerankers``).

Every field is written out (no preset: the file says everything it relies on).
A field whose finding has a problem is still written, so the file loads, with a
``# NOT LEARNED`` comment above it saying what is known. Values are written as JSON,
which is YAML: a prompt's newline stays ``\\n`` on one line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from extproc.core.policy.model import InstructionUse
from extproc.tools.learn.basics_learner import Basics
from extproc.tools.learn.findings import Finding
from extproc.tools.learn.probing_plan import Learned
from extproc.tools.learn.rerank_plan import LearnedRerank

# The policy key a finding is about, when its field's first part is not that key.
_KEY_OF = {
    "model": "name",
    "input_type": "prompts",
    "base64": "encoding_profile",
    "leniency": "encoding_profile",
}


def policy_entry(learned: Learned, basics: Basics) -> dict[str, Any]:
    """The model's entry, in the policy file's schema (key order as written)."""
    source = learned.tokenizer
    tokenizer: dict[str, Any] = (
        {"path": str(source.path)} if source.path else {"hf_id": source.hf_id}
    )
    tokenizer["special_tokens"] = basics.layout.policy()
    p = learned.prompts
    prompts: dict[str, Any] = {
        "query": p.query,
        "document": p.document,
        "default_instruction": p.default_instruction,
    }
    prompts = {k: v for k, v in prompts.items() if v}
    if p.extra:
        prompts["extra"] = dict(p.extra)
    if p.aliases:
        prompts["aliases"] = dict(p.aliases)
    if p.default_input_type is not None:
        prompts["default_input_type"] = p.default_input_type
    if p.input_types:
        prompts["input_types"] = sorted(p.input_types)
    if p.instruction is not InstructionUse.TASK:
        prompts["instruction"] = p.instruction.name
    if p.document_instruction is not InstructionUse.REFUSED:
        prompts["document_instruction"] = p.document_instruction.name
    if p.role_field != "input_type":
        prompts["role_field"] = p.role_field
    entry: dict[str, Any] = {"name": learned.model, "upstream_model": learned.upstream_model}
    if learned.names is not None:
        entry |= {k: True for k in ("any_name", "unnamed") if getattr(learned.names, k)}
    entry |= {"max_tokens": learned.limit, "native_dimensions": basics.native}
    if learned.truncation:
        entry["truncation"] = learned.truncation
    d = learned.dimensions
    if d.matryoshka:
        entry["matryoshka"] = d.policy()
    native = {"dimensions": d.native_cut, "truncate_prompt_tokens": learned.truncate_prompt_tokens}
    entry |= learned.encoding.policy()
    entry |= {
        "upstream": {"kind": learned.kind, "native": native},
        "tokenizer": tokenizer,
        "prompts": prompts,
    }
    if learned.texts is not None and learned.texts.fields:
        entry["preprocess"] = learned.texts.fields
    if learned.answer is not None:
        entry["answer"] = learned.answer
    spoken = learned.dialect  # its errors are that path's; the file's are OpenAI's
    serves: list[dict[str, Any]] = []
    if spoken is not None:
        serves.append({"dialect": spoken.name.upper()})
        if learned.errors:
            serves[0]["errors"] = learned.errors
    for found in learned.dialects:
        errors = learned.errors if found.dialect is spoken else None
        serves += found.serves(errors)
    if serves:
        entry["serves"] = serves
    return entry


def reranker_entry(learned: LearnedRerank) -> dict[str, Any]:
    """A rerank path's entry, in the policy file's schema (key order as written)."""
    dialect = learned.dialect
    out: dict[str, Any] = {
        "name": learned.model,
        "upstream_model": learned.upstream_model,
        "dialect": dialect.name.upper(),
    }
    if learned.path != dialect.paths[0]:
        out["path"] = learned.path
    out["scores"] = learned.scores
    if learned.top_n is not None:
        out["top_n"] = learned.top_n
    documents = learned.return_documents
    if documents is not None and documents != dialect.returns_documents:
        out["return_documents"] = documents
    source = learned.tokenizer
    if learned.max_tokens is not None and source is not None:
        out["max_tokens"] = learned.max_tokens
        if learned.refuse_long_pairs:
            out["truncation"] = {"refuse": True}
        out["tokenizer"] = {"path": str(source.path)} if source.path else {"hf_id": source.hf_id}
    out["upstream"] = {"kind": "vllm"}
    if learned.any_name:
        out["any_name"] = True
    if learned.errors:
        out["errors"] = learned.errors
    return out


def rerankers_text(
    learned: Sequence[LearnedRerank], findings: Sequence[Finding], header: Sequence[str]
) -> str:
    """The ``rerankers`` section, one entry a path; a finding about a path marks its
    field (``"/v1/rerank scores"`` marks that entry's ``scores``)."""
    lines = [f"# {line}" for line in header]
    lines.append("rerankers:")
    for one in learned:
        marks: dict[str, list[str]] = {}
        for item in findings:
            path, _, rest = item.field.partition(" ")
            if item.problem and path == one.path:
                key = rest.split()[0] if rest else ""
                marks.setdefault(key, []).append(f"{item.field}: {item.problem}")
        entry = reranker_entry(one)
        lines += _entry_lines(entry, marks)
    return "\n".join(lines) + "\n"


def _entry_lines(entry: dict[str, Any], marks: dict[str, list[str]]) -> list[str]:
    """One list entry, a key a line, each marked key with its NOT LEARNED comments."""
    lines = [_not_learned(text, "    ") for text in marks.get("", [])]
    for index, (key, value) in enumerate(entry.items()):
        lines += [_not_learned(text, "    ") for text in marks.get(key, [])]
        lines.append(
            f"{'  - ' if index == 0 else '    '}{key}: {json.dumps(value, ensure_ascii=False)}"
        )
    return lines


def _not_learned(text: str, indent: str = "") -> str:
    return f"{indent}# NOT LEARNED: {' '.join(text.split())}"


def policy_text(
    learned: Learned, basics: Basics, findings: Sequence[Finding], header: Sequence[str]
) -> str:
    entry = policy_entry(learned, basics)
    marks: dict[str, list[str]] = {}
    for item in findings:
        if item.problem:
            first = item.field.split()[0].split(".")[0]
            key = first if first in entry else _KEY_OF.get(first, first)
            marks.setdefault(key if key in entry or key == "errors" else "", []).append(
                f"{item.field}: {item.problem}"
            )
    lines = [f"# {line}" for line in header]
    lines += [_not_learned(text) for text in marks.pop("", [])]
    lines.append("models:")
    errors = marks.pop("errors", [])
    lines += _entry_lines(entry, marks)
    if learned.batches is not None and learned.batches.limit is not None:
        lines.append(f"limits: {json.dumps({'max_inputs': learned.batches.limit})}")
    if learned.errors and learned.dialect is None:
        lines += [_not_learned(text) for text in errors]
        lines.append(f"errors: {json.dumps(learned.errors, ensure_ascii=False)}")
    return "\n".join(lines) + "\n"
