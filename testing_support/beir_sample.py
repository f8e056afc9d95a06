"""A BEIR sample made by the tests (no download): random documents of a small
vocabulary, each query a document's first words, judged relevant to it."""

from __future__ import annotations

import random
from pathlib import Path

import orjson

WORDS = [
    "river",
    "stone",
    "garden",
    "bridge",
    "morning",
    "light",
    "boat",
    "water",
    "child",
    "house",
    "road",
    "market",
    "bread",
    "window",
    "winter",
    "summer",
    "forest",
    "mountain",
    "valley",
    "cloud",
    "storm",
    "harbour",
    "island",
    "village",
    "engine",
    "signal",
    "station",
    "letter",
    "paper",
    "market",
    "coffee",
    "table",
    "silver",
    "copper",
    "iron",
    "glass",
    "music",
    "story",
    "teacher",
    "doctor",
    "garden",
    "orange",
    "yellow",
    "purple",
    "planet",
    "orbit",
    "rocket",
    "comet",
]


LENGTHS = (60, 150, 400, 1400)


def write_sample(
    folder: Path, documents: int = 120, queries: int = 40, lengths: tuple[int, ...] = LENGTHS
) -> dict[str, Path]:
    """BEIR files: documents of some of ``lengths`` words (1,400: over the gateway's
    1,024-token cut), each query a document's first 40 words, judged relevant to it
    (the made-up model weighs a text's first tokens most: 40 words outweigh the query
    prompt)."""
    folder.mkdir(parents=True, exist_ok=True)
    pick = random.Random(7)
    corpus, query_lines, qrels = [], [], ["query-id\tcorpus-id\tscore"]
    for i in range(documents):
        length = pick.choice(lengths)
        words = [pick.choice(WORDS) for _ in range(length)]
        corpus.append({"_id": f"d{i}", "text": " ".join(words)})
    for i in range(queries):
        doc = corpus[i * 3]
        query_lines.append({"_id": f"q{i}", "text": " ".join(doc["text"].split()[:40])})
        qrels.append(f"q{i}\t{doc['_id']}\t1")
    paths = {name: folder / f"{name}.jsonl" for name in ("corpus", "queries")}
    paths["corpus"].write_bytes(b"\n".join(orjson.dumps(d) for d in corpus) + b"\n")
    paths["queries"].write_bytes(b"\n".join(orjson.dumps(q) for q in query_lines) + b"\n")
    paths["qrels"] = folder / "qrels.tsv"
    paths["qrels"].write_text("\n".join(qrels) + "\n", encoding="utf-8")
    return paths
