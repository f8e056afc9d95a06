"""Compare a baseline half with a candidate half (and, optionally, a noise half).

The answers are compared by the parity package (status classes, vector count,
cosine, dimensions and norm per input, ``usage.prompt_tokens``); shadow mode adds
the noise rule, the latency ratio and whether both taps saw the same request. Pure.

Latency: Envoy's own measure of each upstream (``x-envoy-upstream-service-time``,
time to the first response byte) when both halves carry it; otherwise the taps'
first-to-last message times as the comparator saw them, which a busy comparator
inflates.

Noise rule: an input below ``min_cosine`` is *explained by noise* when a noise half
gave ``n = 1 - cosine(baseline, noise)`` and its difference ``d = 1 - cosine(baseline,
candidate)`` is ``d <= noise_relative * n + noise_absolute``; explained inputs are
not mismatches, and are left out of the minimum the verdict checks. A status-class
difference is explained when the noise replica's class differs from the baseline's
too (the baseline itself is flaky).
"""

from __future__ import annotations

from dataclasses import dataclass

from extproc.core.status import is_success
from extproc.tools import parity
from extproc.tools.parity import InputComparison, compare_answers
from extproc.tools.shadow.half import Half, InputKind


@dataclass(frozen=True)
class Tolerances(parity.Tolerances):
    noise_relative: float = 2.0
    noise_absolute: float = 1e-5


@dataclass(frozen=True)
class InputResult(InputComparison):
    noise_cosine: float | None
    explained_by_noise: bool  # below min_cosine, but within the baseline-vs-noise difference
    mismatch: bool  # dims differ, or cosine < min_cosine, and not explained by noise


@dataclass(frozen=True)
class PairResult:
    request_id: str
    kind: InputKind
    baseline_status: int
    candidate_status: int
    noise_status: int | None
    status_match: bool  # the same status class
    status_explained_by_noise: bool
    inputs: tuple[InputResult, ...]
    count_mismatch: bool  # both 2xx with usable bodies, different numbers of vectors
    baseline_problem: str  # why a 2xx body was unusable
    candidate_problem: str
    token_diff: int | None  # candidate - baseline usage.prompt_tokens
    baseline_tokens: int | None
    candidate_tokens: int | None
    baseline_latency_s: float
    candidate_latency_s: float
    latency_source: str  # "envoy" (both upstream times known) or "tap"
    request_mismatch: bool  # the two taps saw different request bytes
    texts: tuple[str, ...] = ()

    @property
    def status_mismatch(self) -> bool:
        """A status-class difference the noise replica does not explain."""
        return not self.status_match and not self.status_explained_by_noise

    @property
    def both_2xx(self) -> bool:
        return bool(is_success(self.baseline_status) and is_success(self.candidate_status))

    @property
    def latency_ratio(self) -> float | None:
        if self.baseline_latency_s <= 0 or self.candidate_latency_s <= 0:
            return None
        return self.candidate_latency_s / self.baseline_latency_s


def compare_pair(
    baseline: Half,
    candidate: Half,
    noise: Half | None = None,
    tolerances: Tolerances = Tolerances(),
) -> PairResult:
    compared = compare_answers(baseline.answer, candidate.answer, tolerances)
    noise_compared = (
        compare_answers(baseline.answer, noise.answer, tolerances) if noise is not None else None
    )
    noise_cosines: list[float | None] = [None] * len(compared.inputs)
    if noise_compared is not None and len(noise_compared.inputs) == len(compared.inputs):
        noise_cosines = [item.cosine for item in noise_compared.inputs]
    if baseline.upstream_s is not None and candidate.upstream_s is not None:
        latencies, source = (baseline.upstream_s, candidate.upstream_s), "envoy"
    else:
        latencies, source = (baseline.latency_s, candidate.latency_s), "tap"
    b, c = baseline.answer, candidate.answer
    return PairResult(
        request_id=baseline.request_id,
        kind=baseline.kind,
        baseline_status=b.status,
        candidate_status=c.status,
        noise_status=noise.answer.status if noise is not None else None,
        status_match=compared.same_class,
        status_explained_by_noise=(
            noise_compared is not None and not compared.same_class and not noise_compared.same_class
        ),
        inputs=tuple(
            _judge(item, noise_cosine, tolerances)
            for item, noise_cosine in zip(compared.inputs, noise_cosines, strict=True)
        ),
        count_mismatch=compared.count_mismatch,
        baseline_problem=b.problem,
        candidate_problem=c.problem,
        token_diff=compared.token_diff,
        baseline_tokens=b.prompt_tokens,
        candidate_tokens=c.prompt_tokens,
        baseline_latency_s=latencies[0],
        candidate_latency_s=latencies[1],
        latency_source=source,
        request_mismatch=baseline.request_digest != candidate.request_digest,
        texts=baseline.texts or candidate.texts,
    )


def _judge(item: InputComparison, noise_cosine: float | None, tol: Tolerances) -> InputResult:
    cosine = item.cosine
    below = cosine is None or cosine < tol.min_cosine
    explained = (
        below
        and cosine is not None
        and noise_cosine is not None
        and (1.0 - cosine) <= tol.noise_relative * (1.0 - noise_cosine) + tol.noise_absolute
    )
    return InputResult(
        **vars(item),
        noise_cosine=noise_cosine,
        explained_by_noise=explained,
        mismatch=below and not explained,
    )
