"""Long inputs: texts past a server's token limit, built by repeating pieces of text.

Two kinds, one builder (:func:`repeated`): the corpus documents joined by blank lines
(:func:`long_text`, sized by what the baseline counted for them, so no tokenizer is
needed: the contract table's "input over the limit") and plain words
(:func:`plain_words`, mostly one token each in every tokenizer: learn's searches for
the cut point and the candidate's limit).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from extproc.tools.toolkit.corpus import Item

LONG_INPUT_TOKENS = 3000  # the "input over the limit" probe (the legacy limit is 1,024)
MAX_LONG_INPUT_CHARS = 200_000  # hard cap on the "over the limit" probe's text
DOCUMENTS_APART = "\n\n"
# Plain words, mostly one token each in every tokenizer: long inputs repeat them.
SENTENCE = (
    "the river runs past old stone houses where people keep small gardens and children "
    "play near the water while boats move slowly under the bridge in the morning light"
)
# Words beyond the tokens asked for: a word is at least one token, so the text is never
# shorter than asked, whatever the tokenizer merges at the joins.
PLAIN_WORDS_MARGIN = 8


def repeated(pieces: Sequence[str], count: int, separator: str) -> str:
    """The first ``count`` of ``pieces`` cycled (all of them, again and again), joined."""
    if not pieces:
        raise ValueError("nothing to repeat")
    return separator.join(itertools.islice(itertools.cycle(pieces), count))


def long_text(
    documents: Sequence[Item], target_tokens: int, documents_tokens: int
) -> tuple[str, int]:
    """A text of at least about ``target_tokens`` tokens, and its estimated size: all the
    documents joined by blank lines, repeated as often as needed. ``documents_tokens``
    is what the baseline counted for the documents (usage.prompt_tokens, one end token
    per document included), so no tokenizer is needed here."""
    if not documents:
        raise ValueError("no documents")
    per_round = max(documents_tokens - len(documents), 1)  # without the per-input end token
    round_chars = sum(len(d.text) for d in documents) + len(DOCUMENTS_APART) * len(documents)
    rounds = max(1, -(-target_tokens // per_round))
    rounds = max(1, min(rounds, MAX_LONG_INPUT_CHARS // round_chars))
    texts = [d.text for d in documents]
    return repeated(texts, rounds * len(texts), DOCUMENTS_APART), per_round * rounds


def plain_words(tokens: int) -> str:
    """Plain words, at least ``tokens`` tokens long."""
    return repeated(SENTENCE.split(), tokens + PLAIN_WORDS_MARGIN, " ")
