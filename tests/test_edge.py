"""The edges of the HTTP surface, through a real Envoy and the real ext_proc server
(`extproc run`) in front of testing_support/fake_upstream.py, for each gateway shape
(envoy/standalone.yaml and envoy/single-filter.yaml):

- every spelling of the embeddings endpoint goes through the contract or gets a
  404 envelope; none reaches the upstream (or, with --legacy, the legacy server) raw;
- gzip and br request bodies are decoded by Envoy (standalone.yaml: answered as the
  plain body would be; one that does not decode to JSON is a 400 naming its coding,
  a decompression bomb a 413, with keep-alive; HTTP/2 too) or refused with a 415
  from the request headers (single-filter.yaml); every other coding is a 415; none
  is read as text nor forwarded mislabelled. The upstream is asked for identity;
  clients that accept gzip or br get compressed answers (standalone.yaml);
- HTTP/1.0 is answered; Envoy's own refusals (431, no Host, a path it cannot
  normalise) carry a non-empty envelope;
- an HTTP/2 request body followed by trailers goes through the contract like any
  other (ext_proc hands it over as not the end of the stream; it is the whole body).

413 and 408 envelopes are asserted by tests/test_hostile_input.py, 502/503/504 by
tests/test_faults_upstream.py.
"""

from __future__ import annotations

import gzip
import re
import shutil
import socket
import struct
import time
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import brotli
import numpy as np
import orjson
import pytest

from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import Gateway, GatewaySpec
from testing_support.processes import Process, free_port, port_open
from testing_support.qwen import QWEN_MODEL
from tests.harness import Gateways
from tests.test_hostile_input import WireReply, exchange

SHAPES = ("standalone", "single-filter")
QUERY = {"model": QWEN_MODEL, "input": "What is the capital city of France?", "input_type": "query"}
INSTRUCTION = b"Instruct: "


def post(
    path: str,
    body: bytes,
    *,
    headers: tuple[tuple[str, str], ...] = (),
    version: str = "HTTP/1.1",
    host: str | None = "gw",
) -> bytes:
    lines = [f"POST {path} {version}", *([f"Host: {host}"] if host is not None else [])]
    lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def envelope(reply: WireReply, status: int) -> dict[str, Any]:
    assert reply.status == status, reply
    error = reply.envelope()  # complete, JSON, the four keys, a non-empty message
    return error


# -- fixtures -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def legacy(fake_vllm: FakeUpstream) -> FakeUpstream:
    """Standing for the legacy server of a split migration, the session's vLLM fake:
    it records what reaches it, as the embeddings upstream (the Dynamo fake) does."""
    return fake_vllm


@pytest.fixture(autouse=True)
def clean(upstream: FakeUpstream, legacy: FakeUpstream) -> None:
    upstream.reset()
    legacy.reset()


