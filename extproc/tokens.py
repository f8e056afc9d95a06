"""Counting and cutting tokens exactly as the model's own tokenizer does.

We run the model's ``tokenizer.json`` with Hugging Face ``tokenizers`` - the Rust
library behind transformers' fast tokenizers - directly, without importing
transformers: same ids, a fraction of the start-up time and memory. Text is encoded
without special tokens and the policy's special tokens are added around it, so a
truncated input keeps its first ``max_tokens - len(specials)`` tokens plus the
specials: what transformers' ``truncation=True, max_length=L`` keeps (for
Qwen3-Embedding: the first L-1 tokens and ``<|endoftext|>``).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from extproc.policy.model import SpecialTokens, TokenizerSource

# Prefix sizes for head-only tokenization: generous (most tokens cover < 8 chars),
# and a too-small prefix only costs a retry with a 4x longer one.
_PREFIX_CHARS_PER_TOKEN = 8
_MIN_PREFIX_CHARS = 4096


class TokenizerLoadError(RuntimeError):
    pass


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

    def certainly_fits(self, text: str, budget: int) -> bool:
        """True when ``text`` cannot exceed ``budget`` tokens, without tokenizing it.

        A byte-level BPE token covers at least one byte, so UTF-8 length bounds the
        count - once the NFC normalizer (which may lengthen text) is a no-op. Most
        requests are far below the limit and skip tokenization entirely.
        """
        if not self._byte_bounded:
            return False
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if size > budget:
            return False
        return not self._nfc or text.isascii() or unicodedata.is_normalized("NFC", text)

    def encode_heads(self, texts: Sequence[str], need: int) -> list[list[int]]:
        """Each text's token ids, or - for a text far longer than ``need`` tokens - at
        least its first ``need`` ids, exactly as the whole text would begin.

        Tokenizing is linear but not cheap (~10 us a token on this CPU; a 7 MB body
        would take ~20 s), and truncation only ever keeps the head. So a long text is
        tokenized by growing prefixes, and only the tokens of words that end well
        before the cut are kept: a cut can only change the word it falls in (and NFC
        composition across it), never the words before.
        """
        heads: list[list[int] | None] = [None] * len(texts)
        window = max(need * _PREFIX_CHARS_PER_TOKEN, _MIN_PREFIX_CHARS)
        short = [i for i, t in enumerate(texts) if len(t) <= window]
        for i, ids in zip(short, self.encode([texts[i] for i in short]), strict=True):
            heads[i] = ids
        for i, text in enumerate(texts):
            if heads[i] is None:
                heads[i] = self._encode_head(text, need, window)
        return [h for h in heads if h is not None]

    def _encode_head(self, text: str, need: int, window: int) -> list[int]:
        while window < len(text):
            encoding = self._tokenizer.encode(text[:window], add_special_tokens=False)
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
        return self.encode([text])[0]

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def frame(self, content: Sequence[int], max_tokens: int) -> list[int]:
        """Specials around ``content``, content cut from the right to fit ``max_tokens``."""
        budget = max_tokens - self.special_count
        return [*self.prepend_ids, *content[:budget], *self.append_ids]


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


def load_tokenizer(source: TokenizerSource, special: SpecialTokens) -> ModelTokenizer:
    return ModelTokenizer(Tokenizer.from_file(str(_tokenizer_json(source))), special)


def _tokenizer_json(source: TokenizerSource) -> Path:
    if source.path is not None:
        path = source.path / "tokenizer.json"
        if not path.is_file():
            raise TokenizerLoadError(f"{path} does not exist")
        return path
    assert source.hf_id is not None
    # Imported lazily: only HF-id sources need it. hf_hub_download honours
    # HF_HUB_OFFLINE and the shared HF cache, so a pre-downloaded model works air-gapped.
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(source.hf_id, "tokenizer.json", revision=source.revision))
    except Exception as exc:  # the hub client raises many types; all mean "not available"
        raise TokenizerLoadError(
            f"cannot load tokenizer {source.hf_id!r} ({type(exc).__name__}); pre-download it, "
            "or point the policy (or EXTPROC_TOKENIZER_OVERRIDES / --tokenizer) at a directory"
        ) from exc
