"""Two servers' answers to the same request, compared (pure).

An :class:`Answer` is one server's status and, for a 2xx, what the core's
embeddings-body parser read from its body: the vectors as a float32 matrix in
``index`` order, the encoding and ``usage.prompt_tokens``. A 2xx body the parser
rejects is kept as a *problem* (its reason), never as vectors.

:func:`compare_answers` gives the status classes, whether both 2xx answers carry
the same number of vectors, ``usage.prompt_tokens`` candidate minus baseline and,
when the counts agree, per input: the cosine (float64; none when the sizes differ
or a vector is zero), both sizes, both L2 norms and whether the norms agree within
a relative tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from extproc.core.embeddings_body import parse_embeddings_body
from extproc.core.status import is_success, status_class
from extproc.core.tasks.embed import EmbeddingsDialect
from extproc.core.vectors import BadVectorsError, FloatMatrix

Floats = npt.NDArray[np.float64]
AnyFloats = npt.NDArray[np.floating[Any]]


@dataclass(frozen=True)
class Tolerances:
    min_cosine: float = 0.999  # an input below this is a mismatch
    norm_tolerance: float = 1e-3  # relative difference of L2 norms still called equal


@dataclass(frozen=True)
class Answer:
    status: int  # <= 0: no answer (connection failure, timeout)
    vectors: FloatMatrix | None = None  # (rows, dims); None unless a usable 2xx body
    prompt_tokens: int | None = None
    encoding: str | None = None  # "float", "base64" or "mixed"
    problem: str = ""  # why a 2xx body is unusable

    @classmethod
    def read(cls, status: int, body: bytes, dialect: EmbeddingsDialect | None = None) -> Answer:
        """``body`` as OpenAI's clients read it, or ``dialect``'s (TEI's rows, Cohere's
        object, ...)."""
        if not is_success(status):
            return cls(status)
        if dialect is not None and dialect.own_shape:
            read = dialect.read_answer(body)
            if read is None:
                return cls(status, problem=f"not a {dialect.name} answer")
            return cls(status, read.vectors, read.prompt_tokens, "float")
        try:
            parsed = parse_embeddings_body(body)
        except BadVectorsError as exc:
            return cls(status, problem=str(exc) or "not an embeddings list")
        return cls(status, parsed.vectors, parsed.prompt_tokens, parsed.encoding)

    @property
    def status_class(self) -> str:
        return status_class(self.status)

    @property
    def count(self) -> int | None:
        return None if self.vectors is None else int(self.vectors.shape[0])

    @property
    def dims(self) -> int | None:
        return None if self.vectors is None else int(self.vectors.shape[1])


@dataclass(frozen=True)
class InputComparison:
    index: int
    cosine: float | None  # None: sizes differ, or a zero vector
    baseline_dims: int
    candidate_dims: int
    baseline_norm: float
    candidate_norm: float
    norm_match: bool

    @property
    def dims_match(self) -> bool:
        return self.baseline_dims == self.candidate_dims


@dataclass(frozen=True)
class Comparison:
    baseline_class: str
    candidate_class: str
    count_mismatch: bool  # both usable 2xx answers, different numbers of vectors
    inputs: tuple[InputComparison, ...]  # both usable with the same count; else ()
    token_diff: int | None  # candidate - baseline usage.prompt_tokens

    @property
    def same_class(self) -> bool:
        return self.baseline_class == self.candidate_class

    @property
    def cosines(self) -> tuple[float, ...]:
        """Every input's cosine, or () when any input could not be compared."""
        values = tuple(item.cosine for item in self.inputs if item.cosine is not None)
        return values if len(values) == len(self.inputs) else ()


def compare_answers(
    baseline: Answer, candidate: Answer, tolerances: Tolerances = Tolerances()
) -> Comparison:
    inputs: tuple[InputComparison, ...] = ()
    count_mismatch = False
    if baseline.vectors is not None and candidate.vectors is not None:
        count_mismatch = baseline.count != candidate.count
        if not count_mismatch:
            inputs = compare_inputs(baseline.vectors, candidate.vectors, tolerances)
    b_tokens, c_tokens = baseline.prompt_tokens, candidate.prompt_tokens
    return Comparison(
        baseline_class=baseline.status_class,
        candidate_class=candidate.status_class,
        count_mismatch=count_mismatch,
        inputs=inputs,
        token_diff=None if b_tokens is None or c_tokens is None else c_tokens - b_tokens,
    )


def compare_inputs(
    baseline: FloatMatrix, candidate: FloatMatrix, tolerances: Tolerances = Tolerances()
) -> tuple[InputComparison, ...]:
    """Row by row; both matrices have the same number of rows."""
    norms_b, norms_c = row_norms(baseline), row_norms(candidate)
    same_dims = baseline.shape[1] == candidate.shape[1]
    values = row_cosines(baseline, candidate) if same_dims else None
    results = []
    for row in range(baseline.shape[0]):
        norm_b, norm_c = float(norms_b[row]), float(norms_c[row])
        value = float(values[row]) if values is not None else float("nan")
        results.append(
            InputComparison(
                index=row,
                cosine=value if np.isfinite(value) else None,
                baseline_dims=int(baseline.shape[1]),
                candidate_dims=int(candidate.shape[1]),
                baseline_norm=norm_b,
                candidate_norm=norm_c,
                norm_match=abs(norm_b - norm_c)
                <= tolerances.norm_tolerance * max(norm_b, norm_c, 1e-12),
            )
        )
    return tuple(results)


def row_norms(matrix: AnyFloats) -> Floats:
    wide = matrix.astype(np.float64)
    squares: Floats = np.einsum("ij,ij->i", wide, wide)
    return np.sqrt(squares)


def row_cosines(a: AnyFloats, b: AnyFloats) -> Floats:
    """Cosine per row pair in float64, clipped to [-1, 1]; NaN where a row is zero."""
    dots = np.einsum("ij,ij->i", a.astype(np.float64), b.astype(np.float64))
    denominator = row_norms(a) * row_norms(b)
    out = np.full(dots.shape, np.nan)
    np.divide(dots, denominator, out=out, where=denominator > 0)
    clipped: Floats = np.clip(out, -1.0, 1.0)
    return clipped


def cosine(a: AnyFloats, b: AnyFloats) -> float:
    """The cosine of two vectors; ValueError when their sizes differ or one has no
    direction (zero or not finite)."""
    if a.shape != b.shape:
        raise ValueError(f"cannot compare vectors of shapes {a.shape} and {b.shape}")
    value = float(row_cosines(a.reshape(1, -1), b.reshape(1, -1))[0])
    if not np.isfinite(value) or not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("cosine of a zero or non-finite vector")
    return value
