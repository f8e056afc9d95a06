"""Reading an embeddings request body: bytes -> :class:`EmbeddingsRequest` (sans-I/O).

Every client mistake in the body is a 4xx :class:`ApiError` here, before the rewrite
decides anything and before any byte reaches the upstream.

An unchanged body is forwarded as sent, so what the gateway validated must be
exactly what the upstream will read: a key repeated in any JSON object of the body
is a 400 (parsers disagree on which copy wins), and a field the gateway does not
interpret is accepted only if it could also be re-serialized (nested at most 253
levels below the body).

Field types follow the model's leniency. By default they are strict: integers are
JSON integers, token ids too. ``leniency.integers`` accepts what the legacy server's
FastAPI request model accepted in pydantic's lax mode (:mod:`extproc.core.lax`:
``256.0``, ``"256"``, token ids ``[1.0, "2"]``), and ``leniency.bom`` a UTF-8 byte
order mark before the body; the values read are integers whatever the client's
spelling. A top-level ``null`` always means the field is absent. An ``instruction``
the policy ignores is not read at all (the legacy server's model had no such field).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from extproc.core.api_errors import (
    ApiError,
    DimensionsError,
    InstructionError,
    InvalidFieldError,
    MalformedBodyError,
    TooManyInputsError,
    UnknownModelError,
    quoted,
)
from extproc.core.lax import integral_float_int, lax_int
from extproc.core.plan import Encoding
from extproc.core.policy.model import GatewayPolicy, InstructionUse, ModelPolicy, Truncation
from extproc.core.request_coding import BodyCoding
from extproc.core.request_headers import check_body_size
from extproc.core.tokens import ModelTokenizer

# Every top-level field read_request reads and type-checks (the role's field too,
# by default `input_type`); others go upstream as sent.
INTERPRETED_FIELDS: Final = frozenset(
    {"dimensions", "input_type", "instruction", "model", "input", "encoding_format"}
    | {"truncate_prompt_tokens", "user"}
)
_UTF8_BOM: Final = b"\xef\xbb\xbf"

TokenInput = list[int] | list[list[int]]
# A dialect's answer options, as (name, value) pairs: hashable, in a frozen plan.
AnswerOptions = tuple[tuple[str, Any], ...]
IntReader = Callable[[Any], int | None]


def int_reader(model: ModelPolicy) -> IntReader:
    """How the model reads an integer field: pydantic's lax spellings, integral floats
    alone, or JSON integers only."""
    if model.leniency.integers:
        return lax_int
    if model.leniency.integral_floats:
        return integral_float_int
    return _strict_int


@dataclass(frozen=True)
class EmbeddingsRequest:
    """A ``POST /v1/embeddings`` body, checked against its model's policy.

    Exactly one of ``texts`` and ``token_ids`` is set, never empty. The other typed
    fields are ``None`` when the client sent none (or ``null``).
    """

    fields: Mapping[str, Any]  # the body's top-level object, as parsed
    model: ModelPolicy
    bom: bool  # the body started with a UTF-8 byte order mark (leniency.bom only)
    texts: list[str] | None
    token_ids: list[list[int]] | None
    # ``input`` as integer token ids, when the client spelled some id otherwise
    # (legacy profile): in the client's shape, one sequence or several.
    converted_input: TokenInput | None
    encoding: Encoding  # what the client's answer must be encoded as
    dimensions: int | None
    input_type: str | None
    instruction: str | None
    truncate_prompt_tokens: int | None
    # What a dialect other than OpenAI's asks beside those: the client's own choice
    # of a long input's fate (None: the model's) and of a smaller token budget,
    # whether it wants the vectors as the model pools them before it normalises
    # them, and what its answer needs (its embedding types, its texts echoed...),
    # for its writer.
    truncation: Truncation | None = None
    token_limit: int | None = None
    raw_vectors: bool = False
    answer: AnswerOptions = ()

    @property
    def input_count(self) -> int:
        return len(self.texts) if self.texts is not None else len(self.token_ids or ())

    @property
    def single_text(self) -> bool:
        """``input`` is one string (messages then name it 'input', not 'input[0]')."""
        return isinstance(self.fields["input"], str)


def read_request(
    body: bytes,
    policy: GatewayPolicy,
    tokenizers: Mapping[str, ModelTokenizer],
    *,
    coding: BodyCoding | None = None,
) -> EmbeddingsRequest:
    """The checked request; raise ApiError for the client.

    ``coding``: how the body was sent, when Envoy decoded it (its errors say so)."""
    request, bom = read_object(body, policy, coding)
    return check_fields(request, policy, tokenizers, bom=bom)


def read_object(
    body: bytes, policy: GatewayPolicy, coding: BodyCoding | None = None
) -> tuple[dict[str, Any], bool]:
    """The body's JSON object, and whether a UTF-8 byte order mark led it; every
    dialect's body is read so (sizes, coding, repeated keys)."""
    limits = policy.limits
    if coding is not None:
        coding.check(body, limits.max_request_bytes)
    check_body_size(len(body), limits)
    bom = body.startswith(_UTF8_BOM)
    return _parse_object(body[len(_UTF8_BOM) :] if bom else body, coding), bom


