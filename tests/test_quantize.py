"""Quantised embeddings against bytes worked out by hand from the definitions (Cohere's
and sentence-transformers' ``quantize_embeddings``: sign bits packed eight to a byte,
first component highest; ``binary`` = ``ubinary`` - 128; calibrated int8/uint8 as
``(x - min) / ((max - min) / 255)`` cast; symmetric as ``round(127 x)``)."""

from __future__ import annotations

import base64
import struct

import numpy as np
import pytest

from extproc.core.quantize import Scaling, ScalingRule, UnquantisableError, quantise

# Nine components: the ninth spills into a second byte, padded with zero bits.
ROW = [0.5, -0.2, 0.0, 0.3, -0.1, 0.9, 0.01, -0.7, 0.2]
MATRIX = np.asarray([ROW, [-x for x in ROW]], dtype=np.float32)


def test_ubinary_packs_the_sign_bits_first_component_highest() -> None:
    # Row 1: 1 0 0 1 0 1 1 0 | 1 -> 0b10010110 = 150, 0b10000000 = 128.
    # Row 2: 0 1 0 0 1 0 0 1 | 0 (zero is not above zero) -> 0b01001001 = 73, 0.
    assert quantise(MATRIX, "ubinary", None) == [[150, 128], [73, 0]]


def test_binary_is_ubinary_less_128() -> None:
    assert quantise(MATRIX, "binary", None) == [[22, 0], [-55, -128]]


def test_symmetric_int8_and_uint8() -> None:
    symmetric = Scaling(ScalingRule.SYMMETRIC)
    # round(127 x): 63.5 rounds to even (64), -25.4 -> -25, 38.1 -> 38, 114.3 -> 114 ...
    assert quantise(MATRIX[:1], "int8", symmetric) == [[64, -25, 0, 38, -13, 114, 1, -89, 25]]
    # round(127.5 (x + 1)): 191.25 -> 191, 102 -> 102, 127.5 -> 128 (to even) ...
    assert quantise(MATRIX[:1], "uint8", symmetric) == [
        [191, 102, 128, 166, 115, 242, 129, 38, 153]
    ]


def test_symmetric_clips_what_lies_beyond_one() -> None:
    wide = np.asarray([[1.5, -2.0]], dtype=np.float32)
    assert quantise(wide, "int8", Scaling(ScalingRule.SYMMETRIC)) == [[127, -127]]


def test_calibrated_splits_each_range_into_255_steps() -> None:
    # Ranges whose steps are exact in float32: 1/128 and 1/256.
    ranges = Scaling(
        ScalingRule.CALIBRATED, minimum=(0.0, -1.0), maximum=(255 / 128, -1 + 255 / 256)
    )
    rows = np.asarray([[0.5, -0.5], [255 / 128, -1.0], [0.25, -0.75]], dtype=np.float32)
    # (x - min) / step: 64, 128; 255, 0; 32, 64. int8 is that less 128.
    assert quantise(rows, "uint8", ranges) == [[64, 128], [255, 0], [32, 64]]
    assert quantise(rows, "int8", ranges) == [[-64, 0], [127, -128], [-96, -64]]


def test_calibrated_levels_are_cut_toward_zero_in_float32() -> None:
    # As quantize_embeddings' astype: a step of 2/255 puts the top of [-1, 1] at
    # 254.99998 in float32, level 254, and 0 at 127.49999, level 127.
    ranges = Scaling(ScalingRule.CALIBRATED, minimum=(-1.0,), maximum=(1.0,))
    rows = np.asarray([[1.0], [0.0]], dtype=np.float32)
    assert quantise(rows, "uint8", ranges) == [[254], [127]]


def test_base64_is_the_little_endian_float32_bytes() -> None:
    (written,) = quantise(MATRIX[:1], "base64", None)
    assert base64.b64decode(written) == struct.pack("<9f", *ROW)


def test_int8_without_a_rule_and_calibration_of_another_width_are_refused() -> None:
    with pytest.raises(UnquantisableError, match="no rule for int8"):
        quantise(MATRIX, "int8", None)
    narrow = Scaling(ScalingRule.CALIBRATED, minimum=(0.0,), maximum=(1.0,))
    with pytest.raises(UnquantisableError, match="1 components, the vectors 9"):
        quantise(MATRIX, "uint8", narrow)
