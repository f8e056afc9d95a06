"""The soak's request mix: kinds of request, their weights, and the cycle wrk_mix.lua sends."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.upstream import SMALL_BATCH
from bench.workloads import REWRITE_DIMENSIONS, UPSTREAM_DIMENSIONS, request_body

INPUTS = SMALL_BATCH  # the seed's batch of 8 documents


@dataclass(frozen=True)
class Kind:
    key: str
    description: str
    fields: dict[str, Any]  # added to the seed request
    dimensions: int  # what the client must get back


KINDS = {
    k.key: k
    for k in (
        Kind("seed", "8 documents (~84 tokens), no rewrite", {}, UPSTREAM_DIMENSIONS),
        Kind(
            "rewrite",
            "input_type query + dimensions 256: instruction, cut to 256-d, renormalised",
            {"input_type": "query", "dimensions": REWRITE_DIMENSIONS},
            REWRITE_DIMENSIONS,
        ),
        Kind(
            "base64",
            "encoding_format base64 (legacy profile: float arrays back)",
            {"encoding_format": "base64"},
            UPSTREAM_DIMENSIONS,
        ),
        Kind("float", "encoding_format float", {"encoding_format": "float"}, UPSTREAM_DIMENSIONS),
        Kind(
            "query",
            "input_type query: instruction only",
            {"input_type": "query"},
            UPSTREAM_DIMENSIONS,
        ),
    )
}
DEFAULT_MIX = "seed=70,rewrite=10,base64=10,float=10"


def parse_mix(text: str) -> dict[str, int]:
    """Parse ``seed=70,rewrite=10`` into ``{"seed": 70, "rewrite": 10}`` (ValueError if bad)."""
    mix: dict[str, int] = {}
    for item in text.split(","):
        key, sep, weight = item.strip().partition("=")
        if not sep or key not in KINDS or not weight.isdigit():
            raise ValueError(f"bad --mix item {item!r}: KIND=WEIGHT, KIND in {list(KINDS)}")
        mix[key] = mix.get(key, 0) + int(weight)
    mix = {k: w for k, w in mix.items() if w > 0}
    if not mix:
        raise ValueError("--mix has no kind with a weight > 0")
    return mix


def schedule(mix: dict[str, int]) -> list[str]:
    """The mix as one cycle of kinds, spread evenly (smooth weighted round-robin)."""
    divisor = math.gcd(*mix.values())
    weights = {k: w // divisor for k, w in mix.items()}
    total = sum(weights.values())
    current = dict.fromkeys(weights, 0)
    out = []
    for _ in range(total):
        for key, weight in weights.items():
            current[key] += weight
        best = max(current, key=lambda k: current[k])
        current[best] -= total
        out.append(best)
    return out


def write_bodies(directory: Path, mix: dict[str, int]) -> tuple[dict[str, Path], Path]:
    """One body file per kind and the schedule file wrk_mix.lua reads."""
    seed = orjson.loads(request_body("plain", INPUTS))
    paths = {}
    for key in mix:
        paths[key] = directory / f"request-{key}.json"
        paths[key].write_bytes(orjson.dumps({**seed, **KINDS[key].fields}))
    cycle = schedule(mix)
    schedule_path = directory / "schedule.txt"
    schedule_path.write_text("".join(f"{paths[k]}\n" for k in cycle))
    return paths, schedule_path
