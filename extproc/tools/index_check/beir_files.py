"""The sample to check: documents, queries and judgements in BEIR's layout.

Corpus and queries are JSON lines, ``{"_id": str, "text": str, "title": str?}`` (a
title is put before the text, as BEIR's retrievers embed it); judgements (qrels) are
tab-separated ``query-id, corpus-id, score`` with a header line. A team points the
tool at a sample of its own data: each file is read whole, so it is bounded
(:data:`MAX_FILE_BYTES`), and only as a regular file (a FIFO or a device named by
mistake is refused, never read).

Sampling is deterministic: the first ``--sample`` documents, plus every document a
kept query's judgements name (so relevance can be measured), and the first
:data:`MAX_QUERIES` queries that have judgements (or the first ones, without qrels).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from extproc.service.regular_file import FileRefusedError, read_regular_file
from extproc.tools.toolkit.json_lines import json_objects

MAX_FILE_BYTES = 256 * 1024 * 1024  # a sample, not a whole production corpus
MAX_QUERIES = 1000
MAX_DOCUMENTS = 100_000


class SampleError(ValueError):
    """The files cannot make a sample; the message names the file and the line."""


@dataclass(frozen=True)
class Text:
    id: str
    text: str  # the title, a space, then the text (BEIR's way of embedding both)


@dataclass(frozen=True)
class Sample:
    documents: tuple[Text, ...]
    queries: tuple[Text, ...]
    # query id -> {document id -> graded relevance > 0}; empty without qrels
    qrels: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    corpus_size: int = 0  # documents in the corpus file (the sample may be fewer)

    @property
    def judged(self) -> bool:
        return bool(self.qrels)


def read_lines(path: Path, what: str) -> list[str]:
    try:
        data = read_regular_file(path, max_bytes=MAX_FILE_BYTES, what=what).data
    except FileRefusedError as exc:
        raise SampleError(f"{path}: {exc.reason}") from None
    except OSError as exc:
        raise SampleError(f"{path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise SampleError(f"{path}: not UTF-8 (byte {exc.start})") from None


def parse_texts(lines: Sequence[str], source: str) -> list[Text]:
    """BEIR JSON lines; blank lines skipped; ids unique; a text or a title needed."""
    out: list[Text] = []
    seen: set[str] = set()
    for where, doc in json_objects(lines, source, SampleError, "an object with _id and text"):
        item_id, text, title = doc.get("_id"), doc.get("text", ""), doc.get("title", "")
        if not isinstance(item_id, str | int) or isinstance(item_id, bool) or item_id == "":
            raise SampleError(f"{where}: `_id` must be a non-empty string")
        if not isinstance(text, str) or not isinstance(title, str):
            raise SampleError(f"{where}: `text` and `title` must be strings")
        joined = f"{title} {text}".strip() if title else text
        if not joined.strip():
            raise SampleError(f"{where}: no text")
        key = str(item_id)
        if key in seen:
            raise SampleError(f"{where}: `_id` {key!r} appears twice")
        seen.add(key)
        out.append(Text(key, joined))
    return out


def parse_qrels(lines: Sequence[str], source: str) -> dict[str, dict[str, int]]:
    """BEIR's TSV: a header, then ``query-id corpus-id score``; scores of 0 or less
    are not relevant."""
    qrels: dict[str, dict[str, int]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        parts = line.rstrip("\r\n").split("\t")
        if number == 1 and parts[:2] == ["query-id", "corpus-id"]:
            continue
        where = f"{source}:{number}"
        if len(parts) != 3:
            raise SampleError(f"{where}: expected query-id, corpus-id and score, tab-separated")
        query, document, score = parts
        try:
            grade = int(score)
        except ValueError:
            raise SampleError(f"{where}: score {score[:20]!r} is not an integer") from None
        if grade > 0:
            qrels.setdefault(query, {})[document] = grade
    return qrels


def build_sample(
    documents: Sequence[Text],
    queries: Sequence[Text],
    qrels: Mapping[str, Mapping[str, int]] | None,
    *,
    sample: int | None,
    max_queries: int = MAX_QUERIES,
) -> Sample:
    """The sample the tool embeds; SampleError for an empty corpus, no queries, or
    judgements naming ids the files do not have."""
    if not documents:
        raise SampleError("the corpus has no document")
    if not queries:
        raise SampleError("the queries file has no query")
    by_id = {d.id: d for d in documents}
    judged: dict[str, dict[str, int]] = {}
    if qrels:
        query_ids = {q.id for q in queries}
        unknown_queries = sorted(set(qrels) - query_ids)
        unknown_docs = sorted({d for rel in qrels.values() for d in rel} - by_id.keys())
        if unknown_queries:
            raise SampleError(
                f"qrels name {len(unknown_queries)} query ids the queries file lacks "
                f"(first: {unknown_queries[0]!r})"
            )
        if unknown_docs:
            raise SampleError(
                f"qrels name {len(unknown_docs)} document ids the corpus lacks "
                f"(first: {unknown_docs[0]!r})"
            )
        kept_queries = [q for q in queries if q.id in qrels][:max_queries]
        if not kept_queries:
            raise SampleError("no query has a relevant document in the qrels")
        judged = {q.id: dict(qrels[q.id]) for q in kept_queries}
    else:
        kept_queries = list(queries[:max_queries])
    limit = min(sample or len(documents), MAX_DOCUMENTS)
    wanted = {d for rel in judged.values() for d in rel}
    kept = {d.id for d in documents[:limit]} | wanted
    kept_documents = [d for d in documents if d.id in kept]
    return Sample(tuple(kept_documents), tuple(kept_queries), judged, len(documents))
