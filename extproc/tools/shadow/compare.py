"""Compare a baseline half with a candidate half (and, optionally, a noise half).

Per input: cosine, dimension agreement, norm agreement, and whether a difference
is explained by baseline-vs-baseline noise. Per request: status-class parity,
input count, ``usage.prompt_tokens`` difference and latency ratio. Pure.

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

import numpy as np
import numpy.typing as npt

from extproc.tools.shadow.half import Half, InputKind


@dataclass(frozen=True)
class Tolerances:
    min_cosine: float = 0.999  # an input below this (and not explained) is a mismatch
    norm_tolerance: float = 1e-3  # relative difference of L2 norms still called equal
    noise_relative: float = 2.0
    noise_absolute: float = 1e-5


@dataclass(frozen=True)
class InputResult:
    index: int
    kind: InputKind
    cosine: float | None  # None: dimensions differ, or a zero vector
    baseline_dims: int
    candidate_dims: int
    baseline_norm: float
    candidate_norm: float
    norm_match: bool
    noise_cosine: float | None
    explained_by_noise: bool  # below min_cosine, but within the baseline-vs-noise difference
    mismatch: bool  # dims differ, or cosine < min_cosine, and not explained by noise

    @property
    def dims_match(self) -> bool:
        return self.baseline_dims == self.candidate_dims


@dataclass(frozen=True)
class PairResult:
    request_id: str
    kind: InputKind
    baseline_status: int
    candidate_status: int
    noise_status: int | None
    status_explained_by_noise: bool
    inputs: tuple[InputResult, ...]
    count_mismatch: bool  # both 2xx with usable bodies, different numbers of vectors
    baseline_problem: str
    candidate_problem: str
    baseline_tokens: int | None
    candidate_tokens: int | None
    baseline_latency_s: float
    candidate_latency_s: float
    latency_source: str  # "envoy" (both upstream times known) or "tap"
    request_mismatch: bool  # the two taps saw different request bytes
    texts: tuple[str, ...] = ()

    @property
    def status_match(self) -> bool:
        return status_class(self.baseline_status) == status_class(self.candidate_status)

    @property
    def status_mismatch(self) -> bool:
        """A status-class difference the noise replica does not explain."""
        return not self.status_match and not self.status_explained_by_noise

    @property
    def token_diff(self) -> int | None:
        if self.baseline_tokens is None or self.candidate_tokens is None:
            return None
        return self.candidate_tokens - self.baseline_tokens

    @property
    def latency_ratio(self) -> float | None:
        if self.baseline_latency_s <= 0 or self.candidate_latency_s <= 0:
            return None
        return self.candidate_latency_s / self.baseline_latency_s


def status_class(status: int) -> str:
    """``2xx``..``5xx``; ``none`` when no response arrived; ``other`` otherwise."""
    if status == 0:
        return "none"
    if 100 <= status < 600:
        return f"{status // 100}xx"
    return "other"


def compare_pair(
    baseline: Half,
    candidate: Half,
    noise: Half | None = None,
    tolerances: Tolerances = Tolerances(),
) -> PairResult:
    both_ok = (
        _is_2xx(baseline.status)
        and _is_2xx(candidate.status)
        and not baseline.problem
        and not candidate.problem
    )
    inputs: tuple[InputResult, ...] = ()
    count_mismatch = False
    if both_ok:
        rows_b, rows_c = baseline.vectors.shape[0], candidate.vectors.shape[0]
        count_mismatch = rows_b != rows_c
        if not count_mismatch:
            inputs = _compare_inputs(baseline, candidate, noise, tolerances)
    if baseline.upstream_s is not None and candidate.upstream_s is not None:
        latencies, source = (baseline.upstream_s, candidate.upstream_s), "envoy"
    else:
        latencies, source = (baseline.latency_s, candidate.latency_s), "tap"
    status_explained = (
        noise is not None
        and status_class(baseline.status) != status_class(candidate.status)
        and status_class(noise.status) != status_class(baseline.status)
    )
    return PairResult(
        request_id=baseline.request_id,
        kind=baseline.kind,
        baseline_status=baseline.status,
        candidate_status=candidate.status,
        noise_status=noise.status if noise is not None else None,
        status_explained_by_noise=status_explained,
        inputs=inputs,
        count_mismatch=count_mismatch,
        baseline_problem=baseline.problem if _is_2xx(baseline.status) else "",
        candidate_problem=candidate.problem if _is_2xx(candidate.status) else "",
        baseline_tokens=baseline.prompt_tokens,
        candidate_tokens=candidate.prompt_tokens,
        baseline_latency_s=latencies[0],
        candidate_latency_s=latencies[1],
        latency_source=source,
        request_mismatch=baseline.request_digest != candidate.request_digest,
        texts=baseline.texts or candidate.texts,
    )


def _is_2xx(status: int) -> bool:
    return 200 <= status < 300


def _compare_inputs(
    baseline: Half, candidate: Half, noise: Half | None, tol: Tolerances
) -> tuple[InputResult, ...]:
    b, c = baseline.vectors, candidate.vectors
    norms_b = _norms(b)
    norms_c = _norms(c)
    same_dims = b.shape[1] == c.shape[1]
    cosines = _cosines(b, c, norms_b, norms_c) if same_dims else None
    noise_cosines = None
    if (
        noise is not None
        and _is_2xx(noise.status)
        and not noise.problem
        and noise.vectors.shape == b.shape
    ):
        noise_cosines = _cosines(b, noise.vectors, norms_b, _norms(noise.vectors))

    results = []
    for row in range(b.shape[0]):
        cosine = _finite(cosines[row]) if cosines is not None else None
        noise_cosine = _finite(noise_cosines[row]) if noise_cosines is not None else None
        below = cosine is None or cosine < tol.min_cosine
        explained = (
            below
            and cosine is not None
            and noise_cosine is not None
            and (1.0 - cosine) <= tol.noise_relative * (1.0 - noise_cosine) + tol.noise_absolute
        )
        norm_b, norm_c = float(norms_b[row]), float(norms_c[row])
        results.append(
            InputResult(
                index=row,
                kind=baseline.kind,
                cosine=cosine,
                baseline_dims=int(b.shape[1]),
                candidate_dims=int(c.shape[1]),
                baseline_norm=norm_b,
                candidate_norm=norm_c,
                norm_match=abs(norm_b - norm_c) <= tol.norm_tolerance * max(norm_b, norm_c, 1e-12),
                noise_cosine=noise_cosine,
                explained_by_noise=explained,
                mismatch=below and not explained,
            )
        )
    return tuple(results)


def _norms(matrix: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    wide = matrix.astype(np.float64)
    squares: npt.NDArray[np.float64] = np.einsum("ij,ij->i", wide, wide)
    return np.sqrt(squares)


def _cosines(
    a: npt.NDArray[np.float32],
    b: npt.NDArray[np.float32],
    norms_a: npt.NDArray[np.float64],
    norms_b: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    dots = np.einsum("ij,ij->i", a.astype(np.float64), b.astype(np.float64))
    denominator = norms_a * norms_b
    out = np.full(dots.shape, np.nan)
    np.divide(dots, denominator, out=out, where=denominator > 0)
    return np.clip(out, -1.0, 1.0)


def _finite(value: np.float64) -> float | None:
    return float(value) if np.isfinite(value) else None
