"""A tiny read-only HTTP/1.1 server for ``/summary``, ``/metrics`` and ``/healthz``.

GET only, one request per connection, bounded reads (header size, time): enough
for Prometheus and ``extproc shadow-report`` without another dependency.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final
from urllib.parse import parse_qs, urlsplit

MAX_HEADER_LINES: Final = 100
READ_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True)
class HttpReply:
    status: int
    content_type: str
    body: bytes


Handler = Callable[[str, dict[str, str]], Awaitable[HttpReply]]


async def start_http(host: str, port: int, handler: Handler) -> asyncio.Server:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            reply = await _answer(reader, handler)
            head = (
                f"HTTP/1.1 {reply.status} {HTTPStatus(reply.status).phrase}\r\n"
                f"Content-Type: {reply.content_type}\r\n"
                f"Content-Length: {len(reply.body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode("latin-1") + reply.body)
            await writer.drain()
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), READ_TIMEOUT_S)

    return await asyncio.start_server(serve, host, port, limit=16 * 1024)


async def _answer(reader: asyncio.StreamReader, handler: Handler) -> HttpReply:
    async with asyncio.timeout(READ_TIMEOUT_S):
        try:
            request_line = (await reader.readline()).decode("latin-1")
            for _ in range(MAX_HEADER_LINES):
                if (await reader.readline()) in (b"\r\n", b"\n", b""):
                    break
            else:
                return _text(431, "headers too long")
        except ValueError:  # a line over the stream's limit
            return _text(431, "headers too long")
    parts = request_line.split()
    if len(parts) != 3:
        return _text(400, "bad request line")
    method, target, _ = parts
    if method != "GET":
        return _text(405, "GET only")
    url = urlsplit(target)
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    return await handler(url.path, query)


def _text(status: int, message: str) -> HttpReply:
    return HttpReply(status, "text/plain; charset=utf-8", f"{message}\n".encode())
