"""Hostile requests for POST /v1/embeddings, as data, and what each gets.

Every case is one HTTP/1.1 request as it goes on the wire, with the answer the
gateway documents for it (docs/errors.md). tests/test_hostile_input.py sends each
through a real Envoy + ext_proc (`extproc run`) in front of testing_support/fake_upstream.py.

Four outcomes:

- ``REFUSED``: the documented 4xx in the OpenAI envelope, with the case's ``type``,
  ``param`` and ``code``; the upstream never sees the request. Most come from the
  gateway (request_json.py and its neighbours); some from the shipped Envoy config (405 direct
  response, 413 buffer limit, a 400 for broken chunking, enveloped by its
  local_reply_config).
- ``ANSWERED``: hostile but valid (zero-width and bidi characters, lone NULs, an
  8 MB text, chunked bodies...): a 200 with one embedding per input. Rejecting
  valid text would be a bug too.
- ``FRAMING_ERROR``: bytes Envoy's HTTP/1 codec refuses before the gateway sees a
  request. Measured on Envoy 1.40 with both shipped configs: a complete 400
  envelope, then the connection closes after Envoy's 1 s delayed close (the
  gateway filters that could hold a local reply run only on the embeddings routes,
  so Envoy's own answer passes whole). The exception: a broken chunk after the
  headers under envoy/single-filter.yaml, where the ext_proc filter already holds
  the stream and the codec resets it first (nothing comes back); ``enveloped_in``
  lists the shapes that answer each case. Either way: never the upstream, never a hang.
- ``BODY_NEVER_ENDS``: the body declared is longer than the body sent. Nothing can
  be decided until Envoy's request_timeout (60 s shipped), which then answers a
  408 envelope; never the upstream, never a 5xx.

Decisions this corpus pins (request_json.py's docstring has the reasons):

- A key repeated in a JSON object is a 400 (``param`` = the field when it is one
  the gateway interprets), not "the last one wins".
- A field the gateway does not interpret may nest at most 253 levels (orjson writes
  no deeper); deeper is a 400 ``invalid_json``. JSON nested past 1,024 levels is
  malformed JSON to orjson: 400 ``invalid_json``.
- Numbers past float64 (1e400, a 401-digit integer) and NaN/Infinity are not
  JSON the gateway reads: 400 ``invalid_json``, ``param`` null (the parser stops
  before any field is known). 1e308 parses, and is then a wrong ``dimensions``.
- A UTF-8 byte order mark before the body is skipped, as the legacy FastAPI server
  did (the shipped policy's ``legacy`` profile), and never forwarded: orjson and
  Dynamo's serde_json refuse it. The ``openai`` profile refuses it (invalid JSON).
- The shipped policy's ``legacy`` profile reads numbers as the legacy server's lax
  pydantic model did: ``"256"``, ``256.0``, ``true`` (1) and ``"8"`` are integers,
  forwarded converted; ``256.5``, ``"256.5"`` and ``1e308`` are not.
- One text that cannot be cut without tokenizing more than 256 KiB of a single
  "word" (8 MB of letters, emoji, spaces or zero-width spaces) is a 413: it would
  cost ~17 s of CPU (it did: a 504 after Envoy's 15 s message timeout, with the
  tokenizer still busy). An 8 MB text of ordinary words is cut and answered.
- ``user`` must be a string (or null), as for both upstreams.
- Error messages never echo more than errors.MAX_MESSAGE_CHARS characters.

Formerly known gaps, fixed in envoy/*.yaml and asserted in tests/test_hostile_input.py:
``Content-Length: 00`` (the empty-body route matches ``0+``), a body without a
Content-Type (the routes add ``application/json`` if absent), and ``//v1/embeddings``,
``/v1/%65mbeddings``, ``/v1/embeddings/`` (normalize_path + merge_slashes; paths below
the endpoint are a 404). Still open, asserted as measured: an HTTP/1.1 POST with neither
Content-Length nor Transfer-Encoding reaches the upstream as an empty POST under
standalone.yaml (its upstream 400 comes back enveloped).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final

import orjson

MODEL: Final = "Qwen/Qwen3-Embedding-0.6B"
VOCAB_SIZE: Final = 151669  # Qwen3's tokenizer.json, added tokens included
MAX_INPUTS: Final = 2048  # the shipped policy's limits
MAX_REQUEST_BYTES: Final = 8 * 1024 * 1024
INVALID: Final = "invalid_request_error"
SHAPES: Final = frozenset({"standalone", "single-filter"})  # envoy/<shape>.yaml
JSON_HEADERS: Final = (("Content-Type", "application/json"),)


class Outcome(enum.Enum):
    REFUSED = "refused"
    ANSWERED = "answered"
    FRAMING_ERROR = "framing_error"
    BODY_NEVER_ENDS = "body_never_ends"


class Framing(enum.Enum):
    """How the body is delimited on the wire."""

    CONTENT_LENGTH = "content-length"  # a correct Content-Length is added
    CHUNKED = "chunked"  # valid chunked encoding, the body cut in two chunks
    AS_GIVEN = "as-given"  # the case's headers alone say it (lies included)


@dataclass(frozen=True)
class Expected:
    """The answer: status, and for an envelope its ``type``, ``param`` and ``code``."""

    status: int
    param: str | None = None
    type: str = INVALID
    code: str | None = None


@dataclass(frozen=True)
class HostileRequest:
    name: str
    body: bytes
    expected: Expected
    outcome: Outcome = Outcome.REFUSED
    method: str = "POST"
    path: str = "/v1/embeddings"
    version: str = "HTTP/1.1"
    headers: tuple[tuple[str, str], ...] = JSON_HEADERS
    framing: Framing = Framing.CONTENT_LENGTH
    # ANSWERED: embeddings expected back, and whether the upstream must get the
    # body byte for byte (nothing for the gateway to change).
    inputs: int = 1
    forwarded_as_sent: bool = False
    # ANSWERED: the size of the vectors when ``dimensions`` asks for a cut.
    dimensions: int | None = None
    # FRAMING_ERROR: the Envoy shapes that still answer a complete envelope.
    enveloped_in: frozenset[str] = frozenset()

    def wire(self) -> bytes:
        """The request exactly as it goes on the socket."""
        lines = [f"{self.method} {self.path} {self.version}", "Host: 127.0.0.1"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        payload = self.body
        if self.framing is Framing.CONTENT_LENGTH:
            lines.append(f"Content-Length: {len(self.body)}")
        elif self.framing is Framing.CHUNKED:
            lines.append("Transfer-Encoding: chunked")
            half = len(self.body) // 2
            payload = b"".join(
                b"%x\r\n%s\r\n" % (len(part), part)
                for part in (self.body[:half], self.body[half:])
                if part
            )
            payload += b"0\r\n\r\n"
        head = "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n"
        return head + payload


_DROP: Final[Any] = object()


def request_body(**fields: Any) -> bytes:
    """A valid request with ``fields`` changed (``_DROP`` removes one)."""
    doc: dict[str, Any] = {"model": MODEL, "input": "hello"}
    doc.update(fields)
    return orjson.dumps({k: v for k, v in doc.items() if v is not _DROP})


def with_raw(fragment: bytes) -> bytes:
    """A request whose fields after ``model`` are raw JSON text (for what no
    serializer writes: NaN, 1e400, duplicate keys, broken escapes)."""
    return b'{"model":"%s",%s}' % (MODEL.encode(), fragment)


def refused(
    name: str, body: bytes, status: int = 400, param: str | None = None, **options: Any
) -> HostileRequest:
    code = options.pop("code", None)
    error_type = options.pop("type", INVALID)
    return HostileRequest(name, body, Expected(status, param, error_type, code), **options)


def bad_json(name: str, body: bytes, **options: Any) -> HostileRequest:
    return refused(name, body, code="invalid_json", **options)


def bad_field(name: str, param: str, **fields: Any) -> HostileRequest:
    return refused(name, request_body(**fields), param=param)


def answered(name: str, body: bytes, inputs: int = 1, **options: Any) -> HostileRequest:
    return HostileRequest(name, body, Expected(200), Outcome.ANSWERED, inputs=inputs, **options)


def nested(opening: bytes, closing: bytes, levels: int) -> bytes:
    return opening * levels + closing * levels


# An 8 MB single string that still fits the body limit, made of words: truncated to
# the first 1,023 tokens + EOS like the legacy server did (the head is tokenized, not
# the 8 MB). A single 8 MB *word* is a known gap (see the module docstring).
_HUGE_TEXT_HEAD = b'{"model":"%s","input":"' % MODEL.encode()
HUGE_TEXT_BODY: Final = (
    _HUGE_TEXT_HEAD + b"ab " * ((MAX_REQUEST_BYTES - len(_HUGE_TEXT_HEAD) - 2) // 3) + b'"}'
)
TEN_THOUSAND_INPUTS: Final = request_body(input=[f"text {i}" for i in range(10_000)])
OVER_THE_BODY_LIMIT: Final = request_body(input="x" * (MAX_REQUEST_BYTES + 1024))


def one_huge_word(unit: str) -> bytes:
    """One text input as large as the body limit allows, all one pre-token "word"."""
    encoded = unit.encode()
    return (
        _HUGE_TEXT_HEAD
        + encoded * ((MAX_REQUEST_BYTES - len(_HUGE_TEXT_HEAD) - 2) // len(encoded))
        + b'"}'
    )


MALFORMED_JSON: Final = [
    bad_json("truncated-after-colon", b'{"model": "%s", "input": ' % MODEL.encode()),
    bad_json("truncated-in-string", b'{"model":"%s","input":"hel' % MODEL.encode()),
    bad_json("unclosed-object", request_body()[:-1]),
    bad_json("trailing-comma", request_body()[:-1] + b",}"),
    bad_json("single-quotes", b"{'model': '%s', 'input': 'x'}" % MODEL.encode()),
    bad_json("comment", b'{/* hi */"model":"%s","input":"x"}' % MODEL.encode()),
    bad_json("trailing-garbage", request_body() + b" x"),
    bad_json("two-documents", request_body() + request_body()),
    bad_json("bare-word", b"hello"),
    bad_json("utf16-body", request_body().decode().encode("utf-16")),
    bad_json("raw-newline-in-string", with_raw(b'"input":"a\nb"')),
    bad_json("bad-escape", with_raw(b'"input":"\\x41"')),
    bad_json("short-unicode-escape", with_raw(b'"input":"\\u12"')),
    # Not an object / nothing at all.
    bad_json("empty-body", b""),
    bad_json("whitespace-body", b" \r\n\t "),
    bad_json("array-body", b'["hello"]'),
    bad_json("string-body", b'"hello"'),
    bad_json("number-body", b"42"),
    bad_json("null-body", b"null"),
    bad_json("true-body", b"true"),
    refused("empty-object", b"{}", param="model"),
]

NUMBERS: Final = [
    bad_json("dimensions-1e400", with_raw(b'"input":"x","dimensions":1e400')),
    bad_json("dimensions-401-digit-int", with_raw(b'"input":"x","dimensions":1' + b"0" * 400)),
    bad_json("dimensions-minus-1e400", with_raw(b'"input":"x","dimensions":-1e400')),
    bad_json("dimensions-nan", with_raw(b'"input":"x","dimensions":NaN')),
    bad_json("dimensions-infinity", with_raw(b'"input":"x","dimensions":Infinity')),
    bad_json("dimensions-minus-infinity", with_raw(b'"input":"x","dimensions":-Infinity')),
    bad_json("token-id-nan", with_raw(b'"input":[1,NaN]')),
    refused("dimensions-1e308", with_raw(b'"input":"x","dimensions":1e308'), param="dimensions"),
    refused(
        "dimensions-2-to-the-64",
        with_raw(b'"input":"x","dimensions":18446744073709551616'),
        param="dimensions",
    ),
    bad_field("dimensions-int64-max", "dimensions", dimensions=2**63 - 1),
    refused("dimensions-minus-zero", with_raw(b'"input":"x","dimensions":-0'), param="dimensions"),
    refused("token-id-2-to-the-64", with_raw(b'"input":[18446744073709551616]'), param="input"),
    refused(
        "truncate-1e308",
        with_raw(b'"input":"x","truncate_prompt_tokens":1e308'),
        param="truncate_prompt_tokens",
    ),
]

WRONG_TYPES: Final = [
    bad_field("model-missing", "model", model=_DROP),
    bad_field("model-null", "model", model=None),
    bad_field("model-number", "model", model=5),
    bad_field("model-bool", "model", model=True),
    bad_field("model-array", "model", model=[MODEL]),
    bad_field("model-object", "model", model={"name": MODEL}),
    refused(
        "model-unknown",
        request_body(model="text-embedding-3-small"),
        404,
        "model",
        code="model_not_found",
    ),
    refused(
        "model-with-zero-width-space",
        request_body(model="Qwen/Qwen3\u200b-Embedding-0.6B"),
        404,
        "model",
        code="model_not_found",
    ),
    refused("model-1mb", request_body(model="m" * 1_000_000), 404, "model", code="model_not_found"),
    bad_field("input-missing", "input", input=_DROP),
    bad_field("input-null", "input", input=None),
    bad_field("input-number", "input", input=5),
    bad_field("input-bool", "input", input=False),
    bad_field("input-object", "input", input={"text": "x"}),
    bad_field("input-empty-array", "input", input=[]),
    bad_field("input-string-then-number", "input", input=["a", 1]),
    bad_field("input-number-then-string", "input", input=[1, "a"]),
    bad_field("input-ids-then-number", "input", input=[[1, 2], 3]),
    bad_field("input-null-item", "input", input=[None]),
    bad_field("input-float-token-id", "input", input=[[1.5]]),
    bad_field("dimensions-bool", "dimensions", dimensions=True),
    bad_field("dimensions-array", "dimensions", dimensions=[256]),
    bad_field("dimensions-object", "dimensions", dimensions={"n": 256}),
    bad_field("dimensions-fraction", "dimensions", dimensions=256.5),
    bad_field("dimensions-zero", "dimensions", dimensions=0),
    bad_field("dimensions-below-matryoshka", "dimensions", dimensions=31),
    bad_field("dimensions-above-native", "dimensions", dimensions=1025),
    bad_field("encoding-number", "encoding_format", encoding_format=1),
    bad_field("encoding-unknown", "encoding_format", encoding_format="bytes"),
    bad_field("encoding-upper-case", "encoding_format", encoding_format="FLOAT"),
    bad_field("encoding-array", "encoding_format", encoding_format=["float"]),
    bad_field("encoding-object", "encoding_format", encoding_format={"a": 1}),
    bad_field("encoding-bool", "encoding_format", encoding_format=True),
    bad_field("input-type-number", "input_type", input_type=1),
    bad_field("input-type-unknown", "input_type", input_type="banana"),
    bad_field("input-type-array", "input_type", input_type=["query"]),
    bad_field("input-type-object", "input_type", input_type={}),
    bad_field("input-type-1mb", "input_type", input_type="q" * 1_000_000),
    bad_field("instruction-number", "instruction", instruction=3),
    bad_field("instruction-array", "instruction", instruction=["task"]),
    bad_field("instruction-empty", "instruction", instruction=""),
    bad_field("instruction-blank", "instruction", instruction=" \n\t"),
    bad_field("instruction-with-document", "instruction", instruction="t", input_type="document"),
    bad_field("user-number", "user", user=5),
    bad_field("user-array", "user", user=["u"]),
    bad_field("user-object", "user", user={"id": "u"}),
    bad_field("user-bool", "user", user=True),
    bad_field("truncate-zero", "truncate_prompt_tokens", truncate_prompt_tokens=0),
    bad_field("truncate-minus-2", "truncate_prompt_tokens", truncate_prompt_tokens=-2),
    bad_field("truncate-over-max", "truncate_prompt_tokens", truncate_prompt_tokens=1025),
    bad_field("truncate-fraction", "truncate_prompt_tokens", truncate_prompt_tokens=8.5),
]

TOKENS_AND_COUNTS: Final = [
    bad_field("token-id-vocab-size", "input", input=[VOCAB_SIZE]),
    bad_field("token-id-huge", "input", input=[1, 10**9]),
    bad_field("token-id-negative", "input", input=[[5, 6], [-1]]),
    bad_field("token-list-empty", "input", input=[[]]),
    bad_field("second-token-list-empty", "input", input=[[5], []]),
    refused("ten-thousand-inputs", TEN_THOUSAND_INPUTS, param="input"),
    bad_field("one-input-too-many", "input", input=["a"] * (MAX_INPUTS + 1)),
    refused("body-over-the-limit", OVER_THE_BODY_LIMIT, 413, code="request_too_large"),
    *[
        refused(
            f"one-8mb-word-of-{name}", one_huge_word(unit), 413, "input", code="request_too_large"
        )
        for name, unit in [
            ("letters", "a"),
            ("emoji", "\U0001f600"),
            ("spaces", " "),
            ("zero-width-spaces", "\u200b"),
        ]
    ],
]

BAD_TEXT: Final = [
    bad_json("invalid-utf8-bytes", with_raw(b'"input":"\xff\xfe"')),
    bad_json("overlong-utf8", with_raw(b'"input":"\xc0\xaf"')),
    bad_json("utf8-encoded-surrogate", with_raw(b'"input":"\xed\xa0\x80"')),
    bad_json("utf8-cut-mid-character", with_raw(b'"input":"\xe2\x82"')),
    bad_json("invalid-utf8-in-key", with_raw(b'"inp\xffut":"x","input":"x"')),
    bad_json("lone-high-surrogate", with_raw(b'"input":"\\ud800"')),
    bad_json("lone-low-surrogate", with_raw(b'"input":"\\udc00"')),
    bad_json("surrogates-reversed", with_raw(b'"input":"\\ude00\\ud83d"')),
    bad_json("lone-surrogate-in-model", b'{"model":"\\ud800","input":"x"}'),
]

NESTING: Final = [
    bad_json("body-100k-nested-arrays", nested(b"[", b"]", 100_000)),
    bad_json("body-100k-nested-objects", nested(b'{"a":', b"}", 100_000)[:-1] + b"1}"),
    bad_json("input-100k-nested-arrays", with_raw(b'"input":' + nested(b"[", b"]", 100_000))),
    # Under orjson's read limit but past what it writes: was a 500 (TypeError)
    # whenever the body had to be rewritten.
    bad_json(
        "extra-field-300-deep-rewritten",
        with_raw(b'"input":"x","input_type":"query","nvext":' + nested(b"[", b"]", 300)),
    ),
    bad_json("extra-field-300-deep", with_raw(b'"input":"x","nvext":' + nested(b"[", b"]", 300))),
    bad_json(
        "extra-field-1000-deep", with_raw(b'"input":"a:b","nvext":' + nested(b"[", b"]", 1000))
    ),
    refused("input-1000-deep", with_raw(b'"input":' + nested(b"[", b"]", 1000)), param="input"),
]

DUPLICATE_KEYS: Final = [
    refused("input-twice", with_raw(b'"input":"a","input":"b"'), param="input"),
    refused("input-twice-escaped", with_raw(b'"input":"a","\\u0069nput":[1]'), param="input"),
    refused(
        "model-twice", b'{"model":"other","input":"x","model":"%s"}' % MODEL.encode(), param="model"
    ),
    refused(
        "dimensions-twice",
        with_raw(b'"input":"x","dimensions":64,"dimensions":1'),
        param="dimensions",
    ),
    refused(
        "input-type-twice",
        with_raw(b'"input":"x","input_type":"query","input_type":"passage"'),
        param="input_type",
    ),
    bad_json("unknown-field-twice", with_raw(b'"input":"x","nvext":1,"nvext":2')),
    bad_json("nested-key-twice", with_raw(b'"input":"x","nvext":{"k":1,"k":2}')),
]

HEADERS_AND_METHODS: Final = [
    refused(
        "content-type-text-plain",
        request_body(),
        415,
        headers=(("Content-Type", "text/plain"),),
        code="unsupported_media_type",
    ),
    refused(
        "content-type-form",
        request_body(),
        415,
        headers=(("Content-Type", "application/x-www-form-urlencoded"),),
        code="unsupported_media_type",
    ),
    refused(
        "content-type-multipart",
        request_body(),
        415,
        headers=(("Content-Type", "multipart/form-data; boundary=x"),),
        code="unsupported_media_type",
    ),
    refused(
        "content-type-xml",
        request_body(),
        415,
        headers=(("Content-Type", "application/xml"),),
        code="unsupported_media_type",
    ),
    refused(
        "content-type-empty",
        request_body(),
        415,
        headers=(("Content-Type", ""),),
        code="unsupported_media_type",
    ),
    refused(
        "content-type-twice",  # Envoy joins them: "text/plain,application/json"
        request_body(),
        415,
        headers=(("Content-Type", "text/plain"), ("Content-Type", "application/json")),
        code="unsupported_media_type",
    ),
    refused(
        "method-get",
        b"",
        405,
        method="GET",
        headers=(),
        framing=Framing.AS_GIVEN,
        code="method_not_allowed",
    ),
    refused("method-put", request_body(), 405, method="PUT", code="method_not_allowed"),
    refused(
        "method-delete",
        b"",
        405,
        method="DELETE",
        headers=(),
        framing=Framing.AS_GIVEN,
        code="method_not_allowed",
    ),
    refused("method-patch", request_body(), 405, method="PATCH", code="method_not_allowed"),
    refused(
        "method-options",
        b"",
        405,
        method="OPTIONS",
        headers=(),
        framing=Framing.AS_GIVEN,
        code="method_not_allowed",
    ),
    # The query string does not take the request off the validated route.
    refused(
        "query-string-still-validated",
        request_body(input=[]),
        param="input",
        path="/v1/embeddings?debug=1",
    ),
]

_SMALL = request_body()

WIRE: Final = [
    # Declared shorter than sent: the gateway reads the declared 10 bytes only.
    bad_json(
        "content-length-shorter",
        _SMALL,
        headers=(*JSON_HEADERS, ("Content-Length", "10")),
        framing=Framing.AS_GIVEN,
    ),
    bad_json(
        "content-length-zero",
        b"",
        headers=(*JSON_HEADERS, ("Content-Length", "0")),
        framing=Framing.AS_GIVEN,
    ),
    bad_json("chunked-empty", b"", framing=Framing.CHUNKED),
    bad_json("chunked-malformed-json", _SMALL[:-1], framing=Framing.CHUNKED),
    refused(
        "chunked-over-the-limit",
        OVER_THE_BODY_LIMIT,
        413,
        framing=Framing.CHUNKED,
        code="request_too_large",
    ),
]


def framing_error(
    name: str, wire_body: bytes, code: str = "invalid_request", **options: Any
) -> HostileRequest:
    """Refused by Envoy's HTTP/1 codec: always a 400 with a client error ``code`` (the
    shipped local_reply_config turns the codec's 501 for a Transfer-Encoding it does not
    support into a 400 ``unsupported_transfer_encoding``)."""
    options.setdefault("framing", Framing.AS_GIVEN)
    options.setdefault("enveloped_in", SHAPES)
    expected = Expected(400, code=code)
    return HostileRequest(name, wire_body, expected, Outcome.FRAMING_ERROR, **options)


def _chunked(*headers: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return (*JSON_HEADERS, ("Transfer-Encoding", "chunked"), *headers)


FRAMING_ERRORS: Final = [
    framing_error(
        "content-length-negative", _SMALL, headers=(*JSON_HEADERS, ("Content-Length", "-1"))
    ),
    framing_error(
        "content-length-not-a-number", _SMALL, headers=(*JSON_HEADERS, ("Content-Length", "abc"))
    ),
    framing_error(
        "content-length-past-uint64", _SMALL, headers=(*JSON_HEADERS, ("Content-Length", "9" * 30))
    ),
    framing_error(
        "content-length-twice-different",
        _SMALL,
        headers=(*JSON_HEADERS, ("Content-Length", str(len(_SMALL))), ("Content-Length", "5")),
    ),
    # Both framings at once: the classic request-smuggling shape.
    framing_error(
        "chunked-and-content-length",
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(_SMALL), _SMALL),
        headers=_chunked(("Content-Length", "5")),
    ),
    # Any Transfer-Encoding but `chunked` alone: Envoy's codec answers 501 (Not
    # Implemented), which the shipped configs turn into a 400 (RFC 9112 6.3: chunked
    # not the final coding) with a client error code, never a retryable 5xx.
    framing_error(
        "transfer-encoding-chunked-identity",
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(_SMALL), _SMALL),
        code="unsupported_transfer_encoding",
        headers=(*JSON_HEADERS, ("Transfer-Encoding", "chunked, identity")),
    ),
    framing_error(
        "transfer-encoding-identity",
        _SMALL,
        code="unsupported_transfer_encoding",
        headers=(*JSON_HEADERS, ("Transfer-Encoding", "identity")),
    ),
    framing_error(
        "transfer-encoding-gzip-chunked",
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(_SMALL), _SMALL),
        code="unsupported_transfer_encoding",
        headers=(*JSON_HEADERS, ("Transfer-Encoding", "gzip, chunked")),
    ),
    framing_error(
        "transfer-encoding-gzip",
        _SMALL,
        headers=(
            *JSON_HEADERS,
            ("Transfer-Encoding", "gzip"),
            ("Content-Length", str(len(_SMALL))),
        ),
    ),
    # Broken chunking after the headers: standalone.yaml's Envoy has a stream by then
    # and answers a complete 400 envelope.
    framing_error(
        "chunk-size-not-hex",
        b"zz\r\n" + _SMALL + b"\r\n0\r\n\r\n",
        headers=_chunked(),
        enveloped_in=frozenset({"standalone"}),
    ),
    framing_error(
        "chunk-missing-crlf",
        b"%x\r\n%sXX0\r\n\r\n" % (len(_SMALL), _SMALL),
        headers=_chunked(),
        enveloped_in=frozenset({"standalone"}),
    ),
    framing_error("request-line-garbage", b"", method="GARBAGE", path="", version="", headers=()),
    framing_error("method-lower-case", _SMALL, method="post", framing=Framing.CONTENT_LENGTH),
    framing_error(
        "header-name-with-space",
        _SMALL,
        headers=(("Content Type", "application/json"),),
        framing=Framing.CONTENT_LENGTH,
    ),
]

BODY_NEVER_ENDS: Final = [
    HostileRequest(
        "content-length-longer",
        _SMALL,
        Expected(408),
        Outcome.BODY_NEVER_ENDS,
        headers=(*JSON_HEADERS, ("Content-Length", "1000")),
        framing=Framing.AS_GIVEN,
    ),
    HostileRequest(
        "chunk-longer-than-sent",
        b"%x\r\n%s\r\n" % (len(_SMALL) + 50, _SMALL),
        Expected(408),
        Outcome.BODY_NEVER_ENDS,
        headers=_chunked(),
        framing=Framing.AS_GIVEN,
    ),
    HostileRequest(
        "last-chunk-missing",
        b"%x\r\n%s\r\n" % (len(_SMALL), _SMALL),
        Expected(408),
        Outcome.BODY_NEVER_ENDS,
        headers=_chunked(),
        framing=Framing.AS_GIVEN,
    ),
]

# Hostile but valid: each must be answered, not refused.
ACCEPTED: Final = [
    answered(
        "zero-width-characters",
        request_body(input="a\u200bb\u200cc\u200dd\u2060e\ufeff"),
        forwarded_as_sent=True,
    ),
    answered(
        "bidi-overrides",
        request_body(input="\u202eabc\u202c \u2066x\u2069 \u200f\u061c"),
        forwarded_as_sent=True,
    ),
    answered("only-zero-width", request_body(input="\u200b\u200b\u200b"), forwarded_as_sent=True),
    answered("escaped-nul", with_raw(b'"input":"a\\u0000b"'), forwarded_as_sent=True),
    answered(
        "escaped-surrogate-pair",
        with_raw(b'"input":"\\ud83d\\ude00 \\ud83c\\udff3\\ufe0f\\u200d\\ud83c\\udf08"'),
        forwarded_as_sent=True,
    ),
    answered("combining-marks", request_body(input="e" + "\u0301" * 500), forwarded_as_sent=True),
    answered(
        "escaped-key-names",
        b'{"\\u006dodel":"%s","\\u0069nput":"x"}' % MODEL.encode(),
        forwarded_as_sent=True,
    ),
    answered("empty-string", request_body(input=""), forwarded_as_sent=True),
    answered(
        "mixed-scripts-batch",
        request_body(
            input=[
                "\u202e\u0645\u0631\u062d\u0628\u0627",
                "\u05e9\u05dc\u05d5\u05dd",
                "\u1100\u1161",
                "\U0001f600" * 3,
            ]
        ),
        inputs=4,
        forwarded_as_sent=True,
    ),
    answered("padded-with-whitespace", b" \r\n\t" + _SMALL + b"\n ", forwarded_as_sent=True),
    answered(
        "unknown-fields",
        request_body(nvext={"a": [1, {"b": None}]}, priority=0),
        forwarded_as_sent=True,
    ),
    answered(
        "extra-field-253-deep",
        with_raw(b'"input":"x","input_type":"query","nvext":' + nested(b"[", b"]", 253)),
    ),
    answered("user-string", request_body(user="\u202euser"), forwarded_as_sent=True),
    answered(
        "max-inputs",
        request_body(input=["x"] * MAX_INPUTS),
        inputs=MAX_INPUTS,
        forwarded_as_sent=True,
    ),
    answered("last-token-id", request_body(input=[0, VOCAB_SIZE - 1]), forwarded_as_sent=True),
    # One token-id sequence is one input however long (cut to 1,024 ids), not 3,000 inputs.
    answered("flat-token-ids-past-max-inputs", request_body(input=list(range(1000, 4000)))),
    answered("huge-text-near-the-body-limit", HUGE_TEXT_BODY),
    answered("chunked-body", _SMALL, framing=Framing.CHUNKED, forwarded_as_sent=True),
    answered(
        "content-type-with-charset",
        _SMALL,
        headers=(("Content-Type", "application/json; charset=utf-8"),),
        forwarded_as_sent=True,
    ),
    answered(
        "content-type-plus-json",
        _SMALL,
        headers=(("Content-Type", "application/vnd.api+json"),),
        forwarded_as_sent=True,
    ),
    answered("query-string", _SMALL, path="/v1/embeddings?x=%00", forwarded_as_sent=True),
    # Refused before the legacy profile read fields as the legacy server's lax model did.
    answered("utf8-bom-first", b"\xef\xbb\xbf" + request_body()),
    answered("dimensions-string", request_body(dimensions="256"), dimensions=256),
    answered("input-bool-token-id", request_body(input=[True])),
    answered("truncate-string", request_body(truncate_prompt_tokens="8")),
    answered("truncate-bool", request_body(truncate_prompt_tokens=True)),
    # nginx's default `proxy_http_version 1.0` in front of the gateway speaks it.
    answered("http-1.0", _SMALL, version="HTTP/1.0", forwarded_as_sent=True),
    # Once HTTP/1.0 is accepted, Envoy's codec reads any version but 1.1 as 1.0: the
    # request still goes through the contract like any other.
    answered("http-9.9-read-as-1.0", _SMALL, version="HTTP/9.9", forwarded_as_sent=True),
]

REFUSED: Final = [
    *MALFORMED_JSON,
    *NUMBERS,
    *WRONG_TYPES,
    *TOKENS_AND_COUNTS,
    *BAD_TEXT,
    *NESTING,
    *DUPLICATE_KEYS,
    *HEADERS_AND_METHODS,
    *WIRE,
]
CORPUS: Final = [*REFUSED, *FRAMING_ERRORS, *BODY_NEVER_ENDS, *ACCEPTED]


def _check_corpus() -> None:
    names = [case.name for case in CORPUS]
    duplicates = {name for name in names if names.count(name) > 1}
    assert not duplicates, f"case names must be unique: {sorted(duplicates)}"
    for case in CORPUS:
        assert (case.outcome is Outcome.ANSWERED) == (case.expected.status == 200), case.name


_check_corpus()


# -- spellings of the endpoint's path --------------------------------------------------
#
# Every spelling a common server framework could route to its /v1/embeddings handler
# (measured: uvicorn and werkzeug decode `%2F` before routing, so FastAPI and Flask
# serve `/v1%2Fembeddings` from it; FastAPI redirects `/v1/embeddings/` to it; Express
# matches case-insensitively and ignores a trailing slash), and the encodings Envoy
# normalises. With `extproc run --legacy`, each must either go through the contract
# or be refused with a 404 envelope: never reach the legacy server (or the upstream)
# as sent. tests/test_path_spellings.py sends each over HTTP/1.1 and h2c, in both
# Envoy shapes and in the Istio and Envoy Gateway shapes.


class PathOutcome(enum.Enum):
    CONTRACT = "contract"  # the upstream gets the rewritten request at /v1/embeddings
    NOT_FOUND = "not_found"  # 404 `unknown_url` envelope, nobody sees the request


@dataclass(frozen=True)
class PathSpelling:
    target: str  # the request target as sent (HTTP/1.1) or `:path` (h2c)
    outcome: PathOutcome
    # The absolute form (`POST http://host/...`) exists in HTTP/1.1 only.
    http1_only: bool = False


_C, _404 = PathOutcome.CONTRACT, PathOutcome.NOT_FOUND
PATH_SPELLINGS: Final = [
    PathSpelling("/v1/embeddings", _C),
    PathSpelling("/embeddings", _C),
    # `%2F`/`%5C` decoded (UNESCAPE_AND_FORWARD), then normalised like the rest.
    PathSpelling("/v1%2Fembeddings", _C),
    PathSpelling("/v1%2fembeddings", _C),
    PathSpelling("/%76%31%2Fembeddings", _C),
    PathSpelling("/v1%2F%65mbeddings", _C),
    PathSpelling("/v1%2F%2E%2Fembeddings", _C),
    PathSpelling("/v1%5Cembeddings", _C),
    PathSpelling("/v1%5cembeddings", _C),
    # normalize_path: dot segments, `\` as `/`, percent-encoded unreserved characters.
    PathSpelling("/v1\\embeddings", _C),
    PathSpelling("//v1//embeddings", _C),
    PathSpelling("/v1/./embeddings", _C),
    PathSpelling("/v1/x/../embeddings", _C),
    PathSpelling("/v1/%2e/embeddings", _C),
    PathSpelling("/%65mbeddings", _C),
    PathSpelling("/v1/embeddings?x=1", _C),
    PathSpelling("http://gw/v1/embeddings", _C, http1_only=True),
    PathSpelling("http://gw/v1%2Fembeddings", _C, http1_only=True),
    # No such endpoint: another case (FastAPI's routes are case-sensitive, Express's
    # are not), `;params`, a path below it (FastAPI redirects `/v1/embeddings/` to the
    # endpoint), an escape Envoy does not decode.
    PathSpelling("/V1/EMBEDDINGS", _404),
    PathSpelling("/v1/Embeddings", _404),
    PathSpelling("/v1/embeddings;x", _404),
    PathSpelling("/v1/embeddings%3Bx", _404),
    PathSpelling("/v1/embeddings/", _404),
    PathSpelling("/v1/embeddings%2F", _404),
    PathSpelling("/v1/embeddings%5C", _404),
    PathSpelling("/embeddings/x", _404),
    # Encoded twice: Envoy decodes once (a second pass would make `%252F` a `/`), and
    # a server behind it that decoded again would route it to the endpoint.
    PathSpelling("/v1%252Fembeddings", _404),
    PathSpelling("/v1%252fembeddings", _404),
    PathSpelling("/v1%255Cembeddings", _404),
    PathSpelling("/%2576%2531%252Fembeddings", _404),
    PathSpelling("/v1%25252Fembeddings", _404),
]

# Other paths: the legacy server's (with --legacy), and what it receives for each.
# A `%2F` is decoded once on the way (UNESCAPE_AND_FORWARD), as uvicorn would decode it
# anyway: FastAPI routes `/v1/models/{model:path}` alike on both spellings.
LEGACY_PATHS: Final = {
    "/v1/rerank": "/v1/rerank",
    "/v1/rerank?top_n=2": "/v1/rerank?top_n=2",
    "/v1/models": "/v1/models",
    "/v1/models/Qwen%2FQwen3-Embedding-0.6B": "/v1/models/Qwen/Qwen3-Embedding-0.6B",
    "/v1/models/Qwen/Qwen3-Embedding-0.6B": "/v1/models/Qwen/Qwen3-Embedding-0.6B",
    "/v1/embeddingsx": "/v1/embeddingsx",
    "/v1/embeddings_v2": "/v1/embeddings_v2",
    "/v2/embeddings": "/v2/embeddings",
    "/v1/files/a%252Fb": "/v1/files/a%252Fb",
}
