"""How a body Envoy decoded is described to the client (extproc/core/request_coding.py),
and the size checks rewrite_request applies to it."""

from __future__ import annotations

import pytest

from extproc.core.contract import Contract
from extproc.core.errors import ApiError
from extproc.core.request_coding import MAX_INFLATE_RATIO, BodyCoding
from extproc.core.request_rewrite import rewrite_request


@pytest.mark.parametrize(
    "fields,expected",
    [
        ({"content_encoding": "gzip", "sent_bytes": "120"}, BodyCoding("gzip", 120)),
        ({"content_encoding": " BR ", "sent_bytes": "7"}, BodyCoding("br", 7)),
        ({"content_encoding": "gzip"}, BodyCoding("gzip", None)),
        ({"content_encoding": "gzip", "sent_bytes": "12x"}, BodyCoding("gzip", None)),
        ({"content_encoding": "gzip", "sent_bytes": "9" * 40}, BodyCoding("gzip", None)),
        ({"content_encoding": "gzip", "sent_bytes": "²"}, BodyCoding("gzip", None)),
        # Codings Envoy does not decode never reached a decoder.
        ({"content_encoding": "deflate", "sent_bytes": "12"}, None),
        ({"content_encoding": "identity"}, None),
        ({}, None),
    ],
)
def test_from_metadata(fields: dict[str, str], expected: BodyCoding | None) -> None:
    assert BodyCoding.from_metadata(fields) == expected


def test_a_body_cut_off_by_the_decoder_is_a_413_before_the_size_limit() -> None:
    coding = BodyCoding("gzip", 1000)
    coding.check_size(MAX_INFLATE_RATIO["gzip"] * 1000, limit=10**9)  # at the bound: fine
    with pytest.raises(ApiError) as caught:
        coding.check_size(MAX_INFLATE_RATIO["gzip"] * 1000 + 1, limit=10**9)
    assert caught.value.status == 413 and "expands more than 50-fold" in caught.value.message


def test_a_decoded_body_over_the_limit_is_a_413_naming_both_sizes() -> None:
    with pytest.raises(ApiError) as caught:
        BodyCoding("br", 100_000).check_size(9_000_000, limit=8_388_608)
    error = caught.value
    assert (error.status, error.code) == (413, "request_too_large")
    assert error.message == (
        "Request body is 9000000 bytes once decoded (sent with Content-Encoding: br, "
        "100000 bytes); the limit is 8388608."
    )


def test_without_the_size_as_sent_only_the_limit_applies() -> None:
    BodyCoding("gzip").check_size(8_000_000, limit=8_388_608)


def test_rewrite_request_names_the_coding_only_when_told(qwen_contract: Contract) -> None:
    args = (qwen_contract.policy, qwen_contract.tokenizers)
    with pytest.raises(ApiError) as plain:
        rewrite_request(b"{", *args)
    with pytest.raises(ApiError) as coded:
        rewrite_request(b"{", *args, coding=BodyCoding("gzip", 30))
    assert plain.value.code == "invalid_json" and "Content-Encoding" not in plain.value.message
    assert coded.value.code == "invalid_compressed_body"
    assert (
        "(sent with Content-Encoding: gzip, 30 bytes) decoded to 1 byte, not valid JSON"
        in coded.value.message
    )
    # A body that decodes to JSON is validated as any other.
    with pytest.raises(ApiError) as field:
        rewrite_request(b'{"model": 5, "input": "x"}', *args, coding=BodyCoding("gzip", 30))
    assert field.value.param == "model"
