"""What verification sends besides what learning asked: texts and batches whose
handling nobody names until a legacy server differs on them. Each goes to the baseline
and to the gateway, and is compared as every row is (the status, the body's keys,
order and types, the vectors, their norms, the token counts); a difference names the
row, and so what differs (its text's trait, its batch's size)."""

from __future__ import annotations

import unicodedata
from typing import Final

import orjson

from extproc.tools.toolkit.contract_table import Probe

TEXTS: Final = {
    "line breaks": "first line\nsecond line\r\nthird",
    "tabs": "a\ttabbed\ttext",
    "runs of spaces": "words   with    runs   of spaces",
    "white space at both ends": "  padded text  ",
    "decomposed accents": unicodedata.normalize("NFD", "café déjà été"),
    "emoji": "tea time \U0001f375\U0001f44d",
    "CJK": "東京の天気はどうですか",
    "one character": "a",
    "an empty string": "",
}
BATCHES: Final = (1, 16, 17, 64)


def battery_probes(model: str, largest: int | None = None) -> list[Probe]:
    """The battery for ``model``; ``largest``: the biggest batch the baseline takes,
    when learning found its limit."""
    probes = [
        _probe(f"text with {label}" if label != "an empty string" else label, [text], model)
        for label, text in TEXTS.items()
    ]
    sizes = sorted({*BATCHES, *(() if largest is None else (largest,))})
    probes += [_probe(f"{n} inputs", [f"text {i}" for i in range(n)], model) for n in sizes]
    first = next(iter(TEXTS.values()))
    probes.append(_probe("the same input twice", [first, first], model))
    return probes


def _probe(title: str, texts: list[str], model: str) -> Probe:
    body = orjson.dumps({"model": model, "input": texts})
    # valid: each is compared as a client sees it, whatever the baseline answers
    return Probe(key="battery " + title, title=title, body=body, valid=True)
