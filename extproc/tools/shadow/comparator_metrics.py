"""Prometheus metrics of the comparator, in their own registry.

Label values come from fixed sets only (roles, input kinds, status classes,
reasons): no request ids, no model names, no text.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from extproc.tools.shadow.pair_comparison import PairResult

COSINE_BUCKETS: Final = (0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99999, 1.0)
RATIO_BUCKETS: Final = (0.1, 0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0, 10.0)
TOKEN_DIFF_BUCKETS: Final = (0, 1, 2, 5, 10, 20, 50, 100, 1000)
_PREFIX: Final = "extproc_shadow_"
_KIND: Final = ("kind",)


class ShadowMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(_PREFIX + name, doc, labels, registry=self.registry)

        def histogram(
            name: str, doc: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()
        ) -> Histogram:
            return Histogram(_PREFIX + name, doc, labels, buckets=buckets, registry=self.registry)

        self.pairs = counter(
            "pairs_total",
            "Compared request pairs by baseline and candidate status class.",
            ("baseline_class", "candidate_class"),
        )
        self.status_mismatches = counter(
            "status_mismatches_total",
            "Pairs whose status classes differ (not explained by the noise replica).",
        )
        self.cosine = histogram(
            "cosine",
            "Cosine similarity of baseline and candidate vectors, per input.",
            COSINE_BUCKETS,
            _KIND,
        )
        self.mismatches = counter(
            "input_mismatches_total",
            "Inputs below the cosine threshold or of another dimension, not explained by noise.",
            _KIND,
        )
        self.explained = counter(
            "inputs_within_noise_total",
            "Inputs whose difference is within the baseline-vs-noise difference.",
            _KIND,
        )
        self.dimension_mismatches = counter(
            "dimension_mismatches_total", "Inputs whose vectors have different sizes.", _KIND
        )
        self.norm_mismatches = counter(
            "norm_mismatches_total",
            "Inputs whose vector L2 norms differ beyond the tolerance.",
            _KIND,
        )
        self.count_mismatches = counter(
            "count_mismatches_total", "2xx pairs with different numbers of vectors."
        )
        self.request_mismatches = counter(
            "request_mismatches_total",
            "Pairs whose taps saw different request bytes (a set-up error).",
        )
        self.token_diff = histogram(
            "prompt_tokens_abs_diff",
            "|candidate - baseline| usage.prompt_tokens per 2xx pair.",
            TOKEN_DIFF_BUCKETS,
        )
        self.latency_ratio = histogram(
            "latency_ratio",
            "Candidate latency / baseline latency per 2xx pair.",
            RATIO_BUCKETS,
        )
        self.rerank_pairs = counter(
            "rerank_pairs_total",
            "Rerank pairs compared whole: same, or different (as a client sees them).",
            ("result",),
        )
        for result in ("same", "different"):
            self.rerank_pairs.labels(result)
        self.halves = counter("halves_total", "Halves received from the taps.", ("role",))
        self.halves_dropped = counter(
            "halves_dropped_total",
            "Halves that never made a pair: expired, evicted, duplicate, late.",
            ("role", "reason"),
        )
        self.tap_problems = counter(
            "tap_problems_total",
            "Tap streams that gave no half: no_role, no_request_id, too_large, incomplete, "
            "internal_error.",
            ("reason",),
        )
        r = self.registry
        self.pending = Gauge(
            _PREFIX + "pending_halves", "Request ids waiting for a half.", registry=r
        )
        self.pending_bytes = Gauge(_PREFIX + "pending_bytes", "Waiting halves, bytes.", registry=r)
        self.tap_streams = Gauge(_PREFIX + "tap_streams", "Tap streams open.", registry=r)

    def observe_pair(self, result: PairResult) -> None:
        self.pairs.labels(result.compared.baseline_class, result.compared.candidate_class).inc()
        self.status_mismatches.inc(result.status_mismatch)
        self.count_mismatches.inc(result.compared.count_mismatch)
        self.request_mismatches.inc(result.request_mismatch)
        if result.rerank is not None:
            self.rerank_pairs.labels("different" if result.rerank_mismatch else "same").inc()
            return
        kind = result.kind.value
        for item in result.inputs:
            if item.cosine is not None:
                self.cosine.labels(kind).observe(item.cosine)
            self.mismatches.labels(kind).inc(item.mismatch)
            self.explained.labels(kind).inc(item.explained_by_noise)
            self.dimension_mismatches.labels(kind).inc(not item.dims_match)
            self.norm_mismatches.labels(kind).inc(item.dims_match and not item.norm_match)
        if result.both_2xx:
            if result.compared.token_diff is not None:
                self.token_diff.observe(abs(result.compared.token_diff))
            if result.latency_ratio is not None:
                self.latency_ratio.observe(result.latency_ratio)
