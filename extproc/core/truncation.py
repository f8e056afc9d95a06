"""Fitting a request's inputs to the model's ``max_tokens``, within its budgets (sans-I/O).

Inputs over ``max_tokens`` are cut with the model's tokenizer as the legacy server
cut them (:mod:`extproc.core.tokens`: the head of the content, framed with the
model's special tokens). When any input of a batch is cut the whole batch is sent
as token ids, so the upstream sees exactly the tokens the gateway kept (an upstream
never adds special tokens to ids). A prompt prefix is part of each input: prefix
and input are fitted together.

What a request may cost is bounded before and during tokenization: characters per
input and in all (prompts counted), then bytes handed to the tokenizer and
wall-clock time (:class:`TokenizeBudget`). Each bound crossed is a 413 that gives
counts, never text.
"""

from __future__ import annotations

from dataclasses import dataclass

from extproc.core.error_envelope import ApiError, invalid_request
from extproc.core.policy.model import Limits
from extproc.core.tokens import (
    MAX_PREFIX_BYTES,
    BudgetReason,
    ModelTokenizer,
    TokenizeBudget,
    TokenizeBudgetError,
)


@dataclass(frozen=True)
class FittedInputs:
    """What fitting did to a request's inputs."""

    input: list[str] | list[list[int]] | None  # what the upstream gets; None: as sent
    truncated: int  # inputs cut to max_tokens
    tokens_cut: int  # at least; see ModelTokenizer.encode_heads


def fit_inputs(
    texts: list[str] | None,
    token_ids: list[list[int]] | None,
    *,
    prefix: str,
    max_tokens: int,
    tokenizer: ModelTokenizer,
    limits: Limits,
    single: bool,
) -> FittedInputs:
    """``texts`` or ``token_ids`` (exactly one), each with ``prefix`` in front, fitted
    to ``max_tokens``; raise a 413 ApiError for a request over its budgets.

    ``single``: the input was one string (messages then name it 'input')."""
    count = len(texts) if texts is not None else len(token_ids or ())
    _check_text_sizes(texts, count, prefix, limits, single=single)
    # Started here, after parsing: the deadline is for tokenizing alone.
    budget = TokenizeBudget(limits.max_tokenize_bytes, limits.max_tokenize_ms / 1000)
    try:
        return _fit(texts, token_ids, prefix, max_tokens, tokenizer, budget=budget)
    except TokenizeBudgetError as exc:
        raise _over_budget(exc, limits, max_tokens) from None


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


def _over_budget(exc: TokenizeBudgetError, limits: Limits, max_tokens: int) -> ApiError:
    """The 413 for a request whose tokenization would cross its budget."""
    if exc.reason is BudgetReason.TIME:
        message = (
            f"Tokenizing the inputs took longer than {limits.max_tokenize_ms} ms (stopped "
            f"after {exc.spent} bytes); send fewer or shorter inputs per request."
        )
    elif exc.reason is BudgetReason.WORD:
        message = (
            f"input[{exc.index}] cannot be cut to {max_tokens} tokens without "
            f"tokenizing more than {MAX_PREFIX_BYTES} bytes of it (its words are too long); "
            "send it shorter."
        )
    else:
        message = (
            f"The inputs need at least {exc.needed} bytes of tokenization; the gateway "
            f"tokenizes at most {limits.max_tokenize_bytes} per request (inputs that may be "
            f"over {max_tokens} tokens, and then the whole batch). Send fewer or "
            "shorter inputs per request."
        )
    return ApiError(
        413, message, type="invalid_request_error", param="input", code="request_too_large"
    )


def _fit(
    texts: list[str] | None,
    id_lists: list[list[int]] | None,
    prefix: str,
    limit: int,
    tokenizer: ModelTokenizer,
    *,
    budget: TokenizeBudget,
) -> FittedInputs:
    """Every tokenizer call is charged to ``budget`` (raises TokenizeBudgetError)."""
    if id_lists is not None:
        # Token ids: the prefix's ids in front, each cut to ``limit``.
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
        return FittedInputs(fitted if changed else None, truncated, cut)

    # Texts: prompted, and all sent as token ids when any is over ``limit``.
    assert texts is not None
    prompts = [prefix + t for t in texts] if prefix else texts
    unchanged = FittedInputs(prompts if prefix else None, 0, 0)
    specials = tokenizer.special_count
    suspects = tokenizer.uncertain(prompts, limit - specials)
    if not suspects:
        return unchanged
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
        return unchanged
    # Some input is too long: send the whole batch as token ids (an input must be
    # all strings or all ids), each framed exactly as the upstream would frame text.
    all_ids = dict(zip(suspects, counted, strict=True))
    rest = [i for i in range(len(prompts)) if i not in all_ids]
    all_ids.update(zip(rest, tokenizer.encode([prompts[i] for i in rest], budget), strict=True))
    # At least this many: a long input's tail is never tokenized.
    cut = sum(len(ids) + specials - limit for ids in over.values())
    framed = [tokenizer.frame(all_ids[i], limit) for i in range(len(prompts))]
    return FittedInputs(framed, len(over), cut)
