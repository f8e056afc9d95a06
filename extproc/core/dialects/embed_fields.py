"""What the embeddings dialects other than OpenAI's share (pure).

A dialect's reader puts its request in OpenAI's terms and has it checked as an
OpenAI request is (:func:`checked`: the model's limits, prompts and Matryoshka rule),
and the task names every mistake in the dialect's own words
(:func:`extproc.core.tasks.embed.own_words`: ``'texts'``, not ``'input'``). The
reader also says a long input's fate as the client asked it (:func:`truncation`),
maps the dialect's roles onto the policy's (:func:`role`) and reads the embedding
types a client wants (:func:`embedding_types`); the writer reads them back from the plan
(:func:`options`) and writes each type of vector
(:func:`extproc.core.quantize.quantise`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from extproc.core.api_errors import InvalidFieldError
from extproc.core.plan import ResponsePlan
from extproc.core.policy.model import CutSide, ModelPolicy, Truncation
from extproc.core.prompts import DOCUMENT_TYPES, QUERY_TYPES
from extproc.core.quantize import ScalingRule
from extproc.core.request_json import EmbeddingsRequest, check_fields, read_object
from extproc.core.tasks.embed import Reading


@dataclass(frozen=True)
class Body:
    """A dialect's request body as read: its JSON object, and whether a byte order
    mark led it."""

    doc: dict[str, Any]
    bom: bool


def read_body(body: bytes, reading: Reading) -> Body:
    """The body read as every dialect's is (size, coding, repeated keys)."""
    return Body(*read_object(body, reading.policy, reading.coding))


def checked(
    reading: Reading,
    model: ModelPolicy,
    body: Body,
    names: Mapping[str, str],
    *,
    role: str | None = None,
    **chosen: Any,
) -> EmbeddingsRequest:
    """The body's fields that OpenAI has too (``names``: OpenAI's name to the
    dialect's, ``{"input": "texts"}``) and the policy's ``role`` checked against
    ``model``'s policy as an OpenAI request, with what the dialect chose beside
    (``truncation``, ``token_limit``, ``raw_vectors``, ``answer``). Only these go
    upstream: a dialect's other fields never do. ``raw_vectors`` unsaid (or None)
    is the path's: the vectors as the model pools them where it is not normalised."""
    doc = body.doc
    terms: dict[str, Any] = {"model": model.name}
    terms |= {ours: doc[theirs] for ours, theirs in names.items() if theirs in doc}
    if role is not None:
        terms[model.prompts.role_field] = role
    request = check_fields(terms, reading.policy, reading.tokenizers, bom=body.bom, model=model)
    if chosen.get("raw_vectors") is None:
        chosen["raw_vectors"] = not reading.normalized(model)
    return replace(request, **chosen)


def role(value: Any, field: str, model: ModelPolicy, symmetric: frozenset[str]) -> str | None:
    """The policy's role for a dialect's role value: its own where the policy knows
    it (a query or document name, an alias, an extra template); a symmetric task
    (Cohere's ``clustering``, Jina's ``text-matching``) a document's, as the model
    embeds a text with no instruction; anything else as sent, for the prompts to
    refuse by name."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidFieldError(f"'{field}' must be a string.", param=field)
    prompts = model.prompts
    known = QUERY_TYPES | DOCUMENT_TYPES | set(prompts.extra) | set(prompts.aliases)
    if value in known or value not in symmetric:
        return value
    return "document"


def truncation(cut: bool | None, model: ModelPolicy, *, left: bool = False) -> Truncation | None:
    """A long input's fate as the client said it: cut (on the ``left`` or the
    right) or refused; None where it said nothing (the model's own)."""
    if cut is None:
        return None
    side = CutSide.LEFT if left else CutSide.RIGHT
    return replace(model.truncation, side=side, refuse=not cut)


def embedding_types(
    value: Any, field: str, allowed: tuple[str, ...], model: ModelPolicy, dimensions: Any
) -> tuple[str, ...]:
    """The embedding types asked for (a string or a list of them), each one the
    dialect has; int8 and uint8 only for a model with a quantisation rule, and a
    calibrated one only at the width it was calibrated at (``dimensions`` unset)."""
    kinds = [value] if isinstance(value, str) else value
    if not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) for k in kinds):
        raise InvalidFieldError(
            f"'{field}' must be a non-empty array of strings.", param=field, reason="empty"
        )
    for kind in kinds:
        if kind not in allowed:
            raise InvalidFieldError(
                f"'{field}' has {kind!r}; accepted values: {', '.join(allowed)}.", param=field
            )
        if kind in ("int8", "uint8") and model.quantization is None:
            raise InvalidFieldError(
                f"{kind} embeddings are not available for {model.name!r}: its policy "
                "names no quantisation rule; ask for float, binary or ubinary.",
                param=field,
            )
        calibrated = model.quantization is not None and (
            model.quantization.rule is ScalingRule.CALIBRATED
        )
        if kind in ("int8", "uint8") and calibrated and dimensions is not None:
            raise InvalidFieldError(
                f"{kind} embeddings of {model.name!r} are calibrated at its full width; "
                "ask for them without a smaller size, or for float, binary or ubinary.",
                param=field,
            )
    return tuple(dict.fromkeys(kinds))


def options(plan: ResponsePlan) -> dict[str, Any]:
    """The answer options the reader put in the plan, by name."""
    return dict(plan.answer)


def says(request: Mapping[str, Any], fields: frozenset[str]) -> bool:
    """Whether a dialect with these of OpenAI's request fields can say ``request``
    (a field absent or null needs no saying; ``float`` is every dialect's encoding)."""
    asked = {k for k, v in request.items() if v is not None}
    if request.get("encoding_format") in (None, "float"):
        asked.discard("encoding_format")
    return asked <= fields
