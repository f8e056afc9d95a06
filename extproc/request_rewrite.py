"""Client request -> upstream request plus a :class:`ResponsePlan` (sans-I/O).

Validates the body against the model's policy the way the legacy server's clients
expect, and answers every client mistake with a 4xx :class:`ApiError` before any
byte reaches the upstream. Then it turns the legacy contract into what Dynamo and
vLLM understand:

- ``input_type`` / ``instruction`` become the model's prompt prefix (stripped);
- inputs over ``max_tokens`` are cut with the model's tokenizer; when any input of
  a batch is cut the batch is sent as token ids, so the upstream sees exactly the
  tokens the legacy server kept (an upstream never adds special tokens to ids);
- ``dimensions`` below native is stripped and emulated on the response;
- ``encoding_format`` is set to what makes the response work cheapest.

When nothing changes, ``upstream_body`` is ``None``: the body is forwarded as sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from extproc.errors import ApiError, invalid_request
from extproc.plan import Encoding, RequestStats, ResponsePlan
from extproc.policy.model import EncodingProfile, GatewayPolicy, Limits, ModelPolicy
from extproc.prompts import prompt_prefix
from extproc.tokens import ModelTokenizer

# Fields the legacy contract adds and no upstream understands.
LEGACY_ONLY_FIELDS: Final = ("dimensions", "input_type", "instruction")
_JSON_TYPES: Final = ("application/json", "text/json")


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
        f"Unsupported Content-Type {media!r}; send the request as application/json.",
        type="invalid_request_error",
        code="unsupported_media_type",
    )


def check_declared_length(content_length: str | None, limits: Limits) -> None:
    """Refuse a body whose declared size is over the limit before it is buffered."""
    if content_length is not None and content_length.isdigit():
        _check_size(int(content_length), limits)


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
) -> Forward:
    """Validate and rewrite one ``POST /v1/embeddings`` body; raise ApiError for the client."""
    limits = policy.limits
    _check_size(len(body), limits)
    request = _parse_object(body)
    model = _model(request, policy)
    tokenizer = tokenizers[model.name]

    raw_input = request.get("input", _MISSING)
    if raw_input is _MISSING:
        raise invalid_request("Missing required parameter: 'input'.", param="input")
    texts, id_lists = _inputs(raw_input, limits.max_inputs, tokenizer.vocab_size)
    count = len(texts) if texts is not None else len(id_lists or ())

    client_encoding = _client_encoding(request.get("encoding_format"), model)
    dimensions = _dimensions(request.get("dimensions"), model)
    input_type = _optional_str(request, "input_type")
    instruction = _optional_str(request, "instruction")
    if instruction is not None and not instruction.strip():
        raise invalid_request("`instruction` must not be empty.", param="instruction")
    _check_truncate_prompt_tokens(request.get("truncate_prompt_tokens"), model)
    prefix = prompt_prefix(model.prompts, input_type, instruction)

    new_input, truncated, cut = _fit_inputs(texts, id_lists, prefix, model, tokenizer)

    emulate = dimensions is not None and dimensions != model.native_dimensions
    if emulate:
        upstream_encoding = Encoding.BASE64  # decoding base64 beats parsing floats
    else:
        upstream_encoding = client_encoding
    plan = ResponsePlan(
        model=model.name,
        input_count=count,
        native_dimensions=model.native_dimensions,
        flavour=model.upstream_flavour,
        client_encoding=client_encoding,
        upstream_encoding=upstream_encoding,
        dimensions=dimensions if emulate else None,
    )
    stripped = [f for f in LEGACY_ONLY_FIELDS if f in request]
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
    changed = (
        bool(stripped)
        or new_input is not None
        or model.upstream_model != model.name
        or sent_encoding != upstream_encoding.value
    )
    if not changed:
        return Forward(upstream_body=None, plan=plan, stats=stats)

    upstream = {k: v for k, v in request.items() if k not in LEGACY_ONLY_FIELDS}
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


def _parse_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise invalid_request("The request body is empty; send a JSON object.", code="invalid_json")
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise invalid_request(
            f"The request body is not valid JSON: {exc}.", code="invalid_json"
        ) from None
    if not isinstance(request, dict):
        raise invalid_request(
            f"The request body must be a JSON object, not {_json_type(request)}.",
            code="invalid_json",
        )
    return request


def _model(request: dict[str, Any], policy: GatewayPolicy) -> ModelPolicy:
    name = request.get("model")
    if name is None:
        raise invalid_request("Missing required parameter: 'model'.", param="model")
    if not isinstance(name, str):
        raise invalid_request(f"'model' must be a string, not {_json_type(name)}.", param="model")
    model = policy.model(name)
    if model is None:
        shown = name if len(name) <= 200 else name[:200] + "..."
        raise ApiError(
            404,
            f"The model {shown!r} does not exist; this gateway serves: "
            + ", ".join(sorted(policy.models))
            + ".",
            type="invalid_request_error",
            param="model",
            code="model_not_found",
        )
    return model


def _inputs(
    raw: Any, max_inputs: int, vocab_size: int
) -> tuple[list[str] | None, list[list[int]] | None]:
    """Exactly one of (texts, token-id lists) comes back, never empty."""
    if isinstance(raw, str):
        return [raw], None
    if not isinstance(raw, list):
        raise invalid_request(
            f"'input' must be a string, an array of strings, or token ids; got {_json_type(raw)}.",
            param="input",
        )
    if not raw:
        raise invalid_request("'input' must not be an empty array.", param="input")
    if len(raw) > max_inputs:
        raise invalid_request(
            f"'input' has {len(raw)} items; at most {max_inputs} are allowed per request.",
            param="input",
        )
    first = raw[0]
    if isinstance(first, str):
        for index, item in enumerate(raw):
            if not isinstance(item, str):
                raise invalid_request(
                    f"input[{index}] must be a string like the other items, "
                    f"not {_json_type(item)}.",
                    param="input",
                )
        return raw, None
    if _is_int(first):  # one token-id sequence
        return None, [_token_ids(raw, "input", vocab_size)]
    if isinstance(first, list):
        return None, [_token_ids(item, f"input[{i}]", vocab_size) for i, item in enumerate(raw)]
    raise invalid_request(
        f"input[0] must be a string, a token id or an array of token ids, not {_json_type(first)}.",
        param="input",
    )


def _token_ids(raw: Any, where: str, vocab_size: int) -> list[int]:
    if not isinstance(raw, list):
        raise invalid_request(f"{where} must be an array of token ids.", param="input")
    if not raw:
        raise invalid_request(f"{where} must not be an empty array of token ids.", param="input")
    for index, token in enumerate(raw):
        if not _is_int(token):
            raise invalid_request(
                f"{where}[{index}] must be an integer token id, not {_json_type(token)}.",
                param="input",
            )
        if not 0 <= token < vocab_size:
            raise invalid_request(
                f"{where}[{index}] = {token} is not a token id of this model "
                f"(valid: 0 to {vocab_size - 1}).",
                param="input",
            )
    return raw


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


def _dimensions(raw: Any, model: ModelPolicy) -> int | None:
    if raw is None:
        return None
    if not _is_int(raw):
        raise invalid_request(
            f"'dimensions' must be an integer, not {_json_type(raw)}.", param="dimensions"
        )
    if not model.accepts_dimensions(raw):
        raise invalid_request(
            f"'dimensions' must be {model.dimensions_rule()} for model {model.name!r}; got {raw}.",
            param="dimensions",
        )
    return int(raw)


def _optional_str(request: dict[str, Any], field: str) -> str | None:
    value = request.get(field)
    if value is None or isinstance(value, str):
        return value
    raise invalid_request(f"'{field}' must be a string, not {_json_type(value)}.", param=field)


def _check_truncate_prompt_tokens(raw: Any, model: ModelPolicy) -> None:
    """vLLM's extension: forwarded, but a bad value is our 400, not Dynamo's 500."""
    if raw is None:
        return
    if not _is_int(raw) or not (raw == -1 or 1 <= raw <= model.max_tokens):
        raise invalid_request(
            f"'truncate_prompt_tokens' must be -1 or an integer from 1 to {model.max_tokens}.",
            param="truncate_prompt_tokens",
        )


def _fit_inputs(
    texts: list[str] | None,
    id_lists: list[list[int]] | None,
    prefix: str,
    model: ModelPolicy,
    tokenizer: ModelTokenizer,
) -> tuple[list[str] | list[list[int]] | None, int, int]:
    """(new input or None if unchanged, inputs truncated, tokens cut)."""
    limit = model.max_tokens
    if id_lists is not None:
        prefix_ids = tokenizer.encode([prefix])[0] if prefix else []
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
    suspects = [
        i for i, p in enumerate(prompts) if not tokenizer.certainly_fits(p, limit - specials)
    ]
    if not suspects:
        return (prompts if prefix else None), 0, 0
    # One token past the budget is enough to know an input is over the limit; long
    # inputs are tokenized only that far (ModelTokenizer.encode_heads).
    counted = tokenizer.encode_heads([prompts[i] for i in suspects], limit - specials + 1)
    over = {i: ids for i, ids in zip(suspects, counted, strict=True) if len(ids) + specials > limit}
    if not over:
        return (prompts if prefix else None), 0, 0
    # Some input is too long: send the whole batch as token ids (an input must be
    # all strings or all ids), each framed exactly as the upstream would frame text.
    all_ids = dict(zip(suspects, counted, strict=True))
    rest = [i for i in range(len(prompts)) if i not in all_ids]
    all_ids.update(zip(rest, tokenizer.encode([prompts[i] for i in rest]), strict=True))
    # At least this many: a long input's tail is never tokenized.
    cut = sum(len(ids) + specials - limit for ids in over.values())
    return [tokenizer.frame(all_ids[i], limit) for i in range(len(prompts))], len(over), cut


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
