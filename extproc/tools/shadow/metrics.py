"""Prometheus metrics of one comparator replica, in their own registry.

Label values come from fixed sets only (roles, input kinds, status classes,
reasons): no request ids, no model names, no text. Prometheus sums replicas;
``/summary`` merges their tallies instead (quantiles need the sketches).
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from extproc.tools.shadow.compare import PairResult, status_class

COSINE_BUCKETS: Final = (
    0.0,
    0.5,
    0.8,
    0.9,
    0.95,
    0.99,
    0.995,
    0.999,
    0.9995,
    0.9999,
    0.99999,
    1.0,
)
RATIO_BUCKETS: Final = (0.1, 0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0, 10.0)
TOKEN_DIFF_BUCKETS: Final = (0, 1, 2, 5, 10, 20, 50, 100, 1000)


class ShadowMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.pairs = Counter(
            "extproc_shadow_pairs_total",
            "Compared request pairs by baseline and candidate status class.",
            ["baseline_class", "candidate_class"],
            registry=r,
        )
        self.status_mismatches = Counter(
            "extproc_shadow_status_mismatches_total",
            "Pairs whose status classes differ (not explained by the noise replica).",
            registry=r,
        )
        self.cosine = Histogram(
            "extproc_shadow_cosine",
            "Cosine similarity of baseline and candidate vectors, per input.",
            ["kind"],
            buckets=COSINE_BUCKETS,
            registry=r,
        )
        self.mismatches = Counter(
            "extproc_shadow_input_mismatches_total",
            "Inputs below the cosine threshold or of another dimension, not explained by noise.",
            ["kind"],
            registry=r,
        )
        self.explained = Counter(
            "extproc_shadow_inputs_within_noise_total",
            "Inputs whose difference is within the baseline-vs-noise difference.",
            ["kind"],
            registry=r,
        )
        self.dimension_mismatches = Counter(
            "extproc_shadow_dimension_mismatches_total",
            "Inputs whose vectors have different sizes.",
            ["kind"],
            registry=r,
        )
        self.norm_mismatches = Counter(
            "extproc_shadow_norm_mismatches_total",
            "Inputs whose vector L2 norms differ beyond the tolerance.",
            ["kind"],
            registry=r,
        )
        self.count_mismatches = Counter(
            "extproc_shadow_count_mismatches_total",
            "2xx pairs with different numbers of vectors.",
            registry=r,
        )
        self.request_mismatches = Counter(
            "extproc_shadow_request_mismatches_total",
            "Pairs whose taps saw different request bytes (a set-up error).",
            registry=r,
        )
        self.token_diff = Histogram(
            "extproc_shadow_prompt_tokens_abs_diff",
            "|candidate - baseline| usage.prompt_tokens per 2xx pair.",
            buckets=TOKEN_DIFF_BUCKETS,
            registry=r,
        )
        self.latency_ratio = Histogram(
            "extproc_shadow_latency_ratio",
            "Candidate latency / baseline latency per 2xx pair, as seen by the taps.",
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.halves = Counter(
            "extproc_shadow_halves_total",
            "Halves received from taps (source=tap) or from peer replicas (source=peer).",
            ["role", "source"],
            registry=r,
        )
        self.halves_dropped = Counter(
            "extproc_shadow_halves_dropped_total",
            "Halves that never made a pair: expired, evicted, duplicate, late.",
            ["role", "reason"],
            registry=r,
        )
        self.tap_problems = Counter(
            "extproc_shadow_tap_problems_total",
            "Tap streams that gave no half: no_role, no_request_id, too_large, incomplete, "
            "internal_error.",
            ["reason"],
            registry=r,
        )
        self.forwarded = Counter(
            "extproc_shadow_forwarded_halves_total",
            "Halves sent to their owner replica, by outcome: sent, received, queue_full, "
            "unreachable, peer_gone, error.",
            ["outcome"],
            registry=r,
        )
        self.pending = Gauge(
            "extproc_shadow_pending_halves",
            "Request ids waiting for their other half.",
            registry=r,
        )
        self.pending_bytes = Gauge(
            "extproc_shadow_pending_bytes",
            "Memory held by waiting halves (approx.).",
            registry=r,
        )
        self.tap_streams = Gauge(
            "extproc_shadow_tap_streams",
            "Tap streams open.",
            registry=r,
        )
        self.peers = Gauge(
            "extproc_shadow_peers",
            "Replicas in the current peer list (self included).",
            registry=r,
        )

    def observe_pair(self, result: PairResult) -> None:
        self.pairs.labels(
            status_class(result.baseline_status), status_class(result.candidate_status)
        ).inc()
        if result.status_mismatch:
            self.status_mismatches.inc()
        if result.count_mismatch:
            self.count_mismatches.inc()
        if result.request_mismatch:
            self.request_mismatches.inc()
        kind = result.kind.value
        for item in result.inputs:
            if item.cosine is not None:
                self.cosine.labels(kind).observe(item.cosine)
            if item.mismatch:
                self.mismatches.labels(kind).inc()
            if item.explained_by_noise:
                self.explained.labels(kind).inc()
            if not item.dims_match:
                self.dimension_mismatches.labels(kind).inc()
            elif not item.norm_match:
                self.norm_mismatches.labels(kind).inc()
        both_2xx = 200 <= result.baseline_status < 300 and 200 <= result.candidate_status < 300
        if both_2xx:
            diff = result.token_diff
            if diff is not None:
                self.token_diff.observe(abs(diff))
            ratio = result.latency_ratio
            if ratio is not None:
                self.latency_ratio.observe(ratio)