def check_fields(
    request: dict[str, Any],
    policy: GatewayPolicy,
    tokenizers: Mapping[str, ModelTokenizer],
    *,
    bom: bool = False,
    model: ModelPolicy | None = None,
) -> EmbeddingsRequest:
    """An OpenAI-shaped body checked against its model's policy (``model``: the one
    the endpoint fixes, for a dialect whose requests name none). Every dialect's
    request is checked so, once its reader has put it in OpenAI's terms."""
    limits = policy.limits
    model = model or _model(request, policy)
    to_int = int_reader(model)
    if bom and not model.leniency.bom:
        raise MalformedBodyError(
            "The request body starts with a byte order mark; send plain UTF-8 JSON.",
            code="invalid_json",
        )
    tokenizer = tokenizers[model.name]

    raw_input = request.get("input", _MISSING)
    if raw_input is _MISSING:
        raise InvalidFieldError(
            "Missing required parameter: 'input'.", param="input", reason="missing"
        )
    texts, id_lists, ids_converted = _inputs(
        raw_input, limits.max_inputs, tokenizer.vocab_size, to_int
    )
    converted_input: TokenInput | None = None
    if ids_converted:
        assert id_lists is not None
        converted_input = id_lists if isinstance(raw_input[0], list) else id_lists[0]

    encoding = _client_encoding(request.get("encoding_format"), model)
    dimensions = _dimensions(request.get("dimensions"), model, to_int)
    input_type = _optional_str(request, model.prompts.role_field)
    instruction = None
    if model.prompts.instruction is not InstructionUse.IGNORED:
        instruction = _optional_str(request, "instruction")
        if instruction is not None and not instruction.strip():
            raise InstructionError("`instruction` must not be empty.", param="instruction")
    truncate = _truncate_prompt_tokens(request.get("truncate_prompt_tokens"), model, to_int)
    # OpenAI's end-user id is forwarded as sent; Dynamo and vLLM both refuse a
    # non-string with their own 400 - after it reached them. Answered here instead.
    _optional_str(request, "user")
    _check_uninterpreted_fields(request)
    return EmbeddingsRequest(
        fields=request,
        model=model,
        bom=bom,
        texts=texts,
        token_ids=id_lists,
        converted_input=converted_input,
        encoding=encoding,
        dimensions=dimensions,
        input_type=input_type,
        instruction=instruction,
        truncate_prompt_tokens=truncate,
    )


class _Missing:
    pass


_MISSING: Final = _Missing()


