"""Compare a baseline half with a candidate half (and, optionally, a noise half).

The answers are compared by the parity package (status classes, vector count,
cosine, dimensions and norm per input, ``usage.prompt_tokens``), a rerank pair's
whole by the parity package's rerank comparison (status, error body shape, results,
documents, order, scores); shadow mode adds
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
from extproc.tools.parity import Answer, Comparison, InputComparison, compare_answers
from extproc.tools.parity.rerank_comparison import RerankRow, compare_replies
from extproc.tools.shadow.half import Half, InputKind


@dataclass(frozen=True)
class ShadowTolerances(parity.Tolerances):
    """The parity tolerances and the noise rule's two terms."""

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
    baseline: Answer
    candidate: Answer
    compared: Comparison  # status classes, vector count, token difference
    inputs: tuple[InputResult, ...]  # compared.inputs, judged against the noise
    noise_status: int | None
    status_explained_by_noise: bool
    latencies_s: tuple[float, float]  # baseline, candidate
    latency_source: str  # "envoy" (both upstream times known) or "tap"
    request_mismatch: bool  # the two taps saw different request bytes
    texts: tuple[str, ...] = ()
    rerank: RerankRow | None = None  # a rerank pair, compared whole

    @property
    def rerank_mismatch(self) -> bool:
        """A rerank pair a client would tell apart."""
        return self.rerank is not None and bool(self.rerank.problem)

    @property
    def status_mismatch(self) -> bool:
        """A status-class difference the noise replica does not explain."""
        return not self.compared.same_class and not self.status_explained_by_noise

    @property
    def both_2xx(self) -> bool:
        return bool(is_success(self.baseline.status) and is_success(self.candidate.status))

    @property
    def latency_ratio(self) -> float | None:
        baseline, candidate = self.latencies_s
        return candidate / baseline if baseline > 0 and candidate > 0 else None


def compare_pair(
    baseline: Half,
    candidate: Half,
    noise: Half | None = None,
    tolerances: ShadowTolerances = ShadowTolerances(),
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
    judged = zip(compared.inputs, noise_cosines, strict=True)
    return PairResult(
        request_id=baseline.request_id,
        kind=baseline.kind,
        baseline=baseline.answer,
        candidate=candidate.answer,
        compared=compared,
        inputs=tuple(_judge(item, noise_cosine, tolerances) for item, noise_cosine in judged),
        noise_status=noise.answer.status if noise is not None else None,
        status_explained_by_noise=(
            noise_compared is not None and not compared.same_class and not noise_compared.same_class
        ),
        latencies_s=latencies,
        latency_source=source,
        request_mismatch=baseline.request_digest != candidate.request_digest,
        texts=baseline.texts or candidate.texts,
        rerank=(
            compare_replies(baseline.request_id, baseline.rerank, candidate.rerank)
            if baseline.rerank is not None and candidate.rerank is not None
            else None
        ),
    )


def _judge(item: InputComparison, noise_cosine: float | None, tol: ShadowTolerances) -> InputResult:
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