@pytest.fixture(scope="module", params=SHAPES)
def shape(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def gateway(
    shape: str, upstream: FakeUpstream, legacy: FakeUpstream, gateways: Gateways
) -> Gateway:
    # With --legacy, every path but the embeddings endpoint goes to `legacy`: a
    # spelling of the endpoint that slipped past the embeddings routes would show there.
    return gateways.shared(GatewaySpec(upstream.url, shape=shape, legacy=legacy.url))


def ask(gateway: Gateway, wire: bytes) -> WireReply:
    return exchange(gateway.port, wire, timeout=60.0)


# -- every spelling ----------------------------------------------------------------------

THROUGH_THE_CONTRACT = ["/v1/embeddings", "/embeddings", "/v1/embeddings?x=1", "/embeddings?a=b&c"]
NOT_AN_ENDPOINT = [
    "/V1/embeddings",
    "/v1/Embeddings",
    "/V1/EMBEDDINGS",
    "/Embeddings",
    "/v1/embeddings;x=1",
    "/embeddings;x=1",
    "/v1/embeddings%3Bx=1",
    "/v1/embeddings.json",
    "/v1/embeddings%2",
    "/embeddings/",
    "/embeddings/x",
    "/v1/embeddings/",
]


@pytest.mark.parametrize("path", THROUGH_THE_CONTRACT)
def test_spelling_through_the_contract(
    path: str, gateway: Gateway, upstream: FakeUpstream, legacy: FakeUpstream
) -> None:
    reply = ask(gateway, post(path, orjson.dumps(QUERY)))
    assert reply.status == 200, reply
    assert len(orjson.loads(reply.body)["data"]) == 1
    (received,) = upstream.received
    assert INSTRUCTION in received.body  # the contract ran: the query got its instruction
    assert "input_type" not in received.json
    # The upstream gets the canonical path, without the query string (the endpoint
    # takes none).
    assert received.path == "/v1/embeddings"
    assert legacy.received == []


@pytest.mark.parametrize("path", THROUGH_THE_CONTRACT)
def test_spelling_validates_the_body(
    path: str, gateway: Gateway, upstream: FakeUpstream, legacy: FakeUpstream
) -> None:
    error = envelope(ask(gateway, post(path, b'{"model": 5, "input": "x"}')), 400)
    assert error["param"] == "model"
    assert upstream.received == [] and legacy.received == []


@pytest.mark.parametrize("path", NOT_AN_ENDPOINT)
def test_other_spelling_is_a_404_envelope(
    path: str, gateway: Gateway, upstream: FakeUpstream, legacy: FakeUpstream
) -> None:
    error = envelope(ask(gateway, post(path, orjson.dumps(QUERY))), 404)
    assert error["code"] == "unknown_url"
    assert upstream.received == [] and legacy.received == []


def test_alias_wrong_method_is_a_405(gateway: Gateway, upstream: FakeUpstream) -> None:
    reply = ask(gateway, b"GET /embeddings HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
    assert envelope(reply, 405)["code"] == "method_not_allowed"
    assert upstream.received == []


def test_upstream_error_on_the_alias_is_enveloped(gateway: Gateway, upstream: FakeUpstream) -> None:
    upstream.fault = "http500"
    reply = ask(gateway, post("/embeddings", orjson.dumps(QUERY)))
    assert reply.status is not None and reply.status >= 500, reply
    assert reply.envelope()["type"] == "server_error"
    assert len(upstream.received) == 1


def test_other_paths_still_reach_the_legacy_server(
    gateway: Gateway, upstream: FakeUpstream, legacy: FakeUpstream
) -> None:
    reply = ask(gateway, b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
    assert reply.status == 200, reply
    assert [r.path for r in legacy.received] == ["/v1/models"] and upstream.received == []


def ext_proc_messages_sent(gateway: Gateway) -> int:
    """Envoy's own count of the ext_proc messages it has sent (admin /stats)."""
    admin = re.search(r"admin 127\.0\.0\.1:(\d+)", gateway.ready_line)
    assert admin is not None, gateway.ready_line
    url = f"http://127.0.0.1:{admin[1]}/stats?filter=ext_proc.stream_msgs_sent"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return sum(int(n) for n in re.findall(r"stream_msgs_sent: (\d+)", text))


# Per shape: (status, ext_proc messages). standalone.yaml skips the request headers and
# answers other spellings with routes (docs/envoy-facts.md); the one-filter shape never
# skips them, and what the server answers from them costs that one message.
STANDALONE_AND_ONE_FILTER = ("standalone", "single-filter")


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        # standalone: the request body; one-filter: headers, body, response headers
        (
            post("/v1/embeddings", orjson.dumps(QUERY)),
            {"standalone": (200, 1), "single-filter": (200, 3)},
        ),
        (
            post("/embeddings?x=1", orjson.dumps(QUERY)),
            {"standalone": (200, 1), "single-filter": (200, 3)},
        ),
        # the vectors change: the response body too, on the same stream
        (
            post("/v1/embeddings", orjson.dumps({**QUERY, "dimensions": 256})),
            {"standalone": (200, 2), "single-filter": (200, 4)},
        ),
        (
            post("/v1/embeddings", b'{"model": 5, "input": "x"}'),
            {"standalone": (400, 1), "single-filter": (400, 2)},
        ),
        (
            post("/V1/Embeddings", orjson.dumps(QUERY)),
            {"standalone": (404, 0), "single-filter": (404, 1)},
        ),
        # a plain body labelled gzip: standalone decodes it (to nothing: 400), the
        # one-filter shape refuses the coding from the headers
        (
            post("/v1/embeddings", orjson.dumps(QUERY), headers=(("Content-Encoding", "gzip"),)),
            {"standalone": (400, 1), "single-filter": (415, 1)},
        ),
    ],
    ids=["plain", "alias-query", "dimensions", "bad-body", "other-spelling", "gzip"],
)
def test_messages_per_request(
    wire: bytes, expected: dict[str, tuple[int, int]], shape: str, gateway: Gateway
) -> None:
    """Each shape's cost, from Envoy's own count of the messages it sent."""
    assert set(expected) == set(STANDALONE_AND_ONE_FILTER)
    status, messages = expected[shape]
    before = ext_proc_messages_sent(gateway)
    assert ask(gateway, wire).status == status
    assert ext_proc_messages_sent(gateway) - before == messages


# -- compressed request bodies -------------------------------------------------------
# standalone.yaml decodes gzip and br request bodies (Envoy's decompressor filters, on
# the embeddings routes, after `request_coding` has read the body whole); the one-filter
# shape cannot carry a decoder and refuses them from the request headers (415).

BODY = orjson.dumps(QUERY)
DECODED = "standalone"  # the shape that decodes
INVALID = "invalid_compressed_body"


def _encode(coding: str, body: bytes) -> bytes:
    return brotli.compress(body) if coding.strip().lower() == "br" else gzip.compress(body)


def _coded(body: bytes, coding: str, *, sent: bytes | None = None) -> bytes:
    return post(
        "/v1/embeddings",
        _encode(coding, body) if sent is None else sent,
        headers=(("Content-Encoding", coding),),
    )


def _refused_by_the_one_filter_shape(reply: WireReply, upstream: FakeUpstream) -> None:
    assert envelope(reply, 415)["code"] == "unsupported_content_encoding"
    assert upstream.received == []


@pytest.mark.parametrize(
    ("body", "messages"),
    [(orjson.dumps(QUERY), 1), (orjson.dumps({**QUERY, "dimensions": 256}), 2)],
    ids=["plain", "dimensions"],
)
def test_decoding_adds_no_ext_proc_message(
    body: bytes, messages: int, shape: str, gateway: Gateway
) -> None:
    """standalone.yaml: a request costs the same ext_proc messages (Envoy's own count)
    sent plain, gzip or br: the body message, and the response body when the vectors
    change (one stream). The one-filter shape answers a compressed body from its
    request headers: one message, a 415."""
    for coding in ("identity", "gzip", "br"):
        wire = post("/v1/embeddings", body) if coding == "identity" else _coded(body, coding)
        before = ext_proc_messages_sent(gateway)
        reply = ask(gateway, wire)
        sent = ext_proc_messages_sent(gateway) - before
        if shape == DECODED or coding == "identity":
            assert reply.status == 200, (coding, reply)
            assert sent == messages + (0 if shape == DECODED else 2), coding
        else:
            assert envelope(reply, 415)["code"] == "unsupported_content_encoding"
            assert sent == 1, coding


@pytest.mark.parametrize("dimensions", [None, 256], ids=["query", "query-dimensions-256"])
@pytest.mark.parametrize("coding", ["gzip", "br", "GZIP", " br "])
def test_compressed_body_is_answered_as_the_plain_one(
    coding: str, dimensions: int | None, shape: str, gateway: Gateway, upstream: FakeUpstream
) -> None:
    """The client's answer and what the upstream receives are those of the same body
    sent plain: the decoded JSON, rewritten (instruction; `dimensions` emulated), with
    no content-encoding and its own content-length."""
    body = orjson.dumps({**QUERY, **({"dimensions": dimensions} if dimensions else {})})
    plain = ask(gateway, post("/v1/embeddings", body))
    assert plain.status == 200, plain
    (sent_plain,) = upstream.received
    upstream.reset()
    reply = ask(gateway, _coded(body, coding))
    if shape != DECODED:
        _refused_by_the_one_filter_shape(reply, upstream)
        return
    assert reply.status == 200, reply
    assert np.array_equal(_vectors(reply.body), _vectors(plain.body))
    assert _vectors(reply.body).shape == (1, dimensions or 1024)
    (received,) = upstream.received
    assert received.body == sent_plain.body and INSTRUCTION in received.body
    assert "content-encoding" not in received.headers
    assert "transfer-encoding" not in received.headers
    assert received.headers["content-length"] == str(len(received.body))


def test_decoded_body_that_needs_no_rewrite_goes_up_as_decoded(
    shape: str, gateway: Gateway, upstream: FakeUpstream
) -> None:
    """No rewrite: the upstream gets exactly the decoded bytes, with their length
    (the buffer filter sets it; the decoder removed the client's)."""
    body = orjson.dumps({"model": QWEN_MODEL, "input": ["a first document", "a second one"]})
    reply = ask(gateway, _coded(body, "gzip"))
    if shape != DECODED:
        _refused_by_the_one_filter_shape(reply, upstream)
        return
    assert reply.status == 200, reply
    (received,) = upstream.received
    assert received.body == body
    assert received.headers["content-length"] == str(len(body))
    assert "content-encoding" not in received.headers


def test_chunked_compressed_body_is_decoded(
    shape: str, gateway: Gateway, upstream: FakeUpstream
) -> None:
    """No Content-Length is needed: request_coding measures the body it holds."""
    packed = gzip.compress(BODY)
    wire = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(packed), packed)
    )
    reply = ask(gateway, wire)
    if shape != DECODED:
        _refused_by_the_one_filter_shape(reply, upstream)
        return
    assert reply.status == 200, reply
    (received,) = upstream.received
    assert INSTRUCTION in received.body
    assert received.headers["content-length"] == str(len(received.body))


