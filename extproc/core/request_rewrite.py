"""Client request -> upstream request plus a :class:`ResponsePlan` (sans-I/O).

Validates the body against the model's policy the way the legacy server's clients
expect, and answers every client mistake with a 4xx :class:`ApiError` before any
byte reaches the upstream. Then it turns the legacy contract into what Dynamo and
vLLM understand:

- ``input_type`` / ``instruction`` become the model's prompt prefix (stripped);
- inputs over ``max_tokens`` are cut with the model's tokenizer; when any input of
  a batch is cut the batch is sent as token ids, so the upstream sees exactly the
  tokens the legacy server kept (an upstream never adds special tokens to ids);
- ``dimensions`` below native is forwarded to an upstream the policy says cuts
  itself (``upstream.native.dimensions``), else stripped and emulated on the response;
- ``encoding_format`` is set to what makes the response work cheapest.

When nothing changes, ``upstream_body`` is ``None``: the body is forwarded as sent.
Because of that, what the gateway validated must be exactly what the upstream will
read: a key repeated in any JSON object of the body is a 400 (parsers disagree on
which copy wins), and a field the gateway does not interpret is forwarded only if it
could also be re-serialized (nested at most 253 levels below the body).

Field types follow the model's encoding profile. ``openai`` is strict: integers are
JSON integers, token ids too. ``legacy`` accepts what the legacy server's FastAPI
request model accepted in pydantic's lax mode (:mod:`extproc.core.lax`: ``256.0``,
``"256"``, token ids ``[1.0, "2"]``) and a UTF-8 byte order mark before the body; the
upstream gets the converted values, never the client's spelling. In both profiles a
top-level ``null`` means the field is absent: it is never forwarded (vLLM refuses
``"encoding_format": null``, and an absent field is every upstream's default).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from extproc.core.errors import ApiError, invalid_request, quoted
from extproc.core.lax import lax_int
from extproc.core.plan import Encoding, RequestStats, ResponsePlan
from extproc.core.policy.model import EncodingProfile, GatewayPolicy, Limits, ModelPolicy
from extproc.core.prompts import prompt_prefix
from extproc.core.request_coding import BodyCoding
from extproc.core.tokens import (
    MAX_PREFIX_BYTES,
    BudgetReason,
    ModelTokenizer,
    TokenizeBudget,
    TokenizeBudgetError,
)
from extproc.core.upstreams import adapter_for

# Fields the legacy contract adds and no upstream understands.
LEGACY_ONLY_FIELDS: Final = ("dimensions", "input_type", "instruction")
_JSON_TYPES: Final = ("application/json", "text/json")
_UTF8_BOM: Final = b"\xef\xbb\xbf"
# Every top-level field rewrite_request reads and type-checks; others go upstream as sent.
_INTERPRETED_FIELDS: Final = frozenset(
    {*LEGACY_ONLY_FIELDS, "model", "input", "encoding_format", "truncate_prompt_tokens", "user"}
)


@dataclass(frozen=True)
class Forward:
    """Send the request upstream (rewritten when ``upstream_body`` is set)."""

    upstream_body: bytes | None
    plan: ResponsePlan
    stats: RequestStats


def check_content_type(content_type: str | None) -> None:
    """Only JSON bodies (or none declared) are embeddings requests."""
    if content_type is None:
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media in _JSON_TYPES or media.endswith("+json"):
        return
    raise ApiError(
        415,
        f"Unsupported Content-Type {quoted(media)}; send the request as application/json.",
        type="invalid_request_error",
        code="unsupported_media_type",
    )


def declared_length(content_length: str | None) -> int | None:
    """The body size a ``Content-Length`` value declares, or None when it declares
    none (absent: a chunked or HTTP/2 body of unknown length)."""
    # ASCII digits only: str.isdigit() also takes '²' (a latin-1 header byte), which
    # int() refuses, and int() refuses more than 4,300 digits: neither may raise here.
    # A value with more digits than any limit is over it. Envoy refuses anything else
    # before it gets here.
    if content_length is None or not (content_length.isascii() and content_length.isdigit()):
        return None
    digits = content_length.lstrip("0") or "0"
    return int(digits) if len(digits) <= 20 else 10**20


def check_declared_length(content_length: str | None, limits: Limits) -> None:
    """Refuse a body whose declared size is over the limit before it is buffered."""
    size = declared_length(content_length)
    if size is not None:
        _check_size(size, limits)


def _check_size(size: int, limits: Limits) -> None:
    if size > limits.max_request_bytes:
        raise ApiError(
            413,
            f"Request body is {size} bytes; the limit is {limits.max_request_bytes}.",
            type="invalid_request_error",
            code="request_too_large",
        )


def rewrite_request(
    body: bytes,
    policy: GatewayPolicy,
    tokenizers: Mapping[str, ModelTokenizer],
    *,
    coding: BodyCoding | None = None,
) -> Forward:
    """Validate and rewrite one ``POST /v1/embeddings`` body; raise ApiError for the client.

    ``coding``: how the body was sent, when Envoy decoded it (its errors say so)."""
    limits = policy.limits
    if coding is not None:
        coding.check(body, limits.max_request_bytes)
    _check_size(len(body), limits)
    bom = body.startswith(_UTF8_BOM)
    request = _parse_object(body[len(_UTF8_BOM) :] if bom else body, coding)
    model = _model(request, policy)
    lenient = model.encoding_profile is EncodingProfile.LEGACY
    if bom and not lenient:
        raise invalid_request(
            "The request body starts with a byte order mark; send plain UTF-8 JSON.",
            code="invalid_json",
        )
    tokenizer = tokenizers[model.name]
    # Fields whose value the upstream must get converted (legacy profile only).
    converted: dict[str, Any] = {}

    raw_input = request.get("input", _MISSING)
    if raw_input is _MISSING:
        raise invalid_request("Missing required parameter: 'input'.", param="input")
    texts, id_lists, ids_converted = _inputs(
        raw_input, limits.max_inputs, tokenizer.vocab_size, lenient=lenient
    )
    count = len(texts) if texts is not None else len(id_lists or ())
    if ids_converted:
        assert id_lists is not None
        converted["input"] = id_lists if isinstance(raw_input[0], list) else id_lists[0]

    client_encoding = _client_encoding(request.get("encoding_format"), model)
    dimensions = _dimensions(request.get("dimensions"), model, lenient=lenient)
    input_type = _optional_str(request, "input_type")
    instruction = _optional_str(request, "instruction")
    if instruction is not None and not instruction.strip():
        raise invalid_request("`instruction` must not be empty.", param="instruction")
    truncate = request.get("truncate_prompt_tokens")
    truncate_to = _truncate_prompt_tokens(truncate, model, lenient=lenient)
    if truncate_to is not None and type(truncate) is not int:
        converted["truncate_prompt_tokens"] = truncate_to
    # OpenAI's end-user id is forwarded as sent; Dynamo and vLLM both refuse a
    # non-string with their own 400 - after it reached them. Answered here instead.
    _optional_str(request, "user")
    _check_uninterpreted_fields(request)
    prefix = prompt_prefix(model.prompts, input_type, instruction)
    _check_text_sizes(texts, count, prefix, limits, single=isinstance(raw_input, str))

    # Started here, after parsing: the deadline is for tokenizing alone.
    budget = TokenizeBudget(limits.max_tokenize_bytes, limits.max_tokenize_ms / 1000)
    try:
        new_input, truncated, cut = _fit_inputs(
            texts, id_lists, prefix, model, tokenizer, budget=budget
        )
    except TokenizeBudgetError as exc:
        raise _over_budget(exc, limits, model) from None

    below_native = dimensions is not None and dimensions != model.native_dimensions
    # An upstream that cuts itself gets `dimensions` forwarded and answers the vectors
    # the client asked for, in the client's encoding: no response rewrite. (A size
    # below native passed _dimensions only for a Matryoshka model.)
    emulate = below_native and model.emulates_dimensions
    forwarded = dimensions if below_native and not emulate else None
    if emulate:
        upstream_encoding = Encoding(adapter_for(model.upstream.kind).vectors_encoding)
    else:
        upstream_encoding = client_encoding
    plan = ResponsePlan(
        model=model.name,
        input_count=count,
        # The width the upstream answers: what a checked response is read against.
        native_dimensions=model.native_dimensions if forwarded is None else forwarded,
        upstream_kind=model.upstream.kind,
        client_encoding=client_encoding,
        upstream_encoding=upstream_encoding,
        dimensions=dimensions if emulate else None,
        check_only=model.check_responses,
    )
    kept = () if forwarded is None else ("dimensions",)
    stripped = [f for f in LEGACY_ONLY_FIELDS if f in request and f not in kept]
    stats = RequestStats(
        inputs=count,
        prompted=bool(prefix),
        truncated_inputs=truncated,
        tokens_cut=cut,
        dimensions_emulated=emulate,
        fields_stripped=len(stripped),
    )

    requested_encoding = request.get("encoding_format")
    sent_encoding = requested_encoding if requested_encoding is not None else Encoding.FLOAT.value
    nulls = any(value is None for value in request.values())
    changed = (
        bom
        or nulls
        or bool(converted)
        or bool(stripped)
        # A forwarded size the client spelled leniently ("256", 256.0) goes up as an int.
        or (forwarded is not None and type(request.get("dimensions")) is not int)
        or new_input is not None
        or model.upstream_model != model.name
        or sent_encoding != upstream_encoding.value
    )
    if not changed:
        return Forward(upstream_body=None, plan=plan, stats=stats)

    # null means absent: never forwarded (an absent field is every upstream's default).
    upstream = {k: v for k, v in request.items() if k not in stripped and v is not None}
    upstream.update(converted)
    if forwarded is not None:
        upstream["dimensions"] = forwarded  # the validated integer, never the client's spelling
    upstream["model"] = model.upstream_model
    if new_input is not None:
        upstream["input"] = new_input
    if upstream_encoding is Encoding.FLOAT:
        upstream.pop("encoding_format", None)  # float is every upstream's default
    else:
        upstream["encoding_format"] = upstream_encoding.value
    return Forward(upstream_body=orjson.dumps(upstream), plan=plan, stats=stats)


class _Missing:
    pass


_MISSING: Final = _Missing()


def _parse_object(body: bytes, coding: BodyCoding | None = None) -> dict[str, Any]:
    if not body.strip():
        if coding is not None:
            raise coding.empty(len(body))
        raise invalid_request("The request body is empty; send a JSON object.", code="invalid_json")
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if coding is not None:
            raise coding.not_json(len(body), str(exc)) from None
        raise invalid_request(
            f"The request body is not valid JSON: {exc}.", code="invalid_json"
        ) from None
    if not isinstance(request, dict):
        raise invalid_request(
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
    more parse: ~0.1 s for 8 MB of text, ~10 us for the seed's batch of 8 documents).
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
    if top is not None and top in _INTERPRETED_FIELDS:
        raise invalid_request(
            f"'{top}' appears more than once in the request body; send each field once.",
            param=top,
        )
    repeated = next((key for key in reversed(repeats) if key is not None), None)
    if repeated is not None:
        # Not a param: metrics labels come from fixed sets, and this key is the client's.
        raise invalid_request(
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
    # bytes.replace of one byte runs at memchr speed, bytes.count byte by byte: 3-5x
    # faster here (measured on 4 KB and 870 KB bodies).
    return len(data) - len(data.replace(b":", b""))


def _check_uninterpreted_fields(request: dict[str, Any]) -> None:
    """A field the gateway does not interpret is forwarded as sent, but only if the
    gateway could also re-serialize it (orjson writes at most 254 nested arrays and
    objects, the body included; Dynamo's parser stops at 128): the same rule whether
    or not this body gets rewritten, instead of a 500 only when it does."""
    for key, value in request.items():
        if key in _INTERPRETED_FIELDS or not isinstance(value, list | dict):
            continue
        try:
            orjson.dumps({key: value})  # the depth the field has in the upstream body
        except orjson.JSONEncodeError:
            raise _too_deep(f"The field {key[:40]!r}") from None


def _too_deep(what: str) -> ApiError:
    return invalid_request(
        f"{what} nests arrays or objects too deeply (at most 253 levels below the body).",
        code="invalid_json",
    )


def _model(request: dict[str, Any], policy: GatewayPolicy) -> ModelPolicy:
    name = request.get("model")
    if name is None:
        raise invalid_request("Missing required parameter: 'model'.", param="model")
    if not isinstance(name, str):
        raise invalid_request(f"'model' must be a string, not {_json_type(name)}.", param="model")
    model = policy.model(name)
    if model is None:
        raise ApiError(
            404,
            f"The model {quoted(name)} does not exist; this gateway serves: "
            + ", ".join(sorted(policy.models))
            + ".",
            type="invalid_request_error",
            param="model",
            code="model_not_found",
        )
    return model


def _inputs(
    raw: Any, max_inputs: int, vocab_size: int, *, lenient: bool
) -> tuple[list[str] | None, list[list[int]] | None, bool]:
    """(texts, token-id lists, whether any token id was converted): exactly one of the
    first two comes back, never empty.

    The forms are OpenAI's: a string, strings, one token-id sequence, token-id
    sequences. ``lenient`` reads token ids as the legacy server's lax model would
    (``1.0``, ``"1"``, ``true``); strings are never numbers' spellings: an array of
    strings is texts.
    """
    to_int = lax_int if lenient else _strict_int
    if isinstance(raw, str):
        return [raw], None, False
    if not isinstance(raw, list):
        raise invalid_request(
            f"'input' must be a string, an array of strings, or token ids; got {_json_type(raw)}.",
            param="input",
        )
    if not raw:
        raise invalid_request("'input' must not be an empty array.", param="input")
    first = raw[0]
    if isinstance(first, list):
        nested = True
    elif isinstance(first, str) and all(isinstance(item, str) for item in raw):
        _check_input_count(len(raw), max_inputs)
        return raw, None, False
    elif to_int(first) is not None:
        nested = False
    elif isinstance(first, str):
        nested = False  # strings, then something else: refused below
    else:
        raise invalid_request(
            f"input[0] must be a string, a token id or an array of token ids, "
            f"not {_json_type(first)}.",
            param="input",
        )
    if not nested:
        # One token-id sequence is one input, however long (it is cut to max_tokens):
        # counting its ids as inputs refused e.g. 3,000 ids with "at most 2048".
        if isinstance(first, str) and (not lenient or to_int(first) is None):
            index = next(i for i, item in enumerate(raw) if not isinstance(item, str))
            raise invalid_request(
                f"input[{index}] must be a string like the other items, "
                f"not {_json_type(raw[index])}.",
                param="input",
            )
        ids = _token_ids(raw, "input", vocab_size, to_int)
        return None, [ids], _any_converted(raw)
    _check_input_count(len(raw), max_inputs)
    lists = [_token_ids(item, f"input[{i}]", vocab_size, to_int) for i, item in enumerate(raw)]
    return None, lists, any(_any_converted(item) for item in raw)


def _check_input_count(count: int, max_inputs: int) -> None:
    if count > max_inputs:
        raise invalid_request(
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
        raise invalid_request(f"{where} must be an array of token ids.", param="input")
    if not raw:
        raise invalid_request(f"{where} must not be an empty array of token ids.", param="input")
    ids: list[int] = []
    for index, item in enumerate(raw):
        token = to_int(item)
        if token is None:
            raise invalid_request(
                f"{where}[{index}] must be an integer token id, not {_json_type(item)}.",
                param="input",
            )
        if not 0 <= token < vocab_size:
            raise invalid_request(
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
        raise invalid_request(
            f"Unsupported encoding_format {str(shown)[:40]!r}; use 'float' or 'base64'.",
            param="encoding_format",
        )
    if model.encoding_profile is EncodingProfile.LEGACY:
        return Encoding.FLOAT  # the legacy server always answered float arrays
    return Encoding(raw)


def _dimensions(raw: Any, model: ModelPolicy, *, lenient: bool) -> int | None:
    if raw is None:
        return None
    dimensions = lax_int(raw) if lenient else _strict_int(raw)
    if dimensions is None:
        raise invalid_request(
            f"'dimensions' must be an integer, not {_json_type(raw)}.", param="dimensions"
        )
    if not model.accepts_dimensions(dimensions):
        raise invalid_request(
            f"'dimensions' must be {model.dimensions_rule()} for model {model.name!r}; "
            f"got {_shown(raw)}.",
            param="dimensions",
        )
    return dimensions


def _optional_str(request: dict[str, Any], field: str) -> str | None:
    value = request.get(field)
    if value is None or isinstance(value, str):
        return value
    raise invalid_request(f"'{field}' must be a string, not {_json_type(value)}.", param=field)


def _truncate_prompt_tokens(raw: Any, model: ModelPolicy, *, lenient: bool) -> int | None:
    """vLLM's extension: forwarded, but a bad value is our 400, not Dynamo's 500."""
    if raw is None:
        return None
    value = lax_int(raw) if lenient else _strict_int(raw)
    if value is None or not (value == -1 or 1 <= value <= model.max_tokens):
        raise invalid_request(
            f"'truncate_prompt_tokens' must be -1 or an integer from 1 to {model.max_tokens}.",
            param="truncate_prompt_tokens",
        )
    return value


def _check_text_sizes(
    texts: list[str] | None, count: int, prefix: str, limits: Limits, *, single: bool
) -> None:
    """The character caps, before any prompt is built or anything is tokenized.

    The total counts each input with the prompt prefix it will get: the prefix is
    copied in front of every input, so a long ``instruction`` times 2,048 inputs
    would otherwise be gigabytes from an 8 MB body. Messages give counts, never text.
    """
    lengths = list(map(len, texts or ()))
    if lengths and max(lengths) > limits.max_input_chars:
        index = next(i for i, n in enumerate(lengths) if n > limits.max_input_chars)
        where = "'input'" if single else f"input[{index}]"
        raise invalid_request(
            f"{where} has {lengths[index]} characters; at most {limits.max_input_chars} "
            "are allowed per input.",
            param="input",
            code="input_too_long",
        )
    total = sum(lengths) + count * len(prefix)
    if total > limits.max_total_chars:
        prompts = f", {count} x {len(prefix)} of them the prompt" if prefix else ""
        raise ApiError(
            413,
            f"The inputs have {total} characters{prompts}; at most "
            f"{limits.max_total_chars} are allowed per request.",
            type="invalid_request_error",
            param="input",
            code="request_too_large",
        )


def _over_budget(exc: TokenizeBudgetError, limits: Limits, model: ModelPolicy) -> ApiError:
    """The 413 for a request whose tokenization would cross its budget."""
    if exc.reason is BudgetReason.TIME:
        message = (
            f"Tokenizing the inputs took longer than {limits.max_tokenize_ms} ms (stopped "
            f"after {exc.spent} bytes); send fewer or shorter inputs per request."
        )
    elif exc.reason is BudgetReason.WORD:
        message = (
            f"input[{exc.index}] cannot be cut to {model.max_tokens} tokens without "
            f"tokenizing more than {MAX_PREFIX_BYTES} bytes of it (its words are too long); "
            "send it shorter."
        )
    else:
        message = (
            f"The inputs need at least {exc.needed} bytes of tokenization; the gateway "
            f"tokenizes at most {limits.max_tokenize_bytes} per request (inputs that may be "
            f"over {model.max_tokens} tokens, and then the whole batch). Send fewer or "
            "shorter inputs per request."
        )
    return ApiError(
        413, message, type="invalid_request_error", param="input", code="request_too_large"
    )


def _fit_inputs(
    texts: list[str] | None,
    id_lists: list[list[int]] | None,
    prefix: str,
    model: ModelPolicy,
    tokenizer: ModelTokenizer,
    *,
    budget: TokenizeBudget,
) -> tuple[list[str] | list[list[int]] | None, int, int]:
    """(new input or None if unchanged, inputs truncated, tokens cut).

    Every tokenizer call is charged to ``budget`` (raises TokenizeBudgetError).
    """
    limit = model.max_tokens
    if id_lists is not None:
        prefix_ids = tokenizer.encode([prefix], budget)[0] if prefix else []
        fitted: list[list[int]] = []
        truncated = cut = 0
        for ids in id_lists:
            full = [*prefix_ids, *ids]
            if len(full) > limit:
                # Keep the head; keep the model's end tokens if the client sent them.
                tail = list(tokenizer.append_ids)
                keep_tail = bool(tail) and full[-len(tail) :] == tail
                head = full[: limit - len(tail)] if keep_tail else full[:limit]
                truncated += 1
                cut += len(full) - limit
                full = [*head, *tail] if keep_tail else head
            fitted.append(full)
        changed = bool(prefix_ids) or truncated > 0
        return (fitted if changed else None), truncated, cut

    assert texts is not None
    prompts = [prefix + t for t in texts] if prefix else texts
    specials = tokenizer.special_count
    suspects = tokenizer.uncertain(prompts, limit - specials)
    if not suspects:
        return (prompts if prefix else None), 0, 0
    # One token past the budget is enough to know an input is over the limit; long
    # inputs are tokenized only that far (ModelTokenizer.encode_heads).
    try:
        counted = tokenizer.encode_heads(
            [prompts[i] for i in suspects], limit - specials + 1, budget
        )
    except TokenizeBudgetError as exc:
        if exc.index is None:
            raise
        # Its position among the suspects -> its position in the request.
        raise TokenizeBudgetError(
            exc.reason, needed=exc.needed, spent=exc.spent, index=suspects[exc.index]
        ) from None
    over = {i: ids for i, ids in zip(suspects, counted, strict=True) if len(ids) + specials > limit}
    if not over:
        return (prompts if prefix else None), 0, 0
    # Some input is too long: send the whole batch as token ids (an input must be
    # all strings or all ids), each framed exactly as the upstream would frame text.
    all_ids = dict(zip(suspects, counted, strict=True))
    rest = [i for i in range(len(prompts)) if i not in all_ids]
    all_ids.update(zip(rest, tokenizer.encode([prompts[i] for i in rest], budget), strict=True))
    # At least this many: a long input's tail is never tokenized.
    cut = sum(len(ids) + specials - limit for ids in over.values())
    return [tokenizer.frame(all_ids[i], limit) for i in range(len(prompts))], len(over), cut


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
