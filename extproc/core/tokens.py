"""Counting and cutting tokens exactly as the model's own tokenizer does.

We run the model's ``tokenizer.json`` with Hugging Face ``tokenizers`` - the Rust
library behind transformers' fast tokenizers - directly, without importing
transformers: same ids, a fraction of the start-up time and memory (the file is read
by :mod:`extproc.service.tokenizer_files`). Text is encoded without special tokens and
the policy's special tokens are added around it, so a truncated input keeps its first
``max_tokens - len(specials)`` tokens plus the specials: what transformers'
``truncation=True, max_length=L`` keeps (for Qwen3-Embedding: the first L-1 tokens and
``<|endoftext|>``).
"""

from __future__ import annotations

import enum
import json
import unicodedata
from collections.abc import Callable, Iterator, Sequence

from tokenizers import Tokenizer

from extproc.core.policy.model import SpecialTokens

# Prefix sizes for head-only tokenization: generous (most tokens cover < 8 chars),
# and a too-small prefix only costs a retry with a 4x longer one.
_PREFIX_CHARS_PER_TOKEN = 8
_MIN_PREFIX_CHARS = 4096
# Under a budget, batches go to the tokenizer in calls of about this many bytes, so
# the deadline is checked often: one call stays short next to the deadline even for
# the text that is costliest per byte.
_CALL_BYTES = 64 * 1024
# A long input's growing prefix (see encode_heads) stops at this size. Growth past the
# first prefix means its words are huge (one "word" of a whole body of 'x' or of CJK
# without punctuation), and such a word cannot be cut up: only tokenized whole.
MAX_PREFIX_BYTES = 256 * 1024


class TokenizerLoadError(RuntimeError):
    pass


def utf8_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (lone surrogates counted as 3, as JSON can carry them)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class BudgetReason(enum.Enum):
    BYTES = "bytes"  # the request needs more bytes tokenized than the budget allows
    TIME = "time"  # the deadline passed
    WORD = "word"  # a long input has no place to cut within MAX_PREFIX_BYTES


class TokenizeBudgetError(Exception):
    """Tokenizing (more of) a request would cross its budget. Carries counts and an
    input's position, never text."""

    def __init__(
        self, reason: BudgetReason, *, needed: int, spent: int, index: int | None = None
    ) -> None:
        super().__init__(f"{reason.value}: needed {needed} bytes, {spent} tokenized")
        self.reason = reason
        self.needed = needed  # bytes the request needs tokenized, at least
        self.spent = spent  # bytes tokenized before it stopped
        self.index = index  # for WORD: which of the texts handed to encode_heads


class TokenizeBudget:
    """What one request may still spend on tokenization: bytes of text handed to the
    tokenizer, and time on the ``clock`` its caller gives (seconds, monotonic).

    Bytes are the deterministic bound (the same request always gets the same answer)
    and, unlike tokens, are known before the tokenizer runs: work over the budget is
    refused before it starts. Time per byte still varies widely with the text, so a
    deadline, checked before every tokenizer call, bounds the rest. Mutable on
    purpose: one per request, charged as the work goes.
    """

    def __init__(
        self,
        max_bytes: int,
        max_seconds: float,
        *,
        clock: Callable[[], float],
    ) -> None:
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self.spent = 0
        self._clock = clock
        self._deadline = clock() + max_seconds

    def require(self, size: int) -> None:
        """Refuse, before any of it runs, work that cannot fit in what is left."""
        if self.spent + size > self.max_bytes:
            raise TokenizeBudgetError(
                BudgetReason.BYTES, needed=self.spent + size, spent=self.spent
            )

    def charge(self, size: int) -> None:
        """Account for one tokenizer call of ``size`` bytes, about to run."""
        if self._clock() > self._deadline:
            raise TokenizeBudgetError(BudgetReason.TIME, needed=self.spent + size, spent=self.spent)
        self.require(size)
        self.spent += size


