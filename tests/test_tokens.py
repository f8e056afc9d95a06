"""Head-only tokenization of long inputs must give exactly the first tokens of the
whole text (the cut of a prefix may only change the words it falls in)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from extproc.core.policy.model import SpecialTokens, TokenizerSource
from extproc.core.tokens import ModelTokenizer, TokenizerLoadError
from extproc.service.tokenizer_files import load_tokenizer

NEED = 1024

LONG_TEXTS = {
    "korean": "대한민국의 수도는 서울이며 한강이 도시를 가로질러 흐른다. " * 900,
    "chinese-emoji": "北京是中国的首都，也是政治和文化中心。😀🚀👩‍👩‍👧 " * 700,
    "combining-marks": "e\u0301te\u0301 cafe\u0301 na\u0131\u0308ve " * 3000,
    "no-spaces": "x" * 30000 + " tail",
    "whitespace-runs": ("word" + " " * 37 + "\n\n\t") * 2000,
    "special-token-text": "hello <|endoftext|> world " * 2500,
    "digits": "1234567890" * 4000,
    "mixed": "Seoul 서울 東京 😀 naïve — " * 2500,
}


@pytest.fixture(scope="module")
def tokenizer(qwen_dir: Path) -> ModelTokenizer:
    return ModelTokenizer(
        Tokenizer.from_file(str(qwen_dir / "tokenizer.json")), SpecialTokens(append_ids=(151643,))
    )


@pytest.fixture(scope="module")
def raw(qwen_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))


@pytest.mark.parametrize("name", sorted(LONG_TEXTS))
def test_head_equals_the_start_of_the_whole_encoding(
    name: str, tokenizer: ModelTokenizer, raw: Tokenizer
) -> None:
    text = LONG_TEXTS[name]
    assert len(text) > NEED * 8  # long enough that only a prefix is tokenized
    whole = raw.encode(text, add_special_tokens=False).ids
    (head,) = tokenizer.encode_heads([text], NEED)
    assert len(head) >= NEED
    assert head == whole[: len(head)]


@settings(max_examples=25, deadline=None)
@given(
    unit=st.text(min_size=1, max_size=40),
    repeat=st.integers(min_value=300, max_value=900),
    tail=st.text(max_size=20),
)
def test_head_property(
    unit: str, repeat: int, tail: str, tokenizer: ModelTokenizer, raw: Tokenizer
) -> None:
    text = unit * repeat + tail
    whole = raw.encode(text, add_special_tokens=False).ids
    (head,) = tokenizer.encode_heads([text], 256)
    assert head == whole[: len(head)]
    assert len(head) >= min(256, len(whole))


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(
        st.text(max_size=12) | st.text(st.characters(max_codepoint=127), max_size=12), max_size=6
    ),
    budget=st.integers(min_value=0, max_value=12),
)
def test_uncertain_texts_are_those_not_certain_to_fit(
    texts: list[str], budget: int, tokenizer: ModelTokenizer, raw: Tokenizer
) -> None:
    """The batch check (ASCII by its length) agrees with the one-text check, and a
    text it lets through really is within the budget."""
    uncertain = tokenizer.uncertain(texts, budget)
    assert uncertain == [i for i, t in enumerate(texts) if not tokenizer.certainly_fits(t, budget)]
    for i, text in enumerate(texts):
        if i not in uncertain:
            assert len(raw.encode(text, add_special_tokens=False).ids) <= budget


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_a_tokenizer_json_that_is_no_regular_file_is_refused_without_blocking(
    tmp_path: Path, kind: str
) -> None:
    """A FIFO (opening it would wait for a writer), a device (reading it never ends)
    or a directory where tokenizer.json should be: a TokenizerLoadError naming it, at
    once (checked in a thread joined with a deadline, so a block fails the test)."""
    target = tmp_path / "tokenizer.json"
    {
        "fifo": os.mkfifo,
        "dev-zero": lambda p: p.symlink_to("/dev/zero"),
        "directory": lambda p: p.mkdir(),
    }[kind](target)
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            load_tokenizer(TokenizerSource(path=tmp_path), SpecialTokens())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(5.0)
    assert not thread.is_alive(), "loading the tokenizer blocked"
    (error,) = outcome
    assert isinstance(error, TokenizerLoadError), error
    assert str(target) in str(error) and "not a regular file: not read" in str(error)
