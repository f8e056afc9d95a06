"""How a body Envoy decoded is checked and described to the client
(extproc/core/request_coding.py), and what rewrite_request does with it."""

from __future__ import annotations

import gzip
import time

import pytest

from extproc.core.api_errors import ApiError
from extproc.core.contract import Contract
from extproc.core.request_coding import MAX_INFLATE_RATIO, BodyCoding
from extproc.core.request_rewrite import rewrite_request

LIMIT = 8 << 20


def gzip_coding(data: bytes, *, sent: bytes | None = None) -> BodyCoding:
    """How request_coding describes ``sent`` (default: ``data`` gzip-compressed)."""
    packed = gzip.compress(data) if sent is None else sent
    return BodyCoding("gzip", len(packed), packed[-8:])


@pytest.mark.parametrize(
    "fields,expected",
    [
        (
            {"content_encoding": "gzip", "sent_bytes": "120", "gzip_trailer": "0102030405060708"},
            BodyCoding("gzip", 120, bytes(range(1, 9))),
        ),
        ({"content_encoding": " BR ", "sent_bytes": "7"}, BodyCoding("br", 7)),
        ({"content_encoding": "gzip"}, BodyCoding("gzip")),
        ({"content_encoding": "gzip", "sent_bytes": "12x"}, BodyCoding("gzip")),
        ({"content_encoding": "gzip", "sent_bytes": "9" * 40}, BodyCoding("gzip")),
        ({"content_encoding": "gzip", "sent_bytes": "²"}, BodyCoding("gzip")),
        ({"content_encoding": "gzip", "gzip_trailer": "0102"}, BodyCoding("gzip")),
        ({"content_encoding": "gzip", "gzip_trailer": "zz" * 8}, BodyCoding("gzip")),
        # Only gzip has a trailer.
        ({"content_encoding": "br", "gzip_trailer": "01" * 8}, BodyCoding("br")),
        # Codings Envoy does not decode never reached a decoder.
        ({"content_encoding": "deflate", "sent_bytes": "12"}, None),
        ({"content_encoding": "identity"}, None),
        ({}, None),
    ],
)
def test_from_metadata(fields: dict[str, str], expected: BodyCoding | None) -> None:
    assert BodyCoding.from_metadata(fields) == expected


def test_a_body_cut_off_by_the_decoder_is_a_413_before_the_size_limit() -> None:
    coding = BodyCoding("br", 1000)
    coding.check(b" " * MAX_INFLATE_RATIO["br"] * 1000, limit=10**9)  # at the bound: fine
    with pytest.raises(ApiError) as caught:
        coding.check(b" " * (MAX_INFLATE_RATIO["br"] * 1000 + 1), limit=10**9)
    assert caught.value.status == 413 and "expands more than 100-fold" in caught.value.message


def test_a_decoded_body_over_the_limit_is_a_413_naming_both_sizes() -> None:
    with pytest.raises(ApiError) as caught:
        BodyCoding("br", 100_000).check(b" " * 9_000_000, limit=LIMIT)
    error = caught.value
    assert (error.status, error.code) == (413, "request_too_large")
    assert error.message == (
        "Request body is 9000000 bytes once decoded (sent with Content-Encoding: br, "
        "100000 bytes); the limit is 8388608."
    )


def test_without_the_size_as_sent_only_the_limit_applies() -> None:
    BodyCoding("gzip").check(b" " * 8_000_000, limit=LIMIT)


def test_gzip_body_is_checked_against_its_trailer() -> None:
    data = b'{"model": "m", "input": "x"}'
    gzip_coding(data).check(data, LIMIT)
    for decoded in (data[:-1], data + b" ", data.replace(b"x", b"y"), b""):
        with pytest.raises(ApiError) as caught:
            gzip_coding(data).check(decoded, LIMIT)
        error = caught.value
        assert (error.status, error.code) == (400, "invalid_compressed_body")
        assert "do not match the CRC-32 and length at the end of the gzip data" in error.message


def test_a_second_member_is_a_mismatch() -> None:
    """Envoy decodes the first member only: the trailer is the last member's."""
    first, second = b'{"model": "m", "input": "x"}', b' {"input": "y"}'
    coding = gzip_coding(first, sent=gzip.compress(first) + gzip.compress(second))
    with pytest.raises(ApiError, match="more than one gzip member"):
        coding.check(first, LIMIT)


def test_rewrite_request_names_the_coding_only_when_told(qwen_contract: Contract) -> None:
    args = (qwen_contract.policy, qwen_contract.tokenizers)
    with pytest.raises(ApiError) as plain:
        rewrite_request(b"{", *args, clock=time.monotonic)
    assert plain.value.code == "invalid_json" and "Content-Encoding" not in plain.value.message
    # br: nothing to check the decoded bytes against.
    with pytest.raises(ApiError) as coded:
        rewrite_request(b"{", *args, coding=BodyCoding("br", 30), clock=time.monotonic)
    assert coded.value.code == "invalid_compressed_body"
    assert "(sent with Content-Encoding: br, 30 bytes) decoded to 1 byte, not valid JSON" in (
        coded.value.message
    )
    # gzip, checked against its trailer: then it is the JSON that is wrong.
    with pytest.raises(ApiError) as checked:
        rewrite_request(b"{", *args, coding=gzip_coding(b"{"), clock=time.monotonic)
    assert checked.value.code == "invalid_json"
    assert "Content-Encoding: gzip" in checked.value.message
    with pytest.raises(ApiError) as empty:
        rewrite_request(b"", *args, coding=gzip_coding(b""), clock=time.monotonic)
    assert empty.value.code == "invalid_json" and "holds nothing once decoded" in (
        empty.value.message
    )
    # A body that decodes to JSON is validated as any other.
    body = b'{"model": 5, "input": "x"}'
    with pytest.raises(ApiError) as field:
        rewrite_request(body, *args, coding=gzip_coding(body), clock=time.monotonic)
    assert field.value.param == "model"
