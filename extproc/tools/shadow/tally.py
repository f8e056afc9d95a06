"""Running totals of compared pairs: bounded, whatever the traffic.

The comparator keeps one :class:`Tally`; it only grows by counts, bounded maps
(status-class pairs, vector sizes, kinds of rerank difference), quantile sketches
(DataDog's DDSketch: 1 % relative error, memory bounded by the range of the values,
not their number) and fixed-size lists of the worst inputs and the latest rerank
differences. :func:`extproc.tools.shadow.summary.summarize` turns it into the JSON
summary.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ddsketch import DDSketch

from extproc.tools.parity.rerank_comparison import RerankRow
from extproc.tools.shadow.half import VECTOR_KINDS
from extproc.tools.shadow.pair_comparison import InputResult, PairResult

WORST_SIZE: Final = 20
EXAMPLES_SIZE: Final = 20
MAX_DIM_KEYS: Final = 32  # distinct vector sizes remembered per side ("other" beyond)
SKETCH_ACCURACY: Final = 0.01


def new_sketch() -> DDSketch:
    return DDSketch(SKETCH_ACCURACY)


@dataclass
class TokenTally:
    """``usage.prompt_tokens`` of the 2xx pairs where both sides reported it."""

    requests: int = 0
    equal: int = 0
    baseline_total: int = 0
    candidate_total: int = 0
    max_abs_diff: int = 0

    def add(self, baseline: int, candidate: int) -> None:
        self.requests += 1
        self.equal += baseline == candidate
        self.baseline_total += baseline
        self.candidate_total += candidate
        self.max_abs_diff = max(self.max_abs_diff, abs(candidate - baseline))


@dataclass
class KindTally:
    """Inputs of one kind (documents or queries)."""

    requests: int = 0
    inputs: int = 0  # inputs whose vectors were compared
    distance: DDSketch = field(default_factory=new_sketch)  # 1 - cosine
    min_cosine: float | None = None
    max_cosine: float | None = None
    min_unexplained_cosine: float | None = None
    mismatches: int = 0
    explained_by_noise: int = 0
    dimension_mismatches: int = 0
    norm_mismatches: int = 0
    baseline_dims: Counter[str] = field(default_factory=Counter)
    candidate_dims: Counter[str] = field(default_factory=Counter)
    baseline_norm: tuple[float, float] | None = None  # (min, max)
    candidate_norm: tuple[float, float] | None = None
    tokens: TokenTally = field(default_factory=TokenTally)

    def add_input(self, result: InputResult) -> None:
        self.inputs += 1
        _count_dims(self.baseline_dims, result.baseline_dims)
        _count_dims(self.candidate_dims, result.candidate_dims)
        self.baseline_norm = _span(self.baseline_norm, result.baseline_norm)
        self.candidate_norm = _span(self.candidate_norm, result.candidate_norm)
        self.dimension_mismatches += not result.dims_match
        self.norm_mismatches += result.dims_match and not result.norm_match
        self.explained_by_noise += result.explained_by_noise
        self.mismatches += result.mismatch
        if result.cosine is None:
            return
        self.distance.add(max(0.0, 1.0 - result.cosine))
        self.min_cosine = _min(self.min_cosine, result.cosine)
        self.max_cosine = max(result.cosine, self.max_cosine or -math.inf)
        if not result.explained_by_noise:
            self.min_unexplained_cosine = _min(self.min_unexplained_cosine, result.cosine)


@dataclass
class RerankTally:
    """Rerank pairs, each compared whole."""

    pairs: int = 0
    same: int = 0
    differences: Counter[str] = field(default_factory=Counter)  # "another order" -> n
    max_score_difference: float | None = None  # over pairs with the same documents
    examples: list[dict[str, Any]] = field(default_factory=list)  # the latest differences

    def add(self, request_id: str, row: RerankRow) -> None:
        self.pairs += 1
        if row.worst_score_difference is not None:
            worst = row.worst_score_difference
            self.max_score_difference = max(worst, self.max_score_difference or 0.0)
        if not row.problem:
            self.same += 1
            return
        self.differences[row.difference] += 1
        example = {"request_id": request_id, "problem": row.problem}
        self.examples.append({**example, "baseline": row.baseline, "candidate": row.candidate})
        del self.examples[:-EXAMPLES_SIZE]


@dataclass
class Tally:
    pairs: int = 0
    pairs_with_noise: int = 0
    kinds: dict[str, KindTally] = field(
        default_factory=lambda: {kind.value: KindTally() for kind in VECTOR_KINDS}
    )
    rerank: RerankTally = field(default_factory=RerankTally)
    status_pairs: Counter[str] = field(default_factory=Counter)  # "2xx/5xx" -> n
    status_mismatches: Counter[str] = field(default_factory=Counter)  # unexplained only
    status_explained_by_noise: int = 0
    status_examples: list[dict[str, Any]] = field(default_factory=list)
    count_mismatches: int = 0
    request_mismatches: int = 0
    unusable_bodies: Counter[str] = field(default_factory=Counter)  # role -> n
    latency_ratio: DDSketch = field(default_factory=new_sketch)
    baseline_latency_s: DDSketch = field(default_factory=new_sketch)
    candidate_latency_s: DDSketch = field(default_factory=new_sketch)
    latency_sources: Counter[str] = field(default_factory=Counter)  # envoy | tap -> n
    halves_received: Counter[str] = field(default_factory=Counter)  # role -> n
    halves_dropped: Counter[str] = field(default_factory=Counter)  # "reason/role" -> n
    tap_problems: Counter[str] = field(default_factory=Counter)  # reason -> n
    worst: list[dict[str, Any]] = field(default_factory=list)

    def add_pair(self, result: PairResult) -> None:
        self.pairs += 1
        self.pairs_with_noise += result.noise_status is not None
        key = f"{result.compared.baseline_class}/{result.compared.candidate_class}"
        self.status_pairs[key] += 1
        if result.status_explained_by_noise:
            self.status_explained_by_noise += 1
        elif result.status_mismatch:
            self.status_mismatches[key] += 1
            self.status_examples.append(
                {
                    "request_id": result.request_id,
                    "kind": result.kind.value,
                    "baseline": result.baseline.status,
                    "candidate": result.candidate.status,
                }
            )
            del self.status_examples[:-EXAMPLES_SIZE]
        self.count_mismatches += result.compared.count_mismatch
        self.request_mismatches += result.request_mismatch
        for role, answer in (("baseline", result.baseline), ("candidate", result.candidate)):
            if answer.problem:
                self.unusable_bodies[role] += 1

        if result.rerank is not None:
            self.rerank.add(result.request_id, result.rerank)
            return
        if result.kind.value not in self.kinds:
            return  # a rerank request without both replies: its statuses are counted above
        kind = self.kinds[result.kind.value]
        kind.requests += 1
        for item in result.inputs:
            kind.add_input(item)
            if not item.explained_by_noise:
                text = result.texts[item.index] if item.index < len(result.texts) else None
                self._note_worst(result, item, text)
        if not result.both_2xx:
            return
        tokens = (result.baseline.prompt_tokens, result.candidate.prompt_tokens)
        if tokens[0] is not None and tokens[1] is not None:
            kind.tokens.add(tokens[0], tokens[1])
        ratio = result.latency_ratio
        if ratio is not None:
            self.latency_ratio.add(ratio)
        self.baseline_latency_s.add(max(0.0, result.latencies_s[0]))
        self.candidate_latency_s.add(max(0.0, result.latencies_s[1]))
        self.latency_sources[result.latency_source] += 1

    def _note_worst(self, result: PairResult, item: InputResult, text: str | None) -> None:
        entry: dict[str, Any] = {
            "request_id": result.request_id,
            "index": item.index,
            "kind": result.kind.value,
            "cosine": item.cosine,
            "baseline_dims": item.baseline_dims,
            "candidate_dims": item.candidate_dims,
            "noise_cosine": item.noise_cosine,
            "mismatch": item.mismatch,
        }
        if text is not None:
            entry["text"] = text
        if len(self.worst) >= WORST_SIZE and _rank(entry) >= _rank(self.worst[-1]):
            return
        self.worst = _worst_of([*self.worst, entry])


def _worst_of(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The WORST_SIZE lowest cosines; a dimension mismatch (no cosine) ranks lowest."""
    return sorted(entries, key=_rank)[:WORST_SIZE]


def _rank(entry: Mapping[str, Any]) -> tuple[float, str, int]:
    cosine = entry.get("cosine")
    return (
        -math.inf if cosine is None else float(cosine),
        str(entry.get("request_id")),
        int(entry.get("index", 0)),
    )


def _count_dims(counter: Counter[str], dims: int) -> None:
    key = str(dims)
    if key not in counter and len(counter) >= MAX_DIM_KEYS:
        key = "other"
    counter[key] += 1


def _span(span: tuple[float, float] | None, value: float) -> tuple[float, float]:
    if span is None:
        return (value, value)
    return (min(span[0], value), max(span[1], value))


def _min(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)
