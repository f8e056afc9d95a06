"""A policy's own prompt must leave room for the input (extproc/core/prompts.py's
budget check, run by load_contract where the tokenizers are): otherwise every input
is cut to the prompt and different queries get the same vector."""

from __future__ import annotations

import pytest

from extproc.core.policy import GatewayPolicy, PolicyError, PromptTemplates, load_policy_text
from extproc.core.prompts import (
    MIN_INPUT_TOKENS,
    PolicyPrompt,
    policy_prompts,
    prompt_budget_problem,
)
from extproc.service.contract_loading import load_contract
from extproc.service.tokenizer_files import load_tokenizer
from testing_support.qwen import QWEN_MODEL, qwen_tokenizer_dir

QWEN_DIR = qwen_tokenizer_dir()
QUERY = PolicyPrompt("prompts.query", "the query prompt", "q: ")


def test_every_prefix_the_policy_can_prepend_is_checked() -> None:
    templates = PromptTemplates(
        query="Instruct: {instruction}\nQuery:{text}",
        document="{text}",  # nothing prepended: nothing to check
        default_instruction="Find it",
        extra={"classification": "classify: {text}"},
    )
    assert policy_prompts(templates) == (
        PolicyPrompt("prompts.query", "the query prompt", "Instruct: \nQuery:"),
        PolicyPrompt(
            "prompts.default_instruction",
            "the query prompt with its default instruction",
            "Instruct: Find it\nQuery:",
        ),
        PolicyPrompt("prompts.extra.classification", "the 'classification' prompt", "classify: "),
    )


def test_the_budget_counts_the_special_tokens_and_needs_16_tokens_left() -> None:
    assert MIN_INPUT_TOKENS == 16
    # 1024 - 1 special - 1007 = 16: just enough.
    assert prompt_budget_problem(QUERY, 1007, max_tokens=1024, special_tokens=1) is None
    assert prompt_budget_problem(QUERY, 1008, max_tokens=1024, special_tokens=1) == (
        "the query prompt is 1,008 tokens: with max_tokens 1,024 and 1 special token it "
        "leaves 15 tokens for the input, at least 16 are needed (every input would be cut "
        "to the prompt)"
    )
    assert prompt_budget_problem(QUERY, 1100, max_tokens=1024, special_tokens=2) == (
        "the query prompt is 1,100 tokens: with max_tokens 1,024 and 2 special tokens it "
        "leaves no token for the input, at least 16 are needed (every input would be cut "
        "to the prompt)"
    )
    assert prompt_budget_problem(QUERY, 9, max_tokens=24, special_tokens=0) == (
        "the query prompt is 9 tokens: with max_tokens 24 it leaves 15 tokens for the "
        "input, at least 16 are needed (every input would be cut to the prompt)"
    )


def policy(*entry: str, max_tokens: int = 1024) -> str:
    """Two models; the second (index 1) is the one under test."""
    lines = [
        "models:",
        "  - name: other",
        "    preset: qwen3-embedding-0.6b",
        f"  - name: {QWEN_MODEL}",
        "    preset: qwen3-embedding-0.6b",
        f"    max_tokens: {max_tokens}",
        *(f"    {line}" for line in entry),
    ]
    return "\n".join(lines) + "\n"


def load(text: str) -> GatewayPolicy:
    overrides = {"other": QWEN_DIR, QWEN_MODEL: QWEN_DIR}
    return load_policy_text(text, source="p.yaml", tokenizer_overrides=overrides)


def refused(text: str) -> PolicyError:
    with pytest.raises(PolicyError) as caught:
        load_contract(load(text))
    return caught.value


def test_the_attack_an_1100_token_default_instruction_is_refused_naming_the_field() -> None:
    instruction = "Given" + " word" * 1100
    error = refused(policy(f"prompts: {{default_instruction: {instruction}}}"))
    assert (error.source, error.field) == ("p.yaml", "models[1].prompts.default_instruction")
    assert error.reason.startswith(f"model '{QWEN_MODEL}': the query prompt with its default ")
    assert "and 1 special token it leaves no token for the input" in error.reason


def test_a_long_template_is_the_template_s_fault() -> None:
    template = "Query" + " word" * 1100 + ": {instruction} {text}"
    error = refused(policy(f'prompts: {{query: "{template}"}}'))
    assert error.field == "models[1].prompts.query"
    extra = "classify" + " word" * 1100 + ": {text}"
    error = refused(policy(f'prompts: {{extra: {{c: "{extra}"}}}}'))
    assert error.field == "models[1].prompts.extra.c"
    error = refused(policy(f'prompts: {{document: "{extra}"}}'))
    assert error.field == "models[1].prompts.document"


def test_a_prompt_that_leaves_exactly_16_tokens_loads() -> None:
    model = load(policy()).models[QWEN_MODEL]
    tokenizer = load_tokenizer(model.tokenizer, model.special_tokens)
    (prefix,) = tokenizer.encode([policy_prompts(model.prompts)[1].prefix])
    fits = len(prefix) + 1 + MIN_INPUT_TOKENS  # the prompt, <|endoftext|>, 16 for the input
    load_contract(load(policy(max_tokens=fits)))
    error = refused(policy(max_tokens=fits - 1))
    assert error.field == "models[1].prompts.default_instruction"
    assert "leaves 15 tokens for the input" in error.reason