def _parse_object(body: bytes, coding: BodyCoding | None = None) -> dict[str, Any]:
    if not body.strip():
        if coding is not None:
            raise coding.empty(len(body))
        raise MalformedBodyError(
            "The request body is empty; send a JSON object.", code="invalid_json"
        )
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if coding is not None:
            raise coding.not_json(len(body), str(exc)) from None
        raise MalformedBodyError(
            f"The request body is not valid JSON: {exc}.", code="invalid_json", position=exc.pos
        ) from None
    if not isinstance(request, dict):
        raise MalformedBodyError(
            f"The request body must be a JSON object, not {_json_type(request)}.",
            code="invalid_json",
        )
    _check_repeated_keys(body, request)
    return request


def _check_repeated_keys(body: bytes, request: dict[str, Any]) -> None:
    """A key repeated in any object of the body is a 400, never "the last one wins".

    orjson (like Python's json and pydantic, so vLLM) keeps the last copy, but Dynamo's
    serde structs reject a duplicate field, and an unchanged body is forwarded byte for
    byte: the upstream must read what the gateway validated. Cheap in the usual case:
    every object member needs a ':' byte, so a body with no more of them than it has
    top-level keys repeats none and is not parsed again; nor is one whose ':' bytes all
    come back when the parsed body is written again (:func:`_colons_all_kept`: texts
    with colons in them). Otherwise the stdlib parser lists each object's members (one
    more parse of the whole body).
    """
    colons = _count_colons(body)
    if colons <= len(request) or _colons_all_kept(body, colons, request):
        return
    repeats: list[str | None] = []  # each object's first repeated key, inner objects first

    def first_repeat(pairs: list[tuple[str, Any]]) -> None:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                repeats.append(key)
                return
            seen.add(key)
        repeats.append(None)

    try:
        json.loads(body, object_pairs_hook=first_repeat)
    except RecursionError:
        # orjson takes up to 1,024 levels, the stdlib parser ~1,000: such a body is
        # refused anyway (no field may nest that deep, see _check_uninterpreted_fields).
        raise _too_deep("The request body") from None
    top = repeats[-1] if repeats else None  # the outermost object closes last
    if top is not None and top in INTERPRETED_FIELDS:
        raise InvalidFieldError(
            f"'{top}' appears more than once in the request body; send each field once.",
            param=top,
        )
    repeated = next((key for key in reversed(repeats) if key is not None), None)
    if repeated is not None:
        # Not a param: metrics labels come from fixed sets, and this key is the client's.
        raise MalformedBodyError(
            f"The key {repeated[:40]!r} appears more than once in a JSON object of the "
            "request body; send each key once.",
            code="invalid_json",
        )


def _colons_all_kept(body: bytes, colons: int, request: dict[str, Any]) -> bool:
    """True only if no object of ``body`` repeats a key; False means "maybe".

    A body's ':' bytes are one per object member plus those inside its strings (keys
    and values). orjson writes the parsed body back with one ':' per member it kept
    plus the ':' of the strings it kept, never escaped. Parsing keeps every member and
    every string unless a key repeats (the dropped copy takes its ':' and its value's
    with it), so equal counts mean nothing was dropped. A string can hold a ':' without
    a ':' byte only through the escape ``\\u003a``; a body with any ``\\u003`` escape,
    or one nested too deeply for orjson to write, gets "maybe".
    """
    if b"\\u003" in body:
        return False
    try:
        return _count_colons(orjson.dumps(request)) == colons
    except orjson.JSONEncodeError:
        return False


def _count_colons(data: bytes) -> int:
    # bytes.replace of one byte runs at memchr speed; bytes.count goes byte by byte.
    return len(data) - len(data.replace(b":", b""))


