"""Query/document roles and the prompt prefix each role gets.

Clients name the role in ``input_type`` with one of several vendors' vocabularies
(Cohere, Voyage, NVIDIA NIM, Jina); the legacy server also took a bare
``instruction``. Everything maps onto the policy's templates here.
"""

from __future__ import annotations

from typing import Final

from extproc.core.errors import ApiError, invalid_request, quoted
from extproc.core.policy.model import PromptTemplates

QUERY_TYPES: Final = frozenset({"query", "search_query", "retrieval.query", "question"})
DOCUMENT_TYPES: Final = frozenset(
    {"document", "passage", "search_document", "retrieval.passage", "doc"}
)


def prompt_prefix(
    templates: PromptTemplates, input_type: str | None, instruction: str | None
) -> str:
    """The text put before every input; ``""`` when the input is sent as it is.

    With neither field the input is embedded verbatim, as the legacy server did.
    An ``instruction`` alone means a query with that task.
    """
    if input_type is None:
        if instruction is None:
            return ""
        template = templates.query
    elif input_type in QUERY_TYPES:
        template = templates.query
    elif input_type in DOCUMENT_TYPES:
        if instruction is not None:
            raise invalid_request(
                "`instruction` applies to queries only; drop it or send input_type 'query'.",
                param="instruction",
            )
        template = templates.document
    elif input_type in templates.extra:
        template = templates.extra[input_type]
    else:
        raise _unknown_input_type(templates, input_type)
    if "{instruction}" in template and instruction is None:
        instruction = templates.default_instruction
    prefix, _, _ = template.partition("{text}")
    # Replace, never str.format: braces in a client's instruction are just text.
    return prefix.replace("{instruction}", instruction or "")


def _unknown_input_type(templates: PromptTemplates, input_type: str) -> ApiError:
    accepted = sorted(QUERY_TYPES | DOCUMENT_TYPES | set(templates.extra))
    return invalid_request(
        f"Unsupported input_type {quoted(input_type)}; accepted values: {', '.join(accepted)}.",
        param="input_type",
    )
