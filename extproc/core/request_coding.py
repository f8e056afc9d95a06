"""How a request body was coded when it was sent, and what the client is told when
it does not decode to a JSON object (sans-I/O).

envoy/standalone.yaml (and envoy/compose.yaml) decode gzip and br request bodies
with Envoy's decompressor filters before extproc.request sees them; their Lua filter
``request_coding`` reads each such body whole first and hands over, as dynamic
metadata (namespace ``embgw.request``), what the decoder removes or ignores: the
coding (``content_encoding``), the size as sent (``sent_bytes``) and, for gzip, the
stream's last 8 bytes (``gzip_trailer``, hex: the CRC-32 and the length of the data).

Envoy's decoders report no failure to anyone but their own counters: data that is
not in the coding decodes to nothing, a stream cut short or corrupt to a cut-off
body, one that expands past the decoder's bound (:data:`MAX_INFLATE_RATIO` times its
size as sent) is cut off there, and a gzip decoder stops after the first member
without checking its CRC-32 or length (bytes after it are dropped). What the gateway
can check is the decoded body: against its gzip trailer (so a gzip body is served
only as exactly what was compressed), its size, and as JSON. Each refusal names the
coding and the sizes: a client is not told that its JSON is broken when its
compression is, nor the other way round.

The one-filter shape (envoy/single-filter.yaml, the meshes) has no decoder; it
refuses compressed bodies from the request headers (request_headers.py).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from extproc.core.api_errors import ApiError, InvalidFieldError, MalformedBodyError, TooLargeError

METADATA_NAMESPACE: Final = "embgw.request"
# How many times its size as sent Envoy's decoder lets a body grow before it stops:
# gzip's `max_inflate_ratio` in envoy/standalone.yaml, brotli's fixed in Envoy 1.40
# (tests/test_deploy_artifacts.py holds the YAML to these). The body reaches the
# decoder in one piece (`request_coding` holds it until it is whole), so the bound
# applies to the whole body, and a body decoded to more than this was cut off.
MAX_INFLATE_RATIO: Final = {"gzip": 20, "br": 100}
DECODED_CODINGS: Final = frozenset(MAX_INFLATE_RATIO)
INVALID_COMPRESSED_BODY: Final = "invalid_compressed_body"
_GZIP_TRAILER_BYTES: Final = 8


@dataclass(frozen=True)
class BodyCoding:
    """The body was sent in ``coding`` (``sent_bytes`` long, when known) and decoded
    by Envoy before it reached the gateway; ``gzip_trailer`` is a gzip stream's last
    8 bytes as sent."""

    coding: str
    sent_bytes: int | None = None
    gzip_trailer: bytes | None = None

    @classmethod
    def from_metadata(cls, fields: Mapping[str, str]) -> BodyCoding | None:
        """From the ``embgw.request`` metadata fields; None unless they name a coding
        Envoy decodes (anything else never reached a decoder)."""
        coding = fields.get("content_encoding", "").strip(" \t").lower()
        if coding not in DECODED_CODINGS:
            return None
        length = fields.get("sent_bytes", "")
        sent = int(length) if length.isascii() and length.isdigit() and len(length) < 20 else None
        trailer = None
        if coding == "gzip":
            try:
                trailer = bytes.fromhex(fields.get("gzip_trailer", ""))
            except ValueError:
                trailer = None
            if trailer is not None and len(trailer) != _GZIP_TRAILER_BYTES:
                trailer = None
        return cls(coding, sent, trailer)

    def check(self, body: bytes, limit: int) -> None:
        """Refuse a decoded ``body`` that the decoder cut off at its bound, that is over
        the body ``limit``, or (gzip) that is not what the stream's trailer says was
        compressed."""
        size = len(body)
        ratio = MAX_INFLATE_RATIO[self.coding]
        if self.sent_bytes is not None and size > ratio * self.sent_bytes:
            raise TooLargeError(
                f"The request body ({self._sent()}) expands more than {ratio}-fold, past "
                "what the gateway decodes (a decompression bomb, or a very repetitive "
                "body); send it uncompressed."
            )
        if size > limit:
            raise TooLargeError(
                f"Request body is {size} bytes once decoded ({self._sent()}); the limit is {limit}."
            )
        if self.gzip_trailer is not None:
            crc, length = struct.unpack("<II", self.gzip_trailer)
            if zlib.crc32(body) != crc or size % 2**32 != length:
                raise InvalidFieldError(
                    f"The request body ({self._sent()}) decoded to {_bytes(size)} that do not "
                    "match the CRC-32 and length at the end of the gzip data: it is not gzip, "
                    "is corrupt or cut short, or holds more than one gzip member or bytes "
                    "after it (the gateway decodes one member).",
                    code=INVALID_COMPRESSED_BODY,
                )

    def empty(self, size: int) -> ApiError:
        """The decoded body holds nothing (``size`` bytes of whitespace at most)."""
        what = "nothing" if size == 0 else f"{_bytes(size)} of whitespace"
        if self.gzip_trailer is not None:  # checked: the gzip data holds just that
            return MalformedBodyError(
                f"The request body ({self._sent()}) holds {what} once decoded; send a JSON object.",
                code="invalid_json",
            )
        return InvalidFieldError(
            f"The request body ({self._sent()}) decoded to {what}: it is not {self.coding} "
            "data, or holds no JSON.",
            code=INVALID_COMPRESSED_BODY,
        )

    def not_json(self, size: int, detail: str) -> ApiError:
        """The decoded body (``size`` bytes) is not JSON: ``detail`` is the parser's."""
        if self.gzip_trailer is not None:  # checked: the JSON itself is malformed
            return MalformedBodyError(
                f"The request body ({self._sent()}) is not valid JSON once decoded: {detail}.",
                code="invalid_json",
            )
        return InvalidFieldError(
            f"The request body ({self._sent()}) decoded to {_bytes(size)}, not valid JSON "
            f"({detail}): the {self.coding} data is corrupt or cut short, or holds "
            "malformed JSON.",
            code=INVALID_COMPRESSED_BODY,
        )

    def _sent(self) -> str:
        size = "" if self.sent_bytes is None else f", {_bytes(self.sent_bytes)}"
        return f"sent with Content-Encoding: {self.coding}{size}"


def _bytes(n: int) -> str:
    return "1 byte" if n == 1 else f"{n} bytes"