class ModelTokenizer:
    """A model's tokenizer plus the special tokens that frame every text input."""

    def __init__(self, tokenizer: Tokenizer, special: SpecialTokens) -> None:
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        if special.from_tokenizer:
            self.prepend_ids, self.append_ids = _specials_of(tokenizer)
        else:
            self.prepend_ids, self.append_ids = special.prepend_ids, special.append_ids
        self._byte_bounded, self._nfc = _byte_level_shape(tokenizer)
        for token_id in (*self.prepend_ids, *self.append_ids):
            if not 0 <= token_id < self.vocab_size:
                raise TokenizerLoadError(f"special token id {token_id} is outside the vocabulary")

    @property
    def special_count(self) -> int:
        return len(self.prepend_ids) + len(self.append_ids)

    def uncertain(self, texts: Sequence[str], budget: int) -> list[int]:
        """Positions of the ``texts`` that :meth:`certainly_fits` cannot vouch for."""
        if not self._byte_bounded:
            return list(range(len(texts)))
        # ASCII text is its own UTF-8 and already NFC: its length is the bound.
        return [
            i
            for i, text in enumerate(texts)
            if (len(text) > budget if text.isascii() else not self.certainly_fits(text, budget))
        ]

    def certainly_fits(self, text: str, budget: int) -> bool:
        """True when ``text`` cannot exceed ``budget`` tokens, without tokenizing it.

        A byte-level BPE token covers at least one byte, so UTF-8 length bounds the
        count - once the NFC normalizer (which may lengthen text) is a no-op. Most
        requests are far below the limit and skip tokenization entirely.
        """
        if not self._byte_bounded:
            return False
        if utf8_size(text) > budget:
            return False
        return not self._nfc or text.isascii() or unicodedata.is_normalized("NFC", text)

    def encode_heads(
        self, texts: Sequence[str], need: int, budget: TokenizeBudget | None = None
    ) -> list[list[int]]:
        """Each text's token ids, or - for a text far longer than ``need`` tokens - at
        least its first ``need`` ids, exactly as the whole text would begin.

        Tokenizing is linear but not cheap (a body-sized text takes far longer than
        Envoy waits), and truncation only ever keeps the head. So a long text is
        tokenized by growing prefixes, and only the tokens of words that end well
        before the cut are kept: a cut can only change the word it falls in (and NFC
        composition across it), never the words before.

        With a ``budget``, the first pass (whole short texts, the first prefix of long
        ones) is refused before it starts if it cannot fit; a longer prefix is charged
        before it is tokenized. Raises TokenizeBudgetError.
        """
        heads: list[list[int] | None] = [None] * len(texts)
        window = max(need * _PREFIX_CHARS_PER_TOKEN, _MIN_PREFIX_CHARS)
        short = [i for i, t in enumerate(texts) if len(t) <= window]
        long = [i for i, t in enumerate(texts) if len(t) > window]
        if budget is not None:
            budget.require(
                sum(utf8_size(texts[i]) for i in short)
                + sum(utf8_size(texts[i][:window]) for i in long)
            )
        for i, ids in zip(short, self.encode([texts[i] for i in short], budget), strict=True):
            heads[i] = ids
        for i in long:
            heads[i] = self._encode_head(texts[i], need, window, budget, i)
        return [h for h in heads if h is not None]

    def _encode_head(
        self, text: str, need: int, window: int, budget: TokenizeBudget | None, index: int
    ) -> list[int]:
        first = True
        while True:
            whole = window >= len(text)
            head = text if whole else text[:window]
            if budget is not None:
                size = utf8_size(head)
                if not first and size > MAX_PREFIX_BYTES:
                    raise TokenizeBudgetError(
                        BudgetReason.WORD,
                        needed=budget.spent + size,
                        spent=budget.spent,
                        index=index,
                    )
                budget.charge(size)
            encoding = self._tokenizer.encode(head, add_special_tokens=False)
            if whole:
                return list(encoding.ids)
            words = [w for w in encoding.word_ids if w is not None]
            if words:
                # Keep tokens of words before the last two: those cannot change.
                unsafe_from = words[-1] - 1
                stable = 0
                for word in encoding.word_ids:
                    if word is not None and word >= unsafe_from:
                        break
                    stable += 1
                if stable >= need:
                    return list(encoding.ids[:stable])
            window *= 4
            first = False

    def encode(self, texts: Sequence[str], budget: TokenizeBudget | None = None) -> list[list[int]]:
        """Token ids of each text, without special tokens.

        With a ``budget``: refused before it starts if the texts cannot fit, then run in
        calls of about _CALL_BYTES, each charged (deadline checked) before it runs.
        """
        if budget is None:
            return [
                e.ids for e in self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
            ]
        sizes = [utf8_size(t) for t in texts]
        budget.require(sum(sizes))
        out: list[list[int]] = []
        for start, stop in _calls(sizes, _CALL_BYTES):
            budget.charge(sum(sizes[start:stop]))
            batch = self._tokenizer.encode_batch(list(texts[start:stop]), add_special_tokens=False)
            out.extend(e.ids for e in batch)
        return out

    def pair_counts(self, first: str, seconds: Sequence[str], budget: TokenizeBudget) -> list[int]:
        """Tokens of each (first, second) pair as a cross-encoder sees it: both texts
        and the special tokens the tokenizer's post-processor puts around a pair
        (BERT: [CLS] first [SEP] second [SEP]). Every call is charged to ``budget``."""
        sizes = [utf8_size(first) + utf8_size(s) for s in seconds]
        budget.require(sum(sizes))
        out: list[int] = []
        for start, stop in _calls(sizes, _CALL_BYTES):
            budget.charge(sum(sizes[start:stop]))
            pairs = [(first, second) for second in seconds[start:stop]]
            out.extend(
                len(e.ids) for e in self._tokenizer.encode_batch(pairs, add_special_tokens=True)
            )
        return out

    def frame(self, content: Sequence[int], max_tokens: int) -> list[int]:
        """Specials around ``content``, content cut from the right to fit ``max_tokens``."""
        budget = max_tokens - self.special_count
        return [*self.prepend_ids, *content[:budget], *self.append_ids]


def _calls(sizes: Sequence[int], limit: int) -> Iterator[tuple[int, int]]:
    """Consecutive [start, stop) ranges of about ``limit`` bytes (one item at least)."""
    start = total = 0
    for i, size in enumerate(sizes):
        if i > start and total + size > limit:
            yield start, i
            start, total = i, 0
        total += size
    if start < len(sizes):
        yield start, len(sizes)


def _byte_level_shape(tokenizer: Tokenizer) -> tuple[bool, bool]:
    """(is a byte-level BPE whose tokens each cover >= 1 byte, normalizes with NFC)."""
    spec = json.loads(tokenizer.to_str())
    normalizer = spec.get("normalizer")
    pre = json.dumps(spec.get("pre_tokenizer"))
    if spec.get("model", {}).get("type") != "BPE" or '"ByteLevel"' not in pre:
        return False, False
    if normalizer is None:
        return True, False
    if normalizer.get("type") == "NFC":
        return True, True
    return False, False


def _specials_of(tokenizer: Tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Derive what the post-processor puts before and after a single sequence."""
    bare = tokenizer.encode("a", add_special_tokens=False).ids
    framed = tokenizer.encode("a", add_special_tokens=True).ids
    for start in range(len(framed) - len(bare) + 1):
        if framed[start : start + len(bare)] == bare:
            return tuple(framed[:start]), tuple(framed[start + len(bare) :])
    raise TokenizerLoadError("cannot locate the text inside the post-processed encoding")
