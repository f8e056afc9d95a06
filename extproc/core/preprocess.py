"""What a legacy server did to each text before embedding it (the policy's
``preprocess``), done to each text before its prompt, its tokens and the upstream
(pure). In the policy's order: line breaks folded to spaces, runs of white space
collapsed to one, both ends stripped, then the Unicode normal form."""

from __future__ import annotations

import re
import unicodedata
from typing import Final

from extproc.core.policy.model import Preprocess

_LINE_BREAK: Final = re.compile(r"\r\n|\r|\n")
_WHITE_SPACE: Final = re.compile(r"\s+")


def preprocess(rule: Preprocess, texts: list[str] | None) -> list[str] | None:
    """``texts`` as the rule makes them (the same list when it changes nothing)."""
    if texts is None or not rule.changes_text:
        return texts
    return [preprocess_text(rule, text) for text in texts]


def preprocess_text(rule: Preprocess, text: str) -> str:
    if rule.fold_newlines:
        text = _LINE_BREAK.sub(" ", text)
    if rule.collapse_whitespace:
        text = _WHITE_SPACE.sub(" ", text)
    if rule.strip:
        text = text.strip()
    if rule.unicode_form is not None:
        text = unicodedata.normalize(rule.unicode_form.value, text)
    return text
