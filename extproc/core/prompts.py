"""Query/document roles and the prompt prefix each role gets.

Clients name the role in ``input_type`` with one of several vendors' vocabularies
(Cohere, Voyage, NVIDIA NIM, Jina); the legacy server also took a bare
``instruction``. Everything maps onto the policy's templates here: an alias with a
template of its own (``prompts.aliases``) gets it, any other its role's; an input
with neither field gets ``prompts.default_input_type``'s, or none; what
``instruction`` does is ``prompts.instruction`` (a task in the query template, the
whole prompt, ignored, or refused).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from extproc.core.api_errors import ApiError, InstructionError, InvalidFieldError, quoted
from extproc.core.policy.model import InstructionUse, PromptTemplates

QUERY_TYPES: Final = frozenset({"query", "search_query", "retrieval.query", "question"})
DOCUMENT_TYPES: Final = frozenset(
    {"document", "passage", "search_document", "retrieval.passage", "doc"}
)


def prompt_prefix(
    templates: PromptTemplates, input_type: str | None, instruction: str | None
) -> str:
    """The text put before every input; ``""`` when the input is sent as it is.

    With neither field the input gets ``default_input_type``'s prompt, or none (the
    legacy server's usual way). An ``instruction`` alone means a query. The caller
    never passes an instruction the policy ignores.
    """
    if instruction is not None and templates.instruction is InstructionUse.REFUSED:
        raise InstructionError(
            "`instruction` is not supported for this model; leave it out.", param="instruction"
        )
    if input_type is None:
        if instruction is None:
            if templates.default_input_type is None:
                return ""
            input_type = templates.default_input_type
        else:
            input_type = "query"
    elif templates.input_types and input_type not in templates.input_types:
        raise _unknown_input_type(templates, input_type)
    if input_type in QUERY_TYPES:
        template = templates.aliases.get(input_type, templates.query)
        if instruction is not None and templates.instruction is InstructionUse.PROMPT:
            return instruction
    elif input_type in DOCUMENT_TYPES and instruction is not None:
        use = templates.document_instruction
        if use is InstructionUse.REFUSED:
            raise InstructionError(
                f"`instruction` applies to queries only; drop it or send "
                f"{templates.role_field} 'query'.",
                param="instruction",
            )
        if use is InstructionUse.IGNORED:
            return prompt_prefix(templates, input_type, None)
        # The instruction wins: a query with it.
        return prompt_prefix(replace(templates, instruction=use), "query", instruction)
    elif input_type in DOCUMENT_TYPES:
        template = templates.aliases.get(input_type, templates.document)
    elif input_type in templates.extra:
        template = templates.extra[input_type]
    else:
        raise _unknown_input_type(templates, input_type)
    if "{instruction}" in template and instruction is None:
        instruction = templates.default_instruction
    return _prefix(template, instruction or "")


def _unknown_input_type(templates: PromptTemplates, input_type: str) -> ApiError:
    accepted = sorted(templates.input_types or QUERY_TYPES | DOCUMENT_TYPES | set(templates.extra))
    return InvalidFieldError(
        f"Unsupported {templates.role_field} {quoted(input_type)}; accepted values: "
        f"{', '.join(accepted)}.",
        param=templates.role_field,
    )


# Fewest tokens a policy's own prompt may leave for the input under max_tokens. A
# prompt that leaves fewer is refused when the policy loads: every input would be cut
# to (almost) nothing, and different inputs would get the same vector.
MIN_INPUT_TOKENS = 16


@dataclass(frozen=True)
class PolicyPrompt:
    """A prefix the policy itself puts before inputs, and the field that makes it."""

    field: str  # relative to the model entry, e.g. "prompts.default_instruction"
    role: str  # what it is, for the message: "the query prompt with its default instruction"
    prefix: str


def policy_prompts(templates: PromptTemplates) -> tuple[PolicyPrompt, ...]:
    """Every prefix the policy alone can put before an input (a client's own
    ``instruction`` is a request-time matter). The query template comes twice: without
    the instruction (a long template is the template's fault) and with the default."""
    prompts = [PolicyPrompt("prompts.query", "the query prompt", _prefix(templates.query, ""))]
    if "{instruction}" in templates.query:
        prompts.append(
            PolicyPrompt(
                "prompts.default_instruction",
                "the query prompt with its default instruction",
                _prefix(templates.query, templates.default_instruction),
            )
        )
    prompts.append(
        PolicyPrompt("prompts.document", "the document prompt", _prefix(templates.document, ""))
    )
    for name, template in templates.extra.items():
        prompts.append(
            PolicyPrompt(f"prompts.extra.{name}", f"the {name!r} prompt", _prefix(template, ""))
        )
    for alias, template in templates.aliases.items():
        task = templates.default_instruction if alias in QUERY_TYPES else ""
        prompts.append(
            PolicyPrompt(
                f"prompts.aliases.{alias}", f"the {alias!r} prompt", _prefix(template, task)
            )
        )
    return tuple(p for p in prompts if p.prefix)


def prompt_budget_problem(
    prompt: PolicyPrompt,
    prompt_tokens: int,
    *,
    max_tokens: int,
    special_tokens: int,
    minimum: int = MIN_INPUT_TOKENS,
) -> str | None:
    """Why ``prompt`` (``prompt_tokens`` long) leaves too little of ``max_tokens`` for
    the input once the model's ``special_tokens`` are counted; None when it leaves enough."""
    left = max_tokens - special_tokens - prompt_tokens
    if left >= minimum:
        return None
    specials = f" and {special_tokens} special token{'s' * (special_tokens != 1)}"
    leaves = f"leaves {left:,} tokens" if left > 0 else "leaves no token"
    return (
        f"{prompt.role} is {prompt_tokens:,} tokens: with max_tokens {max_tokens:,}"
        f"{specials if special_tokens else ''} it {leaves} for the input, at least "
        f"{minimum} are needed (every input would be cut to the prompt)"
    )


def _prefix(template: str, instruction: str) -> str:
    prefix, _, _ = template.partition("{text}")
    # Replace, never str.format: braces in a client's instruction are just text.
    return prefix.replace("{instruction}", instruction)