def _check_uninterpreted_fields(request: dict[str, Any]) -> None:
    """A field the gateway does not interpret is forwarded as sent, but only if the
    gateway could also re-serialize it (orjson writes at most 254 nested arrays and
    objects, the body included; Dynamo's parser stops at 128): the same rule whether
    or not this body gets rewritten, instead of a 500 only when it does."""
    for key, value in request.items():
        if key in INTERPRETED_FIELDS or not isinstance(value, list | dict):
            continue
        try:
            orjson.dumps({key: value})  # the depth the field has in the upstream body
        except orjson.JSONEncodeError:
            raise _too_deep(f"The field {key[:40]!r}") from None


def _too_deep(what: str) -> ApiError:
    return MalformedBodyError(
        f"{what} nests arrays or objects too deeply (at most 253 levels below the body).",
        code="invalid_json",
    )


def _model(request: dict[str, Any], policy: GatewayPolicy) -> ModelPolicy:
    name = request.get("model")
    if name is not None and not isinstance(name, str):
        raise InvalidFieldError(f"'model' must be a string, not {_json_type(name)}.", param="model")
    model = policy.model(name)
    if model is not None:
        return model
    if name is None:
        raise InvalidFieldError(
            "Missing required parameter: 'model'.", param="model", reason="missing"
        )
    raise UnknownModelError(
        f"The model {quoted(name)} does not exist; this gateway serves: "
        + ", ".join(sorted(policy.models))
        + "."
    )


