"""Native memory per ext_proc stream, as Envoy ends streams: the measurement behind
the server-ended streams (extproc/service/servicer.py, grpc/grpc#43360).

Starts the real `extproc serve` (shipped Qwen3 policy) on 127.0.0.1 and opens N streams
of one request-body message each, 16 at a time, ending each like Envoy does (half-close,
then reset). ``--mode envoy``: nothing tells the server the stream carries one message,
so the reset lands on a call the server has not finished. ``--mode one-message``: the
stream carries ``x-embgw-one-message: 1`` as envoy/standalone.yaml's filters do, and the
server ends it itself after its reply. Prints the server's VmRSS every N/5 streams.

Measured here (240,000 streams): envoy 115 MB flat to ~100k streams, then 128 MB
(~90 bytes per stream); one-message 113 MB from 48k to 240k.

    .venv/bin/python -m bench.stream_leak --mode envoy --streams 240000
"""

from __future__ import annotations

import argparse
import asyncio
import time

import grpc
import orjson
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from google.protobuf import struct_pb2

from bench.processes import lone_server
from bench.workloads import MODEL
from testing_support.processes import free_port, rss_mb

CONCURRENCY = 16


def body_message() -> ep.ProcessingRequest:
    body = orjson.dumps({"model": MODEL, "input": ["hello world"] * 8})
    message = ep.ProcessingRequest(request_body=ep.HttpBody(body=body, end_of_stream=True))
    attributes = struct_pb2.Struct()
    attributes.update({"request.headers['content-type']": "application/json", "request.id": "x"})
    message.attributes["envoy.filters.http.ext_proc"].CopyFrom(attributes)
    return message


async def drive(port: int, pid: int, mode: str, streams: int) -> None:
    message = body_message()
    metadata = (("x-embgw-one-message", "1"),) if mode == "one-message" else None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), 120)
        stub = ep_grpc.ExternalProcessorStub(channel)

        async def one() -> None:
            call = stub.Process(metadata=metadata, timeout=30)
            await call.write(message)
            await call.read()
            if mode == "one-message":
                await call.read()  # EOF: the server ended the call
            await call.done_writing()
            call.cancel()  # Envoy's reset

        for _ in range(300):  # warm-up
            await one()
        await asyncio.sleep(1)
        print(f"baseline {rss_mb(pid):.0f} MB", flush=True)
        rounds = max(streams // CONCURRENCY, 1)
        started = time.monotonic()
        for k in range(rounds):
            await asyncio.gather(*(one() for _ in range(CONCURRENCY)))
            if k % max(rounds // 5, 1) == 0:
                print(f"{k * CONCURRENCY:>8} streams  {rss_mb(pid):.0f} MB", flush=True)
        print(f"end {rss_mb(pid):.0f} MB after {time.monotonic() - started:.0f} s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["envoy", "one-message"], default="envoy")
    parser.add_argument("--streams", type=int, default=240_000)
    args = parser.parse_args()
    port = free_port()
    with lone_server(port) as server:
        asyncio.run(drive(port, server.process.pid, args.mode, args.streams))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
