"""Request caps and the tokenization budget: the policy fields, their
4xx answers, and the order of work - every cap is checked before the tokenizer runs,
and a request over the budget is refused before the tokenizer sees the part that
would not fit.

The tokenizer is the real Qwen3 one; a counting proxy around it records every call,
so "nothing was tokenized" is observed, not assumed.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from tokenizers import Tokenizer

from extproc.core.api_errors import ApiError
from extproc.core.contract import Contract
from extproc.core.policy import GatewayPolicy, PolicyError, load_policy_text
from extproc.core.policy.model import SpecialTokens
from extproc.core.request_rewrite import Forward, rewrite_request
from extproc.core.tokens import (
    MAX_PREFIX_BYTES,
    BudgetReason,
    ModelTokenizer,
    TokenizeBudget,
    TokenizeBudgetError,
    utf8_size,
)
from testing_support.qwen import QWEN_EOS, QWEN_MODEL, SHIPPED_QWEN_POLICY

MODEL = QWEN_MODEL
ENGLISH = "The quick brown fox jumps over the lazy dog while the cat sleeps. "


class CountingTokenizer:
    """Forwards to the real tokenizers.Tokenizer and counts the bytes it is given."""

    def __init__(self, inner: Tokenizer) -> None:
        self._inner = inner
        self.calls = 0
        self.bytes = 0

    def encode(self, text: str, **kwargs: Any) -> Any:
        self.calls += 1
        self.bytes += utf8_size(text)
        return self._inner.encode(text, **kwargs)

    def encode_batch(self, texts: list[str], **kwargs: Any) -> Any:
        self.calls += 1
        self.bytes += sum(utf8_size(t) for t in texts)
        return self._inner.encode_batch(texts, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def policy_text(limits: str = "") -> str:
    head = f"limits: {{{limits}}}\n" if limits else ""
    return (
        head
        + f"models:\n  - name: {MODEL}\n    preset: qwen3-embedding-0.6b\n"
        + "    max_tokens: 1024\n    encoding_profile: LEGACY\n"
    )


def make_contract(qwen_dir: Path, limits: str = "") -> tuple[Contract, CountingTokenizer]:
    policy = load_policy_text(policy_text(limits), tokenizer_overrides={MODEL: qwen_dir})
    tokenizer = ModelTokenizer(
        Tokenizer.from_file(str(qwen_dir / "tokenizer.json")),
        SpecialTokens(append_ids=(QWEN_EOS,)),
    )
    counter = CountingTokenizer(tokenizer._tokenizer)
    tokenizer._tokenizer = counter  # type: ignore[assignment]
    return Contract(policy=policy, tokenizers={MODEL: tokenizer}), counter


def run(contract: Contract, **fields: Any) -> Forward:
    body = orjson.dumps({"model": MODEL, **fields})
    return rewrite_request(body, contract.policy, contract.tokenizers, clock=time.monotonic)


def refused(contract: Contract, **fields: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        run(contract, **fields)
    error = caught.value
    envelope = orjson.loads(error.envelope())["error"]
    assert envelope["message"] == error.message and envelope["param"] == error.param
    return error


def english(nbytes: int, salt: int = 0) -> str:
    """Distinct-ish English of exactly ``nbytes`` ASCII bytes."""
    text = f"{salt} " + ENGLISH * (nbytes // len(ENGLISH) + 1)
    return text[:nbytes]


# -- the policy fields ----------------------------------------------------------------


def test_defaults(qwen_dir: Path) -> None:
    limits = load_policy_text(policy_text(), tokenizer_overrides={MODEL: qwen_dir}).limits
    assert limits.max_request_bytes == 8 * 1024 * 1024
    assert limits.max_inputs == 2048
    # The character caps follow the body size: alone they never bind.
    assert limits.max_total_chars == limits.max_input_chars == limits.max_request_bytes
    # The byte budget follows the body size too: the deadline bounds the work.
    assert limits.max_tokenize_bytes == limits.max_request_bytes
    assert limits.max_tokenize_ms == 5000


def test_character_caps_follow_the_body_size_and_each_other(qwen_dir: Path) -> None:
    def limits_of(text: str) -> Any:
        return load_policy_text(policy_text(text), tokenizer_overrides={MODEL: qwen_dir}).limits

    bigger = limits_of("max_request_bytes: 16777216")
    assert bigger.max_total_chars == bigger.max_input_chars == 16777216
    assert bigger.max_tokenize_bytes == 16777216
    total_only = limits_of("max_total_chars: 50000")
    assert (total_only.max_total_chars, total_only.max_input_chars) == (50000, 50000)
    every = limits_of(
        "max_input_chars: 100, max_total_chars: 1000, max_tokenize_bytes: 9000, max_tokenize_ms: 5"
    )
    assert (every.max_input_chars, every.max_total_chars) == (100, 1000)
    assert (every.max_tokenize_bytes, every.max_tokenize_ms) == (9000, 5)


@pytest.mark.parametrize(
    ("limits", "field", "reason"),
    [
        ("max_input_chars: 0", "limits.max_input_chars", "between 1 and"),
        ("max_total_chars: 0", "limits.max_total_chars", "between 1 and"),
        ("max_total_chars: 99999999", "limits.max_total_chars", "between 1 and 67108864"),
        ("max_tokenize_bytes: 100", "limits.max_tokenize_bytes", "between 8192 and"),
        ("max_tokenize_ms: 0", "limits.max_tokenize_ms", "between 1 and 10000"),
        ("max_tokenize_ms: 15000", "limits.max_tokenize_ms", "between 1 and 10000"),
        (
            "max_input_chars: 2000, max_total_chars: 1000",
            "limits.max_input_chars",
            "over limits.max_total_chars",
        ),
        ("max_tokenize_ms: fast", "limits", "max_tokenize_ms"),
        ("max_tokenise_bytes: 1", "limits", "max_tokenise_bytes"),
    ],
)
def test_bad_limits_name_field_and_reason(
    limits: str, field: str, reason: str, qwen_dir: Path
) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy_text(
            policy_text(limits), source="p.yaml", tokenizer_overrides={MODEL: qwen_dir}
        )
    assert (info.value.source, info.value.field) == ("p.yaml", field)
    assert reason in info.value.reason


# -- character caps: before anything is tokenized ---------------------------------------


@pytest.fixture(scope="module")
def capped(qwen_dir: Path) -> tuple[Contract, CountingTokenizer]:
    return make_contract(qwen_dir, "max_input_chars: 5000, max_total_chars: 12000")


def test_input_over_the_character_cap_is_a_400_before_tokenizing(
    capped: tuple[Contract, CountingTokenizer],
) -> None:
    contract, counter = capped
    calls = counter.calls
    secret = "SECRET-" + "z" * 5000
    error = refused(contract, input=["ok", secret])
    assert (error.status, error.param, error.code) == (400, "input", "input_too_long")
    assert "input[1] has 5007 characters" in error.message and "5000" in error.message
    assert "SECRET" not in error.message and "zzz" not in error.message
    single = refused(contract, input=secret)
    assert single.message.startswith("'input' has 5007 characters")
    assert counter.calls == calls


def test_total_characters_count_the_prompt_of_every_input(
    capped: tuple[Contract, CountingTokenizer],
) -> None:
    contract, counter = capped
    # 6 x 2,000 characters fit exactly; with a query prompt they do not.
    inputs = [english(2000, i) for i in range(6)]
    assert run(contract, input=inputs).plan.input_count == 6
    calls = counter.calls
    error = refused(contract, input=inputs, instruction="SECRET instruction")
    assert (error.status, error.param, error.code) == (413, "input", "request_too_large")
    assert "12000" in error.message and "6 x " in error.message
    assert "SECRET" not in error.message
    assert counter.calls == calls


def test_a_long_instruction_times_many_inputs_is_refused_before_it_is_copied(
    qwen_dir: Path,
) -> None:
    """Under the default caps: 2,048 inputs x a 4 MB instruction would be 8 GB of prompts."""
    contract, counter = make_contract(qwen_dir)
    instruction = "x" * (4 * 1024 * 1024)
    error = refused(contract, input=["a"] * 2048, instruction=instruction)
    assert error.status == 413 and "2048 x " in error.message
    assert counter.calls == 0


# -- the tokenization budget -------------------------------------------------------------


def test_a_byte_budget_refuses_before_the_tokenizer_runs(qwen_dir: Path) -> None:
    """2,048 inputs each under 1,024 tokens but over 1,023 bytes, ~8 MB in all (~2M
    tokens, ~10 s of CPU here), under a configured 1 MiB budget."""
    contract, counter = make_contract(qwen_dir, "max_tokenize_bytes: 1048576")
    inputs = [english(3900, i) for i in range(2048)]
    error = refused(contract, input=inputs)
    assert (error.status, error.param, error.code) == (413, "input", "request_too_large")
    assert str(1024 * 1024) in error.message
    assert f"at least {sum(len(t) for t in inputs)} bytes" in error.message
    assert counter.calls == 0 and counter.bytes == 0


def test_the_default_byte_budget_takes_a_bulk_batch(qwen_dir: Path) -> None:
    """512 documents of 4,000 characters (2 MB): each over 1,023 bytes, so each is
    counted, and none is over 1,024 tokens: forwarded as sent. Was: a 413 from the
    former 1 MiB default budget. The deadline is raised here so that a loaded test
    machine cannot fail it (tests/test_limits_gateway.py keeps every default)."""
    contract, counter = make_contract(qwen_dir, "max_tokenize_ms: 10000")
    assert contract.policy.limits.max_tokenize_bytes == 8 * 1024 * 1024
    inputs = [english(4000, i) for i in range(512)]
    forward = run(contract, input=inputs)
    assert forward.upstream_body is None and forward.stats.truncated_inputs == 0
    assert counter.bytes == 512 * 4000


def test_a_batch_under_the_budget_is_tokenized_and_cut(qwen_dir: Path) -> None:
    """2,048 seed-size documents plus one long one: all sent as ids (~0.9 MB tokenized).
    The deadline is raised here so that a loaded test machine cannot fail it."""
    contract, counter = make_contract(qwen_dir, "max_tokenize_ms: 10000")
    inputs = [english(440, i) for i in range(2047)] + [ENGLISH * 400]
    forward = run(contract, input=inputs)
    assert forward.stats.truncated_inputs == 1 and forward.plan.input_count == 2048
    assert 0 < counter.bytes <= 1024 * 1024
    assert counter.calls > 2  # in slices, each charged before it runs


def test_the_budget_counts_every_pass(qwen_dir: Path) -> None:
    """A first pass that fits, then the rest of the batch (needed once one input is over
    max_tokens) that does not: refused before the rest is tokenized."""
    contract, counter = make_contract(qwen_dir, "max_tokenize_bytes: 65536")
    long_input = ENGLISH * 200  # 13 KB: the first pass tokenizes ~8 KB of it
    inputs = [long_input] + [english(1000, i) for i in range(100)]
    error = refused(contract, input=inputs)
    assert error.status == 413 and "65536" in error.message
    assert 0 < counter.bytes <= 65536


def test_prompt_prefix_of_token_id_input_is_charged(qwen_dir: Path) -> None:
    contract, counter = make_contract(qwen_dir, "max_tokenize_bytes: 65536")
    error = refused(contract, input=[[1, 2, 3]], instruction="x" * 70000)
    assert error.status == 413 and "65536" in error.message
    assert counter.calls == 0


def test_input_without_a_place_to_cut_is_refused(qwen_dir: Path) -> None:
    """One 'word' of 8 MB: no prefix of it can be trusted to tokenize like the whole,
    and the whole took ~19 s of CPU here before the budget."""
    contract, counter = make_contract(qwen_dir)
    error = refused(contract, input=["fine", "x" * (8 * 1024 * 1024 - 100)])
    assert (error.status, error.param) == (413, "input")
    assert error.message.startswith("input[1] cannot be cut to 1024 tokens")
    assert str(MAX_PREFIX_BYTES) in error.message
    assert counter.bytes <= MAX_PREFIX_BYTES  # 8 K + 32 K + 128 K characters, then no more


def test_deadline_through_rewrite_request(qwen_dir: Path) -> None:
    """1 ms cannot cover more than the first slice of ~64 KB of text."""
    contract, counter = make_contract(qwen_dir, "max_tokenize_ms: 1")
    inputs = [english(4000, i) for i in range(100)]  # 400 KB, under the byte budget
    error = refused(contract, input=inputs)
    assert error.status == 413 and "longer than 1 ms" in error.message
    assert counter.bytes < 400_000


def test_the_deadline_is_kept_on_the_clock_the_caller_gives(qwen_dir: Path) -> None:
    """The core reads no clock of its own: a clock that stands still never runs out,
    one that moves 10 s a reading runs out at the first check (the default is 5 s)."""
    contract, counter = make_contract(qwen_dir)
    body = orjson.dumps({"model": MODEL, "input": [english(4000, i) for i in range(100)]})
    still = rewrite_request(body, contract.policy, contract.tokenizers, clock=lambda: 0.0)
    assert still.stats.inputs == 100
    readings = itertools.count(0.0, 10.0)
    tokenized = counter.bytes
    with pytest.raises(ApiError) as late:
        rewrite_request(body, contract.policy, contract.tokenizers, clock=lambda: next(readings))
    assert late.value.status == 413 and "longer than 5000 ms" in late.value.message
    assert counter.bytes == tokenized  # refused before the first tokenizer call


def test_the_default_budget_keeps_long_single_inputs_cheap(qwen_dir: Path) -> None:
    """A 7 MB document (English, Korean) is still cut by its head alone."""
    contract, counter = make_contract(qwen_dir)
    korean = "대한민국의 수도는 서울이며 한강이 도시를 가로질러 흐른다. "
    for text in (ENGLISH * 100_000, korean * 30_000):
        before = counter.bytes
        forward = run(contract, input=text)
        assert forward.stats.truncated_inputs == 1
        assert counter.bytes - before < 64 * 1024


# -- TokenizeBudget and the sliced tokenizer calls ---------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_budget_bytes_and_deadline() -> None:
    clock = Clock()
    budget = TokenizeBudget(1000, 2.0, clock=clock)
    budget.require(1000)
    budget.charge(600)
    with pytest.raises(TokenizeBudgetError) as over:
        budget.require(401)
    assert (over.value.reason, over.value.needed, over.value.spent) == (
        BudgetReason.BYTES,
        1001,
        600,
    )
    budget.charge(400)
    assert budget.spent == 1000
    late = TokenizeBudget(10**9, 2.0, clock=clock)
    late.charge(10)
    clock.now += 2.5
    with pytest.raises(TokenizeBudgetError) as timed_out:
        late.charge(10)
    assert (timed_out.value.reason, timed_out.value.spent) == (BudgetReason.TIME, 10)


@pytest.fixture(scope="module")
def tokenizer(qwen_dir: Path) -> ModelTokenizer:
    return ModelTokenizer(
        Tokenizer.from_file(str(qwen_dir / "tokenizer.json")),
        SpecialTokens(append_ids=(QWEN_EOS,)),
    )


def texts_for_slices() -> Iterator[str]:
    for i in range(60):
        yield english(3000 + 17 * i, i) + " 서울 😀"


def test_sliced_calls_give_the_same_ids(tokenizer: ModelTokenizer) -> None:
    texts = list(texts_for_slices())
    budget = TokenizeBudget(10**9, 60.0, clock=time.monotonic)
    assert tokenizer.encode(texts, budget) == tokenizer.encode(texts)
    assert budget.spent == sum(utf8_size(t) for t in texts)
    heads = [t * 5 for t in texts[:5]] + texts[:5]
    assert tokenizer.encode_heads(
        heads, 1024, TokenizeBudget(10**9, 60.0, clock=time.monotonic)
    ) == (tokenizer.encode_heads(heads, 1024))


def test_encode_refuses_what_cannot_fit_before_calling(tokenizer: ModelTokenizer) -> None:
    budget = TokenizeBudget(10_000, 60.0, clock=time.monotonic)
    with pytest.raises(TokenizeBudgetError):
        tokenizer.encode([english(6000), english(6000)], budget)
    assert budget.spent == 0


def test_shipped_policy_keeps_defaults(qwen_policy: GatewayPolicy) -> None:
    assert "limits" not in SHIPPED_QWEN_POLICY.read_text()
    assert qwen_policy.limits.max_tokenize_bytes == qwen_policy.limits.max_request_bytes
    assert qwen_policy.limits.max_tokenize_ms == 5000
