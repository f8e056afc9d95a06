"""The corpus the tools embed: documents and queries, one JSON object a line.

Each line is ``{"id": str, "kind": "document" | "query", "text": str, "lang": str?}``.
The default corpus (``extproc/data/corpus.jsonl``) holds 40 short documents (20 Korean,
20 English, ~84 Qwen3 tokens each) and 8 queries, written for this project.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from extproc.tools.toolkit.json_lines import json_objects

Kind = Literal["document", "query"]

DEFAULT_CORPUS_NAME = "data/corpus.jsonl"


class CorpusError(ValueError):
    """The corpus file is unusable; the message names the source and the line."""


@dataclass(frozen=True)
class Item:
    id: str
    kind: Kind
    text: str
    lang: str = ""


@dataclass(frozen=True)
class Corpus:
    source: str
    documents: tuple[Item, ...]
    queries: tuple[Item, ...]


def parse_corpus(lines: Iterable[str], source: str) -> Corpus:
    """Parse JSON lines; blank lines are skipped. Needs at least one document and one
    query, unique ids, and non-empty texts."""
    documents: list[Item] = []
    queries: list[Item] = []
    seen: set[str] = set()
    for where, doc in json_objects(lines, source, CorpusError, "an object"):
        item_id, kind, text, lang = doc.get("id"), doc.get("kind"), doc.get("text"), doc.get("lang")
        if not isinstance(item_id, str) or not item_id:
            raise CorpusError(f"{where}: 'id' must be a non-empty string")
        if item_id in seen:
            raise CorpusError(f"{where}: duplicate id {item_id!r}")
        if kind not in ("document", "query"):
            raise CorpusError(f"{where}: 'kind' must be 'document' or 'query'")
        if not isinstance(text, str) or not text.strip():
            raise CorpusError(f"{where}: 'text' must be a non-empty string")
        if lang is not None and not isinstance(lang, str):
            raise CorpusError(f"{where}: 'lang' must be a string")
        seen.add(item_id)
        item = Item(id=item_id, kind=kind, text=text, lang=lang or "")
        (documents if kind == "document" else queries).append(item)
    if not documents:
        raise CorpusError(f"{source}: no documents")
    if not queries:
        raise CorpusError(f"{source}: no queries")
    return Corpus(source=source, documents=tuple(documents), queries=tuple(queries))


def load_corpus(path: Path | None) -> Corpus:
    """The corpus at ``path``, or the shipped default corpus when ``path`` is None."""
    if path is None:
        ref = resources.files("extproc").joinpath(DEFAULT_CORPUS_NAME)
        return parse_corpus(
            ref.read_text(encoding="utf-8").splitlines(), "extproc/" + DEFAULT_CORPUS_NAME
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CorpusError(f"{path}: {exc}") from None
    return parse_corpus(text.splitlines(), str(path))


def batches(items: Sequence[Item], size: int) -> list[tuple[Item, ...]]:
    """Consecutive batches of ``size`` (the last one may be shorter)."""
    if size < 1:
        raise ValueError("batch size must be >= 1")
    return [tuple(items[i : i + size]) for i in range(0, len(items), size)]
