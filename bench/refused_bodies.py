"""Native memory after multi-megabyte bodies the server refuses, without Envoy.

Starts the real `extproc serve` (shipped Qwen3 policy) on 127.0.0.1 and, round after
round, sends ``--per-round`` simultaneous one-message streams, each a request body
the server answers 413 (``--body oversize``: 9 MiB, over ``max_request_bytes``,
refused before parsing; ``--body word``: 8 MB holding one 8 MB "word", parsed and
refused after its first 256 KiB found no place to cut; two at a time fit the
default admission budget, so some get a 503). Prints the server's VmRSS
after each round, settled for a second, so the growth per round can be read.

``--malloc-env NAME=VALUE`` (repeatable) starts the server with glibc malloc
tunables in its environment (``MALLOC_MMAP_THRESHOLD_=1048576``,
``MALLOC_ARENA_MAX=2``): the way to compare allocator settings on an unchanged
server (glibc reads them at start, as mallopt() would set them).

    .venv/bin/python -m bench.refused_bodies --rounds 12 --body oversize
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections import Counter

import grpc
import orjson
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from google.protobuf import struct_pb2

from bench.processes import lone_server
from bench.workloads import MODEL
from testing_support.processes import free_port, rss_mb

MiB = 1024 * 1024


def refused_body(kind: str) -> bytes:
    if kind == "oversize":
        return orjson.dumps({"model": MODEL, "input": "x" * (9 * MiB)})
    return orjson.dumps({"model": MODEL, "input": "x" * 8_000_000})


def body_message(body: bytes) -> ep.ProcessingRequest:
    message = ep.ProcessingRequest(request_body=ep.HttpBody(body=body, end_of_stream=True))
    attributes = struct_pb2.Struct()
    attributes.update({"request.headers['content-type']": "application/json", "request.id": "x"})
    message.attributes["envoy.filters.http.ext_proc"].CopyFrom(attributes)
    return message


async def drive(
    port: int, pid: int, body: bytes, rounds: int, per_round: int, *, answers: Counter[int]
) -> list[float]:
    message = body_message(body)
    limit = len(body) + MiB
    options = [("grpc.max_send_message_length", limit)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        await asyncio.wait_for(channel.channel_ready(), 120)
        stub = ep_grpc.ExternalProcessorStub(channel)

        async def one() -> int:
            call = stub.Process(metadata=(("x-embgw-one-message", "1"),), timeout=60)
            await call.write(message)
            reply = await call.read()
            await call.done_writing()
            return int(reply.immediate_response.status.code)

        await asyncio.sleep(1)
        samples = [rss_mb(pid)]
        print(f"idle {samples[0]:.0f} MB", flush=True)
        for k in range(1, rounds + 1):
            # 413; or 503 when the admission budget holds fewer of them at once
            answers.update(await asyncio.gather(*(one() for _ in range(per_round))))
            await asyncio.sleep(1)
            samples.append(rss_mb(pid))
            print(f"round {k:>3}: {samples[-1]:.0f} MB", flush=True)
        return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--per-round", type=int, default=4)
    parser.add_argument("--body", choices=["oversize", "word"], default="oversize")
    parser.add_argument("--malloc-env", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    env = dict(os.environ)
    env.update(item.split("=", 1) for item in args.malloc_env)
    port = free_port()
    answers: Counter[int] = Counter()
    with lone_server(port, env) as server:
        started = time.monotonic()
        samples = asyncio.run(
            drive(
                port,
                server.process.pid,
                refused_body(args.body),
                args.rounds,
                args.per_round,
                answers=answers,
            )
        )
    growth = (samples[-1] - samples[1]) / max(len(samples) - 2, 1)
    print(
        f"{args.body} x {args.per_round} per round, {args.rounds} rounds "
        f"({', '.join(args.malloc_env) or 'no malloc env'}): "
        f"idle {samples[0]:.0f} MB, after round 1 {samples[1]:.0f} MB, "
        f"after round {args.rounds} {samples[-1]:.0f} MB "
        f"({growth:+.1f} MB a round after the first) in {time.monotonic() - started:.0f} s; "
        f"answers {dict(sorted(answers.items()))}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
