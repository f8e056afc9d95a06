"""What is measured: the cases (which stack serves which request) and the workloads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from bench.upstream import CUT_DIMENSIONS

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODEL = "Qwen/Qwen3-Embedding-0.6B"
POLICY = REPO / "extproc" / "policies" / "qwen3-embedding-0.6b.yaml"
CORPUS = REPO / "extproc" / "data" / "corpus.jsonl"
WORST_INPUTS = 2048
REWRITE_DIMENSIONS = CUT_DIMENSIONS  # the instant upstream's native port answers this size
UPSTREAM_DIMENSIONS = 1024


@dataclass(frozen=True)
class Case:
    key: str
    label: str
    target: str  # "upstream" or an Envoy name: "B", "N", "S", "S2", "T", "F", "Z", "U", ...
    request: str  # "plain" (a) or "rewrite" (b)
    uses_extproc: bool
    floor: bool = False  # served by floor_processor.py instead of `extproc serve`
    # The floor processor doing the body work with the libraries alone (case L):
    # it cuts the vectors as the server does.
    library: bool = False
    # The upstream cuts `dimensions` itself (the instant upstream's native port) and
    # the policy says so (`upstream.native.dimensions`): `dimensions` is forwarded.
    native: bool = False
    comparison: bool = False  # a pattern no shipped config uses any more, run with the floors
    # ext_proc server processes behind the case's Envoy: more than 1 are `extproc serve`
    # workers of their own, in one Envoy cluster as `extproc run --workers N` renders it.
    workers: int = 1
    # For the capacity table only (bench/README.md): run with the floors, and only on
    # ``workloads``.
    capacity: bool = False
    workloads: tuple[str, ...] = ()  # empty: every workload of the run


SATURATION = ("sat-c16", "sat-c64")

CASES = [
    Case("A", "A upstream direct", "upstream", "plain", False),
    Case("B", "B Envoy alone", "B", "plain", False),
    Case("N-a", "N naive, no rewrite", "N", "plain", True),
    Case("N-b", "N naive, full rewrite", "N", "rewrite", True),
    Case("S-a", "S shipped, no rewrite", "S", "plain", True),
    Case(
        "S-a2",
        "S shipped, no rewr., 2 wkr",
        "S2",
        "plain",
        True,
        workers=2,
        capacity=True,
        workloads=SATURATION,
    ),
    Case("S-b", "S shipped, full rewrite", "S", "rewrite", True),
    Case("S-b2", "S shipped, full r., 2 wkr", "S2", "rewrite", True, workers=2),
    Case("F-a", "F floor of S, no rewrite", "F", "plain", True, floor=True),
    Case("F-b", "F floor of S, full rewr.", "F", "rewrite", True, floor=True),
    Case("Z-a", "Z floor of N, no rewrite", "Z", "plain", True, floor=True),
    Case("Z-b", "Z floor of N, full rewr.", "Z", "rewrite", True, floor=True),
    Case("L-a", "L library floor, no rewr.", "L", "plain", True, floor=True, library=True),
    Case("L-b", "L library floor, full r.", "L", "rewrite", True, floor=True, library=True),
    Case("S-n", "S shipped, native dims", "S-n", "rewrite", True, native=True),
    Case(
        "S-n2",
        "S shipped, native, 2 wkr",
        "S-n2",
        "rewrite",
        True,
        native=True,
        workers=2,
        capacity=True,
        workloads=SATURATION,
    ),
    Case("F-n", "F floor of S, native dims", "F-n", "rewrite", True, floor=True, native=True),
    Case("T-b", "T two streams, full rewr.", "T", "rewrite", True, comparison=True),
    Case("U-b", "U floor of T, full rewr.", "U", "rewrite", True, floor=True),
]


@dataclass(frozen=True)
class Workload:
    key: str
    description: str
    inputs: int
    connections: int
    timeout_s: int  # wrk's per-request timeout (counted as an error past it)


WORKLOADS = {
    "seed-c1": Workload("seed-c1", "seed batch (8 docs ~84 tok), c=1", 8, 1, 10),
    "seed-c4": Workload("seed-c4", "seed batch (8 docs ~84 tok), c=4", 8, 4, 10),
    "sat-c16": Workload("sat-c16", "saturation, 8 docs, c=16", 8, 16, 10),
    "sat-c64": Workload("sat-c64", "saturation, 8 docs, c=64", 8, 64, 10),
    "worst-2048": Workload("worst-2048", "worst case, 2,048 docs, c=1", WORST_INPUTS, 1, 60),
}
QUICK_WORKLOADS = ["seed-c1", "sat-c16"]


def corpus_documents() -> list[str]:
    rows = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line]
    return [r["text"] for r in rows if r["lang"] == "en" and r["kind"] == "document"]


def request_body(kind: str, inputs: int) -> bytes:
    """(a) "plain": the model and `inputs` documents; (b) "rewrite": plus a query
    instruction and a Matryoshka cut."""
    docs = corpus_documents()
    texts = [docs[i % len(docs)] for i in range(inputs)]
    body: dict[str, Any] = {"model": MODEL, "input": texts}
    if kind == "rewrite":
        body["input_type"] = "query"
        body["dimensions"] = REWRITE_DIMENSIONS
    return orjson.dumps(body)


def expected_dimensions(case: Case) -> int:
    """Only the real gateway, or an upstream that cuts itself, cuts vectors; the
    floors and the upstream otherwise send them whole."""
    if case.request != "rewrite":
        return UPSTREAM_DIMENSIONS
    rewritten = case.native or case.library or (case.uses_extproc and not case.floor)
    return REWRITE_DIMENSIONS if rewritten else UPSTREAM_DIMENSIONS


def native_policy(directory: Path) -> Path:
    """The shipped policy with every model declaring that its upstream cuts
    `dimensions` itself; written to ``directory``."""
    doc = yaml.safe_load(POLICY.read_text(encoding="utf-8"))
    for model in doc["models"]:
        upstream = model.setdefault("upstream", {})
        upstream.setdefault("native", {})["dimensions"] = True
    path = directory / "policy-native.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def write_request_bodies(directory: Path, workload_keys: list[str]) -> dict[tuple[str, int], Path]:
    """One request body file per kind and batch size: {(kind, inputs): path}."""
    bodies: dict[tuple[str, int], Path] = {}
    for inputs in sorted({WORKLOADS[k].inputs for k in workload_keys}):
        for kind in ("plain", "rewrite"):
            path = directory / f"request-{kind}-{inputs}.json"
            path.write_bytes(request_body(kind, inputs))
            bodies[(kind, inputs)] = path
    return bodies