def input_items(value: Any, to_int: IntReader | None = None) -> list[Any] | None:
    """The inputs an embeddings request's ``input`` holds, in OpenAI's forms: a string
    and one token-id sequence are one input each, an array of strings or of token-id
    sequences one input an item. Tolerant: the items are not checked, nothing is
    raised; None when ``input`` is neither a string nor an array. ``to_int`` reads a
    token id (default: JSON integers only)."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        return None
    return [value] if _one_sequence(value, to_int or _strict_int) else value


def _one_sequence(value: list[Any], to_int: IntReader) -> bool:
    """``input`` is one token-id sequence: its first item reads as a token id and not
    every item is a string (strings are never numbers' spellings: those are texts)."""
    return (
        bool(value)
        and not isinstance(value[0], list)
        and to_int(value[0]) is not None
        and not all(isinstance(item, str) for item in value)
    )


def _inputs(
    raw: Any, max_inputs: int, vocab_size: int, to_int: IntReader
) -> tuple[list[str] | None, list[list[int]] | None, bool]:
    """(texts, token-id lists, whether any token id was converted): exactly one of the
    first two comes back, never empty.

    The forms are those of :func:`input_items`. ``to_int`` reads token ids as the
    model's leniency says (the legacy server's lax model: ``1.0``, ``"1"``, ``true``).
    """
    if isinstance(raw, str):
        return [raw], None, False
    if not isinstance(raw, list):
        raise InvalidFieldError(
            f"'input' must be a string, an array of strings, or token ids; got {_json_type(raw)}.",
            param="input",
        )
    if not raw:
        raise InvalidFieldError(
            "'input' must not be an empty array.", param="input", reason="empty"
        )
    if _one_sequence(raw, to_int):
        # One token-id sequence is one input, however long (it is cut to max_tokens):
        # its ids never count against max_inputs.
        ids = _token_ids(raw, "input", vocab_size, to_int)
        return None, [ids], _any_converted(raw)
    first = raw[0]
    if isinstance(first, str):
        index = next((i for i, item in enumerate(raw) if not isinstance(item, str)), None)
        if index is not None:
            raise InvalidFieldError(
                f"input[{index}] must be a string like the other items, "
                f"not {_json_type(raw[index])}.",
                param="input",
            )
        _check_input_count(len(raw), max_inputs)
        return raw, None, False
    if not isinstance(first, list):
        raise InvalidFieldError(
            f"input[0] must be a string, a token id or an array of token ids, "
            f"not {_json_type(first)}.",
            param="input",
        )
    _check_input_count(len(raw), max_inputs)
    lists = [_token_ids(item, f"input[{i}]", vocab_size, to_int) for i, item in enumerate(raw)]
    return None, lists, any(_any_converted(item) for item in raw)


def _check_input_count(count: int, max_inputs: int) -> None:
    if count > max_inputs:
        raise TooManyInputsError(
            f"'input' has {count} items; at most {max_inputs} are allowed per request.",
            param="input",
        )


def _any_converted(ids: list[Any]) -> bool:
    """True unless every id already is a JSON integer (bool is an int to Python)."""
    return any(type(token) is not int for token in ids)


def _token_ids(
    raw: Any, where: str, vocab_size: int, to_int: Callable[[Any], int | None]
) -> list[int]:
    if not isinstance(raw, list):
        raise InvalidFieldError(f"{where} must be an array of token ids.", param="input")
    if not raw:
        raise InvalidFieldError(
            f"{where} must not be an empty array of token ids.", param="input", reason="empty"
        )
    ids: list[int] = []
    for index, item in enumerate(raw):
        token = to_int(item)
        if token is None:
            raise InvalidFieldError(
                f"{where}[{index}] must be an integer token id, not {_json_type(item)}.",
                param="input",
            )
        if not 0 <= token < vocab_size:
            raise InvalidFieldError(
                f"{where}[{index}] = {token} is not a token id of this model "
                f"(valid: 0 to {vocab_size - 1}).",
                param="input",
            )
        ids.append(token)
    return ids


def _client_encoding(raw: Any, model: ModelPolicy) -> Encoding:
    if raw is None:
        return Encoding.FLOAT
    if raw not in ("float", "base64"):
        shown = raw if isinstance(raw, str) else _json_type(raw)
        raise InvalidFieldError(
            f"Unsupported encoding_format {str(shown)[:40]!r}; use 'float' or 'base64'.",
            param="encoding_format",
        )
    if not model.honours_base64:
        return Encoding.FLOAT  # the legacy server always answered float arrays
    return Encoding(raw)


def _dimensions(raw: Any, model: ModelPolicy, to_int: IntReader) -> int | None:
    if raw is None:
        return None
    dimensions = to_int(raw)
    if dimensions is None:
        raise DimensionsError(
            f"'dimensions' must be an integer, not {_json_type(raw)}.", param="dimensions"
        )
    if not model.accepts_dimensions(dimensions):
        raise DimensionsError(
            f"'dimensions' must be {model.dimensions_rule()} for model {model.name!r}; "
            f"got {_shown(raw)}.",
            param="dimensions",
            reason=model.dimensions_refusal(dimensions),
        )
    return dimensions


def _optional_str(request: dict[str, Any], field: str) -> str | None:
    value = request.get(field)
    if value is None or isinstance(value, str):
        return value
    raise InvalidFieldError(f"'{field}' must be a string, not {_json_type(value)}.", param=field)


def _truncate_prompt_tokens(raw: Any, model: ModelPolicy, to_int: IntReader) -> int | None:
    """vLLM's extension: forwarded, but a bad value is our 400, not Dynamo's 500. An
    upstream the policy says cannot apply it would ignore it or fail on it: refused."""
    if raw is None:
        return None
    if not model.upstream.native.truncate_prompt_tokens:
        raise InvalidFieldError(
            "'truncate_prompt_tokens' is not supported for this model; leave it out "
            f"(inputs over {model.max_tokens} tokens are cut to that limit anyway).",
            param="truncate_prompt_tokens",
        )
    value = to_int(raw)
    if value is None or not (value == -1 or 1 <= value <= model.max_tokens):
        raise InvalidFieldError(
            f"'truncate_prompt_tokens' must be -1 or an integer from 1 to {model.max_tokens}.",
            param="truncate_prompt_tokens",
        )
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _strict_int(value: Any) -> int | None:
    return value if _is_int(value) else None


def _shown(value: Any) -> str:
    """A client's scalar as JSON spells it, cut short (messages quote no more)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return (repr(value) if isinstance(value, str) else str(value))[:40]


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
