"""Fitting a request's inputs to the model's ``max_tokens``, within its budgets (sans-I/O).

Inputs over ``max_tokens`` are cut with the model's tokenizer as the legacy server
cut them (the policy's ``truncation``: from the right by default, keeping the head of
the content framed with the model's special tokens; or from the left, or with the
framed ids cut so the special tokens on the cut side are lost), or refused. When
any input of a batch is cut the whole batch is sent as token ids, so the upstream
sees exactly the tokens the gateway kept (an upstream never adds special tokens to
ids). A prompt prefix is part of each input: prefix and input are fitted together
(a cut from the left takes the prompt first, as the legacy server's did).

What a request may cost is bounded before and during tokenization: characters per
input and in all (prompts counted), then bytes handed to the tokenizer and
wall-clock time (:class:`TokenizeBudget`). Each bound crossed is a 413 that gives
counts, never text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from extproc.core.api_errors import (
    TOO_LONG_CODE,
    ApiError,
    InvalidFieldError,
    TooLargeError,
    TooLongError,
)
from extproc.core.policy.model import CutSide, Limits, Truncation
from extproc.core.tokens import (
    MAX_PREFIX_BYTES,
    BudgetReason,
    ModelTokenizer,
    TokenizeBudget,
    TokenizeBudgetError,
)

_RIGHT = Truncation()


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
    clock: Callable[[], float],
    truncation: Truncation = _RIGHT,
) -> FittedInputs:
    """``texts`` or ``token_ids`` (exactly one), each with ``prefix`` in front, fitted
    to ``max_tokens`` as ``truncation`` says; raise a 413 ApiError for a request over
    its budgets, a 400 for an input over ``max_tokens`` that the policy refuses.
    ``clock`` (seconds, monotonic) times the tokenizing against the time budget.

    ``single``: the input was one string (messages then name it 'input')."""
    count = len(texts) if texts is not None else len(token_ids or ())
    _check_text_sizes(texts, count, prefix, limits, single=single)
    # Started here, after parsing: the deadline is for tokenizing alone.
    budget = TokenizeBudget(limits.max_tokenize_bytes, limits.max_tokenize_ms / 1000, clock=clock)
    cut = _Cut(max_tokens, tokenizer.prepend_ids, tokenizer.append_ids, truncation, single)
    try:
        return _fit(texts, token_ids, prefix, cut, tokenizer, budget=budget)
    except TokenizeBudgetError as exc:
        raise _over_budget(exc, limits, max_tokens) from None


@dataclass(frozen=True)
class _Cut:
    """How one request's inputs are cut to ``limit`` tokens."""

    limit: int
    prepend: Sequence[int]
    append: Sequence[int]
    truncation: Truncation
    single: bool

    def framed(self, content: Sequence[int]) -> list[int]:
        """Text content's ids (prompt included) framed with the special tokens and cut
        to the limit."""
        t = self.truncation
        if t.keep_special_tokens:
            room = self.limit - len(self.prepend) - len(self.append)
            kept = (
                content[:room]
                if t.side is CutSide.RIGHT
                else content[max(0, len(content) - room) :]
            )
            return [*self.prepend, *kept, *self.append]
        whole = [*self.prepend, *content, *self.append]
        return whole[: self.limit] if t.side is CutSide.RIGHT else whole[-self.limit :]

    def ids(self, full: list[int]) -> list[int]:
        """A client's token ids (prompt ids in front) cut to the limit. The special
        tokens on the cut side are kept when the policy keeps them and the client sent them."""
        t = self.truncation
        if t.side is CutSide.RIGHT:
            tail = list(self.append) if t.keep_special_tokens else []
            if tail and full[-len(tail) :] == tail:
                return [*full[: self.limit - len(tail)], *tail]
            return full[: self.limit]
        head = list(self.prepend) if t.keep_special_tokens else []
        if head and full[: len(head)] == head:
            return [*head, *full[len(full) - (self.limit - len(head)) :]]
        return full[-self.limit :]

    def refuse(self, index: int) -> ApiError:
        where = "'input'" if self.single else f"input[{index}]"
        return TooLongError(
            f"{where} is longer than the model's {self.limit} tokens (prompt and special "
            "tokens included); send it shorter.",
            param="input",
            code=TOO_LONG_CODE,
        )


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
        raise InvalidFieldError(
            f"{where} has {lengths[index]} characters; at most {limits.max_input_chars} "
            "are allowed per input.",
            param="input",
            code="input_too_long",
        )
    total = sum(lengths) + count * len(prefix)
    if total > limits.max_total_chars:
        prompts = f", {count} x {len(prefix)} of them the prompt" if prefix else ""
        raise TooLargeError(
            f"The inputs have {total} characters{prompts}; at most "
            f"{limits.max_total_chars} are allowed per request.",
            param="input",
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
    return TooLargeError(message, param="input")


def _fit(
    texts: list[str] | None,
    id_lists: list[list[int]] | None,
    prefix: str,
    cut: _Cut,
    tokenizer: ModelTokenizer,
    *,
    budget: TokenizeBudget,
) -> FittedInputs:
    """Every tokenizer call is charged to ``budget`` (raises TokenizeBudgetError)."""
    limit = cut.limit
    if id_lists is not None:
        # Token ids: the prefix's ids in front, each cut to ``limit``.
        prefix_ids = tokenizer.encode([prefix], budget)[0] if prefix else []
        fitted: list[list[int]] = []
        truncated = removed = 0
        for index, ids in enumerate(id_lists):
            full = [*prefix_ids, *ids]
            if len(full) > limit:
                if cut.truncation.refuse:
                    raise cut.refuse(index)
                truncated += 1
                removed += len(full) - limit
                full = cut.ids(full)
            fitted.append(full)
        changed = bool(prefix_ids) or truncated > 0
        return FittedInputs(fitted if changed else None, truncated, removed)

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
    if cut.truncation.refuse:
        raise cut.refuse(min(over))
    # Some input is too long: send the whole batch as token ids (an input must be
    # all strings or all ids), each framed exactly as the upstream would frame text.
    all_ids = dict(zip(suspects, counted, strict=True))
    if cut.truncation.side is CutSide.LEFT:
        # A cut from the left keeps the end: the long inputs are tokenized whole.
        ends = list(over)
        all_ids.update(zip(ends, tokenizer.encode([prompts[i] for i in ends], budget), strict=True))
        over = {i: all_ids[i] for i in ends}
    rest = [i for i in range(len(prompts)) if i not in all_ids]
    all_ids.update(zip(rest, tokenizer.encode([prompts[i] for i in rest], budget), strict=True))
    # At least this many: a long input's tail is never tokenized (cut from the right).
    removed = sum(len(ids) + specials - limit for ids in over.values())
    framed = [cut.framed(all_ids[i]) for i in range(len(prompts))]
    return FittedInputs(framed, len(over), removed)
