"""Quantised embeddings, computed from the float vectors (pure).

- ``binary`` / ``ubinary``: one bit per component, 1 where it is above 0, packed eight
  to a byte with the first component in the highest bit; ``ubinary`` is those bytes
  as unsigned integers, ``binary`` the same bytes minus 128 (as Cohere and
  sentence-transformers' ``quantize_embeddings`` define them). A width that is not a
  multiple of 8 is padded with zero bits.
- ``int8`` / ``uint8``, by the rule the policy names (:class:`Scaling`):
  ``CALIBRATED`` is ``quantize_embeddings``' own: each component's calibration range
  (its minimum and maximum over a sample) split into 255 steps, ``(x - min) / step``
  in float32, cast to ``uint8``, or less 128 cast to ``int8``; ``SYMMETRIC`` maps
  -1..1 onto the levels: ``round(x * 127)`` for ``int8``, ``round((x + 1) * 127.5)``
  for ``uint8``, values beyond clipped.
- ``float`` is the vector; ``base64`` its little-endian float32 bytes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from extproc.core.vectors import FloatMatrix, encode_base64

TYPES: Final = ("float", "int8", "uint8", "binary", "ubinary", "base64")


class ScalingRule(enum.Enum):
    SYMMETRIC = "symmetric"
    CALIBRATED = "calibrated"


@dataclass(frozen=True)
class Scaling:
    """How ``int8`` and ``uint8`` are made; for CALIBRATED, each component's minimum
    and maximum over the calibration sample."""

    rule: ScalingRule
    minimum: tuple[float, ...] = ()
    maximum: tuple[float, ...] = ()


class UnquantisableError(ValueError):
    """A type this model has no rule for, or a calibration of another width."""


def quantise(matrix: FloatMatrix, kind: str, scaling: Scaling | None) -> list[Any]:
    """Each row of ``matrix`` as ``kind`` (one of :data:`TYPES`): numbers, or a base64
    string."""
    if kind == "float":
        return list(matrix)
    if kind == "base64":
        return [encode_base64(row) for row in matrix]
    if kind in ("binary", "ubinary"):
        packed = np.packbits(matrix > 0, axis=1)
        rows = packed.astype(np.int16) - 128 if kind == "binary" else packed
        return rows.tolist()  # type: ignore[no-any-return]
    if kind not in ("int8", "uint8"):
        raise UnquantisableError(f"unknown embedding type {kind!r}")
    if scaling is None:
        raise UnquantisableError(f"no rule for {kind} embeddings")
    if scaling.rule is ScalingRule.SYMMETRIC:
        clipped = np.clip(matrix.astype(np.float64), -1.0, 1.0)
        if kind == "int8":
            return np.rint(clipped * 127.0).astype(np.int8).tolist()  # type: ignore[no-any-return]
        return np.rint((clipped + 1.0) * 127.5).astype(np.uint8).tolist()  # type: ignore[no-any-return]
    starts = np.asarray(scaling.minimum, dtype=np.float32)
    ends = np.asarray(scaling.maximum, dtype=np.float32)
    if starts.shape != (matrix.shape[1],) or ends.shape != starts.shape:
        raise UnquantisableError(
            f"the calibration ranges have {starts.shape[0]} components, the vectors "
            f"{matrix.shape[1]}"
        )
    steps = (ends - starts) / np.float32(255)
    levels = (matrix.astype(np.float32) - starts) / steps
    if kind == "uint8":
        return levels.astype(np.uint8).tolist()  # type: ignore[no-any-return]
    return (levels - np.float32(128)).astype(np.int8).tolist()  # type: ignore[no-any-return]
