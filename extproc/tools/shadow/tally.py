"""Running totals of compared pairs: bounded, mergeable across replicas, JSON-able.

One :class:`Tally` per comparator replica; it only grows by counts, bounded
maps (status-class pairs, dimension sizes), quantile sketches and a fixed-size
list of the worst inputs, so its size does not depend on the traffic. Replicas
exchange tallies as JSON (the peer service's ``GetTally``) and any replica can
merge them into the cluster-wide summary.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from extproc.tools.shadow.compare import InputResult, PairResult, status_class
from extproc.tools.shadow.half import InputKind
from extproc.tools.shadow.sketch import Sketch

FORMAT: Final = 1
WORST_SIZE: Final = 20
EXAMPLES_SIZE: Final = 20
MAX_DIM_KEYS: Final = 32  # distinct vector sizes remembered per side ("other" beyond)


@dataclass
class KindTally:
    """Inputs of one kind (documents or queries)."""

    requests: int = 0
    inputs: int = 0  # inputs whose vectors were compared
    distance: Sketch = field(default_factory=Sketch)  # 1 - cosine
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
    token_requests: int = 0  # requests where both sides reported usage.prompt_tokens
    tokens_equal: int = 0
    baseline_tokens: int = 0
    candidate_tokens: int = 0
    max_abs_token_diff: int = 0

    def add_input(self, result: InputResult) -> None:
        self.inputs += 1
        _count_dims(self.baseline_dims, result.baseline_dims)
        _count_dims(self.candidate_dims, result.candidate_dims)
        self.baseline_norm = _span(self.baseline_norm, result.baseline_norm)
        self.candidate_norm = _span(self.candidate_norm, result.candidate_norm)
        if not result.dims_match:
            self.dimension_mismatches += 1
        elif not result.norm_match:
            self.norm_mismatches += 1
        if result.explained_by_noise:
            self.explained_by_noise += 1
        if result.mismatch:
            self.mismatches += 1
        if result.cosine is None:
            return
        self.distance.add(max(0.0, 1.0 - result.cosine))
        self.min_cosine = _min(self.min_cosine, result.cosine)
        self.max_cosine = _max(self.max_cosine, result.cosine)
        if not result.explained_by_noise:
            self.min_unexplained_cosine = _min(self.min_unexplained_cosine, result.cosine)

    def add_tokens(self, baseline: int, candidate: int) -> None:
        self.token_requests += 1
        self.tokens_equal += baseline == candidate
        self.baseline_tokens += baseline
        self.candidate_tokens += candidate
        self.max_abs_token_diff = max(self.max_abs_token_diff, abs(candidate - baseline))

    def merge(self, other: KindTally) -> None:
        self.requests += other.requests
        self.inputs += other.inputs
        self.distance.merge(other.distance)
        self.min_cosine = _min(self.min_cosine, other.min_cosine)
        self.max_cosine = _max(self.max_cosine, other.max_cosine)
        self.min_unexplained_cosine = _min(
            self.min_unexplained_cosine, other.min_unexplained_cosine
        )
        self.mismatches += other.mismatches
        self.explained_by_noise += other.explained_by_noise
        self.dimension_mismatches += other.dimension_mismatches
        self.norm_mismatches += other.norm_mismatches
        for key, n in other.baseline_dims.items():
            _count_dims(self.baseline_dims, key, n)
        for key, n in other.candidate_dims.items():
            _count_dims(self.candidate_dims, key, n)
        for lo_hi in other.baseline_norm or ():
            self.baseline_norm = _span(self.baseline_norm, lo_hi)
        for lo_hi in other.candidate_norm or ():
            self.candidate_norm = _span(self.candidate_norm, lo_hi)
        self.token_requests += other.token_requests
        self.tokens_equal += other.tokens_equal
        self.baseline_tokens += other.baseline_tokens
        self.candidate_tokens += other.candidate_tokens
        self.max_abs_token_diff = max(self.max_abs_token_diff, other.max_abs_token_diff)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "inputs": self.inputs,
            "distance": self.distance.to_json(),
            "min_cosine": self.min_cosine,
            "max_cosine": self.max_cosine,
            "min_unexplained_cosine": self.min_unexplained_cosine,
            "mismatches": self.mismatches,
            "explained_by_noise": self.explained_by_noise,
            "dimension_mismatches": self.dimension_mismatches,
            "norm_mismatches": self.norm_mismatches,
            "baseline_dims": dict(self.baseline_dims),
            "candidate_dims": dict(self.candidate_dims),
            "baseline_norm": list(self.baseline_norm) if self.baseline_norm else None,
            "candidate_norm": list(self.candidate_norm) if self.candidate_norm else None,
            "token_requests": self.token_requests,
            "tokens_equal": self.tokens_equal,
            "baseline_tokens": self.baseline_tokens,
            "candidate_tokens": self.candidate_tokens,
            "max_abs_token_diff": self.max_abs_token_diff,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> KindTally:
        return cls(
            requests=int(doc["requests"]),
            inputs=int(doc["inputs"]),
            distance=Sketch.from_json(doc["distance"]),
            min_cosine=_opt_float(doc["min_cosine"]),
            max_cosine=_opt_float(doc["max_cosine"]),
            min_unexplained_cosine=_opt_float(doc["min_unexplained_cosine"]),
            mismatches=int(doc["mismatches"]),
            explained_by_noise=int(doc["explained_by_noise"]),
            dimension_mismatches=int(doc["dimension_mismatches"]),
            norm_mismatches=int(doc["norm_mismatches"]),
            baseline_dims=Counter({str(k): int(v) for k, v in doc["baseline_dims"].items()}),
            candidate_dims=Counter({str(k): int(v) for k, v in doc["candidate_dims"].items()}),
            baseline_norm=_opt_span(doc["baseline_norm"]),
            candidate_norm=_opt_span(doc["candidate_norm"]),
            token_requests=int(doc["token_requests"]),
            tokens_equal=int(doc["tokens_equal"]),
            baseline_tokens=int(doc["baseline_tokens"]),
            candidate_tokens=int(doc["candidate_tokens"]),
            max_abs_token_diff=int(doc["max_abs_token_diff"]),
        )


@dataclass
class Tally:
    pairs: int = 0
    pairs_with_noise: int = 0
    kinds: dict[str, KindTally] = field(
        default_factory=lambda: {kind.value: KindTally() for kind in InputKind}
    )
    status_pairs: Counter[str] = field(default_factory=Counter)  # "2xx/5xx" -> n
    status_mismatches: Counter[str] = field(default_factory=Counter)  # unexplained only
    status_explained_by_noise: int = 0
    status_examples: list[dict[str, Any]] = field(default_factory=list)
    count_mismatches: int = 0
    request_mismatches: int = 0
    unusable_bodies: Counter[str] = field(default_factory=Counter)  # role -> n
    latency_ratio: Sketch = field(default_factory=Sketch)
    baseline_latency_s: Sketch = field(default_factory=Sketch)
    candidate_latency_s: Sketch = field(default_factory=Sketch)
    latency_sources: Counter[str] = field(default_factory=Counter)  # envoy | tap -> n
    halves_received: Counter[str] = field(default_factory=Counter)  # role -> n
    halves_dropped: Counter[str] = field(default_factory=Counter)  # "reason/role" -> n
    tap_problems: Counter[str] = field(default_factory=Counter)  # reason -> n
    forwarding: Counter[str] = field(default_factory=Counter)  # sent, received, dropped_*
    worst: list[dict[str, Any]] = field(default_factory=list)

    # -- recording ---------------------------------------------------------------------

    def add_pair(self, result: PairResult) -> None:
        self.pairs += 1
        self.pairs_with_noise += result.noise_status is not None
        key = f"{status_class(result.baseline_status)}/{status_class(result.candidate_status)}"
        self.status_pairs[key] += 1
        if result.status_explained_by_noise:
            self.status_explained_by_noise += 1
        elif result.status_mismatch:
            self.status_mismatches[key] += 1
            self.status_examples.append(
                {
                    "request_id": result.request_id,
                    "kind": result.kind.value,
                    "baseline": result.baseline_status,
                    "candidate": result.candidate_status,
                }
            )
            del self.status_examples[:-EXAMPLES_SIZE]
        self.count_mismatches += result.count_mismatch
        self.request_mismatches += result.request_mismatch
        for role, problem in (
            ("baseline", result.baseline_problem),
            ("candidate", result.candidate_problem),
        ):
            if problem:
                self.unusable_bodies[role] += 1

        kind = self.kinds[result.kind.value]
        kind.requests += 1
        for item in result.inputs:
            kind.add_input(item)
            if not item.explained_by_noise:
                text = result.texts[item.index] if item.index < len(result.texts) else None
                self._note_worst(result, item, text)
        both_2xx = 200 <= result.baseline_status < 300 and 200 <= result.candidate_status < 300
        if both_2xx and result.baseline_tokens is not None and result.candidate_tokens is not None:
            kind.add_tokens(result.baseline_tokens, result.candidate_tokens)
        if both_2xx:
            ratio = result.latency_ratio
            if ratio is not None:
                self.latency_ratio.add(ratio)
            self.baseline_latency_s.add(max(0.0, result.baseline_latency_s))
            self.candidate_latency_s.add(max(0.0, result.candidate_latency_s))
            self.latency_sources[result.latency_source] += 1

    def _note_worst(self, result: PairResult, item: InputResult, text: str | None) -> None:
        entry: dict[str, Any] = {
            "request_id": result.request_id,
            "index": item.index,
            "kind": item.kind.value,
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

    # -- merging and exchange ----------------------------------------------------------

    def merge(self, other: Tally) -> None:
        self.pairs += other.pairs
        self.pairs_with_noise += other.pairs_with_noise
        for name, kind in other.kinds.items():
            self.kinds.setdefault(name, KindTally()).merge(kind)
        self.status_pairs.update(other.status_pairs)
        self.status_mismatches.update(other.status_mismatches)
        self.status_explained_by_noise += other.status_explained_by_noise
        self.status_examples = (self.status_examples + other.status_examples)[-EXAMPLES_SIZE:]
        self.count_mismatches += other.count_mismatches
        self.request_mismatches += other.request_mismatches
        self.unusable_bodies.update(other.unusable_bodies)
        self.latency_ratio.merge(other.latency_ratio)
        self.baseline_latency_s.merge(other.baseline_latency_s)
        self.candidate_latency_s.merge(other.candidate_latency_s)
        self.latency_sources.update(other.latency_sources)
        self.halves_received.update(other.halves_received)
        self.halves_dropped.update(other.halves_dropped)
        self.tap_problems.update(other.tap_problems)
        self.forwarding.update(other.forwarding)
        self.worst = _worst_of(self.worst + other.worst)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "pairs": self.pairs,
            "pairs_with_noise": self.pairs_with_noise,
            "kinds": {name: kind.to_json() for name, kind in self.kinds.items()},
            "status_pairs": dict(self.status_pairs),
            "status_mismatches": dict(self.status_mismatches),
            "status_explained_by_noise": self.status_explained_by_noise,
            "status_examples": list(self.status_examples),
            "count_mismatches": self.count_mismatches,
            "request_mismatches": self.request_mismatches,
            "unusable_bodies": dict(self.unusable_bodies),
            "latency_ratio": self.latency_ratio.to_json(),
            "baseline_latency_s": self.baseline_latency_s.to_json(),
            "candidate_latency_s": self.candidate_latency_s.to_json(),
            "latency_sources": dict(self.latency_sources),
            "halves_received": dict(self.halves_received),
            "halves_dropped": dict(self.halves_dropped),
            "tap_problems": dict(self.tap_problems),
            "forwarding": dict(self.forwarding),
            "worst": list(self.worst),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Tally:
        if doc.get("format") != FORMAT:
            raise ValueError(f"unknown tally format {doc.get('format')!r}")
        return cls(
            pairs=int(doc["pairs"]),
            pairs_with_noise=int(doc["pairs_with_noise"]),
            kinds={name: KindTally.from_json(kind) for name, kind in doc["kinds"].items()},
            status_pairs=_counter(doc["status_pairs"]),
            status_mismatches=_counter(doc["status_mismatches"]),
            status_explained_by_noise=int(doc["status_explained_by_noise"]),
            status_examples=list(doc["status_examples"])[-EXAMPLES_SIZE:],
            count_mismatches=int(doc["count_mismatches"]),
            request_mismatches=int(doc["request_mismatches"]),
            unusable_bodies=_counter(doc["unusable_bodies"]),
            latency_ratio=Sketch.from_json(doc["latency_ratio"]),
            baseline_latency_s=Sketch.from_json(doc["baseline_latency_s"]),
            candidate_latency_s=Sketch.from_json(doc["candidate_latency_s"]),
            latency_sources=_counter(doc["latency_sources"]),
            halves_received=_counter(doc["halves_received"]),
            halves_dropped=_counter(doc["halves_dropped"]),
            tap_problems=_counter(doc["tap_problems"]),
            forwarding=_counter(doc["forwarding"]),
            worst=_worst_of(doc["worst"]),
        )

    @classmethod
    def merged(cls, tallies: Iterable[Tally]) -> Tally:
        out = cls()
        for tally in tallies:
            out.merge(tally)
        return out


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


def _count_dims(counter: Counter[str], dims: int | str, n: int = 1) -> None:
    key = str(dims)
    if key not in counter and len(counter) >= MAX_DIM_KEYS:
        key = "other"
    counter[key] += n


def _span(span: tuple[float, float] | None, value: float) -> tuple[float, float]:
    if span is None:
        return (value, value)
    return (min(span[0], value), max(span[1], value))


def _min(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def _max(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _opt_span(value: Any) -> tuple[float, float] | None:
    if value is None:
        return None
    lo, hi = value
    return (float(lo), float(hi))


def _counter(doc: Mapping[str, Any]) -> Counter[str]:
    return Counter({str(k): int(v) for k, v in doc.items()})
