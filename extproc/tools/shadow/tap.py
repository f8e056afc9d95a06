"""The tap stream: what Envoy's observability-mode ext_proc filter sends, per request.

Rules (Envoy 1.40, verified against a live Envoy; docs/shadow.md, "How it works"):

1. The tap filter runs with ``observability_mode: true``: Envoy sends and never
   waits for a reply, so nothing is ever answered on this stream.
2. Per HTTP request, in order: request_headers (``x-request-id``, ``:path``), request_body
   chunks (STREAMED; the last one has ``end_of_stream``, often empty),
   response_headers (``:status``, and ``x-envoy-upstream-service-time``: Envoy's
   own measure of the upstream, immune to the comparator's load), response_body chunks ending with
   ``end_of_stream``. A bodyless response ends at its headers' ``end_of_stream``.
3. The half is complete at the response's end of stream: Envoy keeps the gRPC
   stream open for a few seconds more (deferred close), so the stream's own end
   is not waited for.
4. Bodies are kept up to ``max_body_bytes`` each; beyond that the half is
   abandoned (``too_large``). A stream that ends before the response does
   (client gone, reset) yields nothing (``incomplete``), nor does one without a
   request id (``no_request_id``).

Sans-I/O: :meth:`TapStream.feed` takes a message and the time, and returns a
:class:`RawHalf` once the exchange is complete.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from extproc.tools.shadow.half import RawHalf, Role

REQUEST_ID_HEADER = "x-request-id"
UPSTREAM_TIME_HEADER = "x-envoy-upstream-service-time"  # set by Envoy's router, in ms
ROLE_METADATA = "x-shadow-role"


class TapPhase(enum.Enum):
    REQUEST = "request"
    RESPONSE = "response"
    DONE = "done"  # half produced
    ABANDONED = "abandoned"  # too large, or no request id


@dataclass
class TapStream:
    role: Role
    max_body_bytes: int
    phase: TapPhase = TapPhase.REQUEST
    request_id: str = ""
    path: str = ""
    status: int = 0
    upstream_s: float | None = None
    problem: str = ""  # why the stream was abandoned
    started: float | None = None
    request_body: bytearray = field(default_factory=bytearray)
    response_body: bytearray = field(default_factory=bytearray)

    def feed(self, message: ep.ProcessingRequest, now: float) -> RawHalf | None:
        if self.phase in (TapPhase.DONE, TapPhase.ABANDONED):
            return None
        if self.started is None:
            self.started = now
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            headers = _headers(message.request_headers.headers)
            self.request_id = headers.get(REQUEST_ID_HEADER, "")
            self.path = headers.get(":path", "")
            if not self.request_id:
                self._abandon("no_request_id")
        elif kind == "request_body":
            self._append(self.request_body, message.request_body.body)
        elif kind == "response_headers":
            self.phase = TapPhase.RESPONSE
            headers = _headers(message.response_headers.headers)
            status = headers.get(":status", "")
            self.status = int(status) if status.isdigit() else 0
            upstream_ms = headers.get(UPSTREAM_TIME_HEADER, "")
            if upstream_ms.isdigit():
                self.upstream_s = int(upstream_ms) / 1000
            if message.response_headers.end_of_stream:
                return self._finish(now)
        elif kind == "response_body":
            self.phase = TapPhase.RESPONSE
            self._append(self.response_body, message.response_body.body)
            if message.response_body.end_of_stream:
                return self._finish(now)
        # trailers are never sent with the shipped configs; anything else is ignored
        return None

    @property
    def finished(self) -> bool:
        return self.phase in (TapPhase.DONE, TapPhase.ABANDONED)

    def _append(self, buffer: bytearray, chunk: bytes) -> None:
        if self.phase is TapPhase.ABANDONED:
            return
        if len(buffer) + len(chunk) > self.max_body_bytes:
            self._abandon("too_large")
            return
        buffer += chunk

    def _abandon(self, reason: str) -> None:
        self.phase = TapPhase.ABANDONED
        self.problem = reason
        self.request_body.clear()
        self.response_body.clear()

    def _finish(self, now: float) -> RawHalf | None:
        if self.phase is TapPhase.ABANDONED or not self.request_id:
            return None
        self.phase = TapPhase.DONE
        started = self.started if self.started is not None else now
        return RawHalf(
            role=self.role,
            request_id=self.request_id,
            request_body=bytes(self.request_body),
            status=self.status,
            response_body=bytes(self.response_body),
            latency_s=max(0.0, now - started),
            upstream_s=self.upstream_s,
            path=self.path,
        )


def _headers(headers: base_pb2.HeaderMap) -> dict[str, str]:
    return {
        h.key.lower(): (h.raw_value.decode("latin-1") if h.raw_value else h.value)
        for h in headers.headers
    }