@pytest.mark.parametrize(
    "coding",
    [
        "deflate",
        "zstd",
        "gzip, br",
        "br, gzip",
        "gzip, identity",
        "x-gzip",
        "compress",
        "snappy",
        "",
    ],
    ids=[
        "deflate",
        "zstd",
        "chain",
        "chain-reversed",
        "chain-identity",
        "x-gzip",
        "compress",
        "unknown",
        "empty",
    ],
)
def test_other_codings_are_refused_with_415(
    coding: str, gateway: Gateway, upstream: FakeUpstream
) -> None:
    """Decoded neither as text nor by a decoder, never forwarded mislabelled. A chain
    is refused: Envoy's decoder would undo the first coding listed, which HTTP says
    was applied first."""
    sent = zlib.compress(BODY) if coding == "deflate" else BODY
    reply = ask(gateway, _coded(BODY, coding, sent=sent))
    assert envelope(reply, 415)["code"] == "unsupported_content_encoding"
    assert upstream.received == []


@pytest.mark.parametrize(
    "second", ["br", "identity", "gzip"], ids=["then-br", "then-identity", "twice"]
)
def test_content_encoding_repeated_is_refused_with_415(
    second: str, gateway: Gateway, upstream: FakeUpstream
) -> None:
    """Two header lines are one list of codings (Envoy joins them): a chain."""
    headers = (("Content-Encoding", "gzip"), ("Content-Encoding", second))
    reply = ask(gateway, post("/v1/embeddings", gzip.compress(BODY), headers=headers))
    assert envelope(reply, 415)["code"] == "unsupported_content_encoding"
    assert upstream.received == []


