"""Vector math on the response path: decode, check, cut + re-normalise, encode.

Embeddings travel as little-endian float32 (OpenAI's base64 format, which numpy
reads without copying); Matryoshka emulation is "keep the first d components and
L2-normalise", in float32, as vLLM does for models trained that way.
"""

from __future__ import annotations

import binascii

import numpy as np
import numpy.typing as npt
import pybase64

FloatMatrix = npt.NDArray[np.float32]
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_LITTLE_ENDIAN_F32 = np.dtype("<f4")


class BadVectorsError(ValueError):
    """The upstream's vectors are unusable (wrong size, not finite, not decodable)."""


def decode_rows(items: list[object], native: int) -> FloatMatrix:
    """Embeddings given as base64 strings or float arrays -> (n, native) float32."""
    out = np.empty((len(items), native), dtype=np.float32)
    for row, item in enumerate(items):
        if isinstance(item, str):
            try:
                raw = pybase64.b64decode(item, validate=True)
            except (binascii.Error, ValueError, TypeError):
                raise BadVectorsError(f"embedding {row} is not valid base64") from None
            if len(raw) != native * 4:
                raise BadVectorsError(
                    f"embedding {row} has {len(raw) // 4} values, expected {native}"
                )
            out[row] = np.frombuffer(raw, dtype=_LITTLE_ENDIAN_F32)
        elif isinstance(item, list):
            if len(item) != native:
                raise BadVectorsError(f"embedding {row} has {len(item)} values, expected {native}")
            # JSON numbers only: numpy would turn "0.5" and true into floats. Floats from
            # the upstream are rare (the gateway asks for base64), so this loop is off
            # the usual path.
            if not all(type(v) is float or type(v) is int for v in item):
                if any(v is None for v in item):  # serde_json (Dynamo) writes NaN as null
                    raise BadVectorsError(f"embedding {row} holds null (NaN) values")
                raise BadVectorsError(f"embedding {row} holds values that are not numbers")
            try:
                values = np.asarray(item, dtype=np.float64)
            except (TypeError, ValueError):
                values = np.empty(0)
            if values.shape != (native,):
                raise BadVectorsError(f"embedding {row} is not a flat array of numbers")
            if not np.all(np.abs(values) <= _FLOAT32_MAX):  # also catches NaN
                raise BadVectorsError(f"embedding {row} holds NaN, infinite or non-float32 values")
            out[row] = values
        else:
            raise BadVectorsError(f"embedding {row} is neither a float array nor base64")
    if not np.isfinite(out).all():
        raise BadVectorsError("the upstream returned NaN or infinite values")
    return out


def truncate(matrix: FloatMatrix, dimensions: int) -> FloatMatrix:
    """First ``dimensions`` components of each row, as they are (a legacy server that
    cut without re-normalising)."""
    return np.array(matrix[:, :dimensions], dtype=np.float32, copy=True)


def truncate_renormalise(matrix: FloatMatrix, dimensions: int) -> FloatMatrix:
    """First ``dimensions`` components of each row, scaled to unit L2 norm."""
    head = np.array(matrix[:, :dimensions], dtype=np.float32, copy=True)  # never the caller's
    # Norms in float64: float32 squares overflow past ~1e19 and underflow below ~1e-23,
    # which would give all-zero rows or leave rows un-normalised.
    norms = np.sqrt(np.einsum("ij,ij->i", head, head, dtype=np.float64))[:, None]
    if head.size and norms.min() > 1e-30 and norms.max() < 1e30:
        # The usual case: every norm is a normal float32, and dividing in float32 is
        # cheaper than in float64 (two reductions instead of five array passes).
        head /= norms.astype(np.float32)
        return head
    if np.all((norms == 0) | ((norms > 1e-30) & (norms < 1e30))):
        # Some all-zero rows (they stay zero), the others as above.
        norms32 = norms.astype(np.float32)
        np.divide(head, norms32, out=head, where=norms32 > 0)
        return head
    out = np.zeros(head.shape, dtype=np.float64)
    np.divide(head, norms, out=out, where=norms > 0)
    return out.astype(np.float32)


def encode_base64(row: FloatMatrix) -> str:
    return pybase64.b64encode(row.astype("<f4", copy=False).tobytes()).decode("ascii")