def test_no_transform_does_not_keep_the_body_coded(
    shape: str, gateway: Gateway, upstream: FakeUpstream
) -> None:
    """Envoy's decoder would leave a body marked `Cache-Control: no-transform` as it
    is; the gateway's decodes it all the same (the upstream must get JSON)."""
    headers = (("Content-Encoding", "gzip"), ("Cache-Control", "no-transform"))
    reply = ask(gateway, post("/v1/embeddings", gzip.compress(BODY), headers=headers))
    if shape != DECODED:
        _refused_by_the_one_filter_shape(reply, upstream)
        return
    assert reply.status == 200, reply
    (received,) = upstream.received
    assert INSTRUCTION in received.body and "content-encoding" not in received.headers


def _truncated(coding: str) -> bytes:
    return gzip.compress(BODY)[:-12] if coding == "gzip" else brotli.compress(BODY)[:-3]


def _corrupt(coding: str) -> bytes:
    packed = bytearray(_encode(coding, BODY))
    packed[len(packed) // 2 : len(packed) // 2 + 8] = b"\xff" * 8
    return bytes(packed)


def _bad_crc(coding: str) -> bytes:
    packed = bytearray(gzip.compress(BODY))
    packed[-8:-4] = bytes(4)  # the CRC-32 only: the data decodes whole
    return bytes(packed)


MISMATCH = "do not match the CRC-32 and length at the end of the gzip data"


@pytest.mark.parametrize(
    "coding,make,code,says",
    [
        # gzip: the decoded bytes are checked against the stream's CRC-32 and length
        # (Envoy's decoder checks neither), so every broken stream is named as such.
        ("gzip", lambda coding: BODY, INVALID, (MISMATCH,)),  # a plain body labelled gzip
        ("gzip", _truncated, INVALID, (MISMATCH,)),
        ("gzip", _corrupt, INVALID, (MISMATCH,)),
        ("gzip", _bad_crc, INVALID, (MISMATCH,)),
        ("gzip", lambda coding: gzip.compress(BODY) + b"garbage", INVALID, (MISMATCH,)),
        (
            "gzip",
            lambda coding: gzip.compress(BODY[:40]) + gzip.compress(BODY[40:]),
            INVALID,
            (MISMATCH,),
        ),
        (
            "gzip",
            lambda coding: gzip.compress(BODY) + gzip.compress(b" {}"),
            INVALID,
            ("more than one gzip member",),
        ),
        # ... and what passes the check is the client's JSON, as compressed.
        (
            "gzip",
            lambda coding: gzip.compress(b""),
            "invalid_json",
            ("holds nothing once decoded",),
        ),
        (
            "gzip",
            lambda coding: gzip.compress(BODY[:40]),
            "invalid_json",
            ("is not valid JSON once decoded",),
        ),
        # br has no checksum: what it decoded to is all there is to say.
        ("br", lambda coding: BODY, INVALID, ("decoded to nothing",)),
        ("br", lambda coding: brotli.compress(b""), INVALID, ("decoded to nothing",)),
        ("br", _truncated, INVALID, ("not valid JSON",)),
        # Where the decoder gives up decides how much came out before.
        ("br", _corrupt, INVALID, ("not valid JSON", "decoded to nothing")),
        ("br", lambda coding: brotli.compress(BODY[:40]), INVALID, ("not valid JSON",)),
    ],
    ids=[
        "gzip-mislabelled",
        "gzip-truncated",
        "gzip-corrupt",
        "gzip-bad-crc",
        "gzip-trailing-bytes",
        "gzip-two-members",
        "gzip-second-member-after-json",
        "gzip-empty",
        "gzip-json-cut-before-compression",
        "br-mislabelled",
        "br-empty",
        "br-truncated",
        "br-corrupt",
        "br-json-cut-before-compression",
    ],
)
def test_body_that_does_not_decode_to_json_is_a_400_naming_the_coding(
    coding: str,
    make: Any,
    code: str,
    says: tuple[str, ...],
    *,
    shape: str,
    gateway: Gateway,
    upstream: FakeUpstream,
) -> None:
    """Envoy's decoders report no failure per request: a body that is not in the
    coding decodes to nothing, one cut short or corrupt to a cut-off body, and gzip's
    stops after its first member without checking it. The gateway says which (not
    "not valid JSON" when the compression is at fault), and forwards nothing."""
    sent = make(coding)
    reply = ask(gateway, _coded(BODY, coding, sent=sent))
    if shape != DECODED:
        _refused_by_the_one_filter_shape(reply, upstream)
        return
    error = envelope(reply, 400)
    assert error["code"] == code, error
    assert f"Content-Encoding: {coding}, {len(sent)} byte" in error["message"]
    assert any(text in error["message"] for text in says), error
    assert upstream.received == []


def test_decoded_body_is_validated_as_a_plain_one(
    shape: str, gateway: Gateway, upstream: FakeUpstream
) -> None:
    reply = ask(gateway, _coded(b'{"model": 5, "input": "x"}', "gzip"))
    if shape != DECODED:
        _refused_by_the_one_filter_shape(reply, upstream)
        return
    assert envelope(reply, 400)["param"] == "model"
    assert upstream.received == []


def _gzip_bomb(sent_bytes: int) -> bytes:
    """Spaces inside a JSON object (valid JSON once decoded), about ``sent_bytes`` of
    gzip: level 1 expands ~230-fold here."""
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    parts, size = [packer.compress(BODY[:-1])], 0
    block = b" " * (4 << 20)
    while size < sent_bytes - 32_768:
        part = packer.compress(block)
        parts.append(part)
        size += len(part)
    parts += [packer.compress(b"}"), packer.flush()]
    return b"".join(parts)


def _expands_11_fold(decoded_bytes: int) -> bytes:
    """A body that expands ~11-fold with gzip (under its 20-fold bound) to
    ``decoded_bytes``: runs of one letter between random hex."""
    rng = np.random.default_rng(7)
    chunks, size = [], 0
    while size < decoded_bytes:
        chunk = rng.bytes(64).hex().encode() + b"a" * 800
        chunks.append(chunk)
        size += len(chunk)
    return b'{"model": "' + QWEN_MODEL.encode() + b'", "input": "' + b"".join(chunks) + b'"}'


@pytest.mark.parametrize(
    "coding,sent,says",
    [
        # Over what a body may have as sent (1.25 MiB of gzip, 256 KiB of br): refused
        # before any decoding.
        (
            "gzip",
            lambda: np.random.default_rng(1).bytes(1_400_000),
            "at most 1310720 bytes as sent",
        ),
        (
            "br",
            lambda: brotli.compress(np.random.default_rng(1).bytes(300_000)),
            "at most 262144 bytes as sent",
        ),
        # Within it, but expanding past the decoder's bound: cut off there, and said
        # so. A megabyte of gzip that would expand to ~230 MB; 16 KiB for 16 MiB; a
        # few bytes of br for 16 MiB. The megabyte takes standalone.yaml's route for
        # bodies of 1 MB or more, whose request headers go to the server first (to be
        # admitted): Envoy holds the decoded body meanwhile and stops it at the route's
        # 8 MiB buffer limit, with its own 413.
        ("gzip", lambda: _gzip_bomb(1 << 20), "Request body too large"),
        (
            "gzip",
            lambda: gzip.compress(BODY[:-1] + b" " * (16 << 20) + b"}"),
            "expands more than 20-fold",
        ),
        (
            "br",
            lambda: brotli.compress(BODY[:-1] + b" " * (16 << 20) + b"}"),
            "expands more than 100-fold",
        ),
        # Within both bounds, but over the body limit once decoded (8 MiB): Envoy
        # stops it at the routes' buffer limit (the listener reads 64 KiB at a time,
        # so that limit is the stream's own), with its own 413.
        ("gzip", lambda: gzip.compress(_expands_11_fold(9 << 20)), "Request body too large"),
    ],
    ids=[
        "gzip-over-1.25MiB",
        "br-over-256KiB",
        "gzip-1MB-bomb",
        "gzip-16KiB-bomb",
        "br-bomb",
        "gzip-9MiB-decoded",
    ],
)
def test_decompression_bomb_is_a_413(
    coding: str, sent: Any, says: str, *, shape: str, gateway: Gateway, upstream: FakeUpstream
) -> None:
    packed = sent()
    reply = ask(gateway, _coded(BODY, coding, sent=packed))
    if shape != DECODED:
        _refused_by_the_one_filter_shape(reply, upstream)
        return
    error = envelope(reply, 413)
    assert error["code"] == "request_too_large" and says in error["message"], error
    assert upstream.received == []


def test_the_over_the_limit_body_is_within_the_gzip_bounds() -> None:
    """The last bomb case above must be what it says: within 1.25 MiB as sent, under
    20-fold, over 8 MiB decoded."""
    decoded = _expands_11_fold(9 << 20)
    packed = gzip.compress(decoded)
    assert len(packed) <= 1310720 and 8 < len(decoded) / len(packed) < 20
    assert len(decoded) > 8 << 20


def test_compressed_body_on_another_path_reaches_the_legacy_server_as_sent(
    gateway: Gateway, upstream: FakeUpstream, legacy: FakeUpstream
) -> None:
    """Only the embeddings routes decode: the pass-through route forwards the bytes
    and the header untouched."""
    packed = gzip.compress(b'{"query": "capital of France"}')
    reply = ask(gateway, post("/v1/rerank", packed, headers=(("Content-Encoding", "gzip"),)))
    assert reply.status is not None
    (received,) = legacy.received
    assert received.body == packed and received.headers["content-encoding"] == "gzip"
    assert upstream.received == []


def test_identity_coding_is_accepted(gateway: Gateway, upstream: FakeUpstream) -> None:
    reply = ask(gateway, post("/v1/embeddings", BODY, headers=(("Content-Encoding", "identity"),)))
    assert reply.status == 200, reply
    (received,) = upstream.received
    assert "content-encoding" not in {k.lower() for k in received.headers}


def test_upstream_is_asked_for_identity(gateway: Gateway, upstream: FakeUpstream) -> None:
    """The gateway may read the answer: whatever the client accepts, the upstream is
    asked for an uncompressed one."""
    headers = (("Accept-Encoding", "gzip, br;q=0.9, zstd"),)
    ask(gateway, post("/v1/embeddings", BODY, headers=headers))
    (received,) = upstream.received
    assert {k.lower(): v for k, v in received.headers.items()}["accept-encoding"] == "identity"


def _batch(dimensions: int | None = None) -> bytes:
    doc: dict[str, Any] = {"model": QWEN_MODEL, "input": [f"document {i}" for i in range(8)]}
    if dimensions is not None:
        doc["dimensions"] = dimensions
    return orjson.dumps(doc)


def _vectors(body: bytes) -> np.ndarray[Any, Any]:
    return np.array([item["embedding"] for item in orjson.loads(body)["data"]], dtype=np.float32)


@pytest.mark.parametrize("dimensions", [None, 256], ids=["plain", "dimensions-rewritten"])
def test_client_accepting_gzip_gets_a_compressed_answer(
    dimensions: int | None, shape: str, gateway: Gateway
) -> None:
    """standalone.yaml compresses the final (rewritten) answer; the one-filter shape
    leaves compression to the mesh and answers identity - never a body labelled gzip
    that is not."""
    plain = ask(gateway, post("/v1/embeddings", _batch(dimensions)))
    packed = ask(
        gateway,
        post("/v1/embeddings", _batch(dimensions), headers=(("Accept-Encoding", "gzip"),)),
    )
    assert plain.status == packed.status == 200, (plain, packed)
    assert "content-encoding" not in plain.headers
    if shape == "single-filter":
        assert "content-encoding" not in packed.headers
        assert np.array_equal(_vectors(packed.body), _vectors(plain.body))
        return
    assert packed.headers["content-encoding"] == "gzip"
    assert np.array_equal(_vectors(gzip.decompress(packed.body)), _vectors(plain.body))
    assert len(packed.body) < len(plain.body) * 0.6


def test_http_1_0_compressed_answer_ends_with_the_connection(shape: str, gateway: Gateway) -> None:
    """HTTP/1.0 has no chunked coding: a compressed answer (no length known up front)
    is delimited by closing the connection, and decodes to the same vectors."""
    plain = ask(gateway, post("/v1/embeddings", _batch(), version="HTTP/1.0"))
    gzip_ok = (("Accept-Encoding", "gzip"),)
    packed = ask(gateway, post("/v1/embeddings", _batch(), version="HTTP/1.0", headers=gzip_ok))
    assert plain.status == packed.status == 200 and packed.complete, packed
    body = gzip.decompress(packed.body) if shape == "standalone" else packed.body
    assert np.array_equal(_vectors(body), _vectors(plain.body))


def test_client_accepting_br_gets_brotli(shape: str, gateway: Gateway) -> None:
    plain = ask(gateway, post("/v1/embeddings", _batch()))
    packed = ask(gateway, post("/v1/embeddings", _batch(), headers=(("Accept-Encoding", "br"),)))
    assert packed.status == 200, packed
    if shape == "single-filter":
        assert "content-encoding" not in packed.headers
        return
    assert packed.headers["content-encoding"] == "br"
    assert len(packed.body) < len(plain.body) * 0.6


# -- HTTP/1.0 and Envoy's own refusals ---------------------------------------------------


def _nginx_conf(folder: Path, port: int, gateway_port: int) -> str:
    """nginx as a reverse proxy in front of the gateway, with nginx's defaults: it
    speaks HTTP/1.0 to the gateway (`proxy_http_version` is 1.0 unless set)."""
    temp = "\n".join(
        f"    {kind}_temp_path {folder}/{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""
daemon off;
master_process off;
pid {folder}/nginx.pid;
error_log {folder}/nginx-error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
{temp}
    client_max_body_size 16m;
    server {{
        listen 127.0.0.1:{port};
        location / {{ proxy_pass http://127.0.0.1:{gateway_port}; }}
    }}
}}
"""


@pytest.fixture(scope="module")
def nginx(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The port of an nginx (Debian's, as in bench/) in front of the gateway."""
    binary = shutil.which("nginx")
    if binary is None:
        pytest.fail("nginx is not installed (scripts/test installs it: bench/setup.sh)")
    folder = tmp_path_factory.mktemp("nginx")
    port = free_port()
    conf = folder / "nginx.conf"
    conf.write_text(_nginx_conf(folder, port, gateway.port))
    process = Process.start(
        [binary, "-c", str(conf), "-p", str(folder)], folder / "nginx.log", name="nginx"
    )
    try:
        process.wait_until(lambda: port_open(port), 20, "nginx listening")
        yield port
    finally:
        process.stop(10)


def test_nginx_in_front_with_its_default_http_1_0(
    nginx: int, gateway: Gateway, upstream: FakeUpstream
) -> None:
    reply = exchange(nginx, post("/v1/embeddings", BODY), timeout=60.0)
    assert reply.status == 200, reply
    assert len(orjson.loads(reply.body)["data"]) == 1
    (received,) = upstream.received
    assert INSTRUCTION in received.body
    refused = exchange(nginx, post("/v1/embeddings", b'{"model": 5, "input": "x"}'), timeout=60.0)
    assert envelope(refused, 400)["param"] == "model"


@pytest.mark.parametrize("host", ["gw", None], ids=["with-host", "without-host"])
def test_http_1_0_is_answered(host: str | None, gateway: Gateway, upstream: FakeUpstream) -> None:
    reply = ask(gateway, post("/v1/embeddings", BODY, version="HTTP/1.0", host=host))
    assert reply.status == 200, reply
    assert len(orjson.loads(reply.body)["data"]) == 1
    (received,) = upstream.received
    assert INSTRUCTION in received.body


@pytest.mark.parametrize(
    "wire",
    [
        post("/v1/embeddings", BODY, headers=(("X-Big", "a" * 70_000),)),
        post("/v1/embeddings", BODY, headers=tuple((f"X-H{i}", "a" * 600) for i in range(120))),
    ],
    ids=["one-huge-header", "many-headers"],
)
def test_headers_too_large_is_a_431_envelope(
    wire: bytes, gateway: Gateway, upstream: FakeUpstream
) -> None:
    envelope(ask(gateway, wire), 431)
    assert upstream.received == []


@pytest.mark.parametrize(
    "wire",
    [
        post("/v1/embeddings", BODY, host=None),
        post("/v1/embeddings%00", BODY),
        post("/v1/%00embeddings", BODY),
    ],
    ids=["no-host", "nul-at-the-end", "nul-inside"],
)
def test_envoy_refusal_has_a_message(wire: bytes, gateway: Gateway, upstream: FakeUpstream) -> None:
    error = envelope(ask(gateway, wire), 400)
    assert error["type"] == "invalid_request_error"
    assert upstream.received == []


# -- HTTP/2 request trailers --------------------------------------------------------------
# A minimal h2c client (prior knowledge), written frame by frame: no HTTP library at
# hand sends request trailers. HPACK literals without indexing, no Huffman coding.

DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY = 0, 1, 3, 4, 7
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def _hpack(*fields: tuple[str, str]) -> bytes:
    block = b""
    for name, value in fields:
        raw_name, raw_value = name.encode(), value.encode()
        assert len(raw_name) < 127 and len(raw_value) < 127
        block += b"\x00" + bytes([len(raw_name)]) + raw_name + bytes([len(raw_value)]) + raw_value
    return block


def h2_post(
    port: int,
    path: str,
    body: bytes,
    *,
    trailers: bool,
    headers: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """POST on stream 1 (with ``headers`` too), then (optionally) trailers; the answer's
    DATA (bounded wait). An empty ``body`` before trailers is sent as no DATA frame."""
    head = _hpack(
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "gw"),
        ("content-type", "application/json"),
        *headers,
    )
    wire = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(SETTINGS, 0, 0)
    wire += _frame(HEADERS, END_HEADERS, 1, head)
    if body or not trailers:
        wire += _frame(DATA, 0 if trailers else END_STREAM, 1, body)
    if trailers:
        wire += _frame(HEADERS, END_HEADERS | END_STREAM, 1, _hpack(("x-checksum", "1")))
    deadline = time.monotonic() + 30.0
    with socket.create_connection(("127.0.0.1", port), timeout=30.0) as sock:
        sock.sendall(wire)
        buffer, answer = b"", b""
        while time.monotonic() < deadline:
            while len(buffer) < 9 or len(buffer) < 9 + int.from_bytes(buffer[:3], "big"):
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                chunk = sock.recv(65536)
                assert chunk, f"connection closed; got {answer!r}"
                buffer += chunk
            size, kind, flags = int.from_bytes(buffer[:3], "big"), buffer[3], buffer[4]
            stream = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
            payload, buffer = buffer[9 : 9 + size], buffer[9 + size :]
            if kind == SETTINGS and not flags & ACK:
                sock.sendall(_frame(SETTINGS, ACK, 0))
            assert kind not in (RST_STREAM, GOAWAY), (kind, payload)
            if stream == 1 and kind == DATA:
                answer += payload
            if stream == 1 and kind in (DATA, HEADERS) and flags & END_STREAM:
                return answer
    raise AssertionError(f"no complete answer in 30 s; got {answer!r}")


def test_http2_request_without_trailers_goes_through_the_contract(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    answer = h2_post(gateway.port, "/v1/embeddings", BODY, trailers=False)
    assert len(orjson.loads(answer)["data"]) == 1
    (received,) = upstream.received
    assert INSTRUCTION in received.body


@pytest.mark.parametrize("dimensions", [None, 256], ids=["plain", "dimensions-rewritten"])
def test_http2_request_with_trailers_goes_through_the_contract(
    dimensions: int | None, gateway: Gateway, upstream: FakeUpstream
) -> None:
    """The body before the trailers is the whole body: the upstream gets it rewritten
    (the query's instruction; `dimensions` stripped) and the client the contract's
    answer (256-d vectors when asked for)."""
    body = orjson.dumps({**QUERY, **({"dimensions": dimensions} if dimensions else {})})
    answer = h2_post(gateway.port, "/v1/embeddings", body, trailers=True)
    (item,) = orjson.loads(answer)["data"]
    assert len(item["embedding"]) == (dimensions or 1024)
    (received,) = upstream.received
    assert INSTRUCTION in received.body
    assert "input_type" not in received.json and "dimensions" not in received.json


def test_http2_invalid_request_with_trailers_is_refused(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    answer = h2_post(gateway.port, "/v1/embeddings", b'{"model": 5, "input": "x"}', trailers=True)
    error = orjson.loads(answer)["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "model"
    assert upstream.received == []


@pytest.mark.parametrize("trailers", [False, True], ids=["no-trailers", "client-trailers"])
@pytest.mark.parametrize("coding", ["gzip", "br"])
def test_http2_compressed_body_is_decoded(
    coding: str, trailers: bool, shape: str, gateway: Gateway, upstream: FakeUpstream
) -> None:
    """The decoder adds request trailers (its byte counts), so ext_proc gets the body
    as not the end of the stream, as with a client's trailers: the whole body all the
    same. The HTTP/1 upstream gets the rewritten JSON with its length, no trailers."""
    body = orjson.dumps({**QUERY, "dimensions": 256})
    packed = _encode(coding, body)
    answer = h2_post(
        gateway.port,
        "/v1/embeddings",
        packed,
        trailers=trailers,
        headers=(("content-encoding", coding),),
    )
    if shape != DECODED:
        assert orjson.loads(answer)["error"]["code"] == "unsupported_content_encoding"
        assert upstream.received == []
        return
    (item,) = orjson.loads(answer)["data"]
    assert len(item["embedding"]) == 256
    (received,) = upstream.received
    assert INSTRUCTION in received.body and "dimensions" not in received.json
    assert received.headers["content-length"] == str(len(received.body))
    assert not {"content-encoding", "transfer-encoding"} & set(received.headers)
    assert not any(name.startswith("x-envoy-decompressor") for name in received.headers)


def test_http2_empty_body_with_trailers_is_an_empty_post(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """Headers, then trailers, no DATA: Envoy sends ext_proc no body message (there is
    none to buffer), so the request reaches the upstream as an empty POST, whose 400
    comes back in the envelope. Nothing of the contract is skipped: there is no body."""
    answer = h2_post(gateway.port, "/v1/embeddings", b"", trailers=True)
    assert orjson.loads(answer)["error"]["type"] == "invalid_request_error"
    (received,) = upstream.received
    assert received.body == b""
