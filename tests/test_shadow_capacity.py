"""How many pairs per second one comparator sustains on this machine (printed).

The comparator runs as `extproc shadow-compare` in its own process (started as
tests/test_shadow_envoy.py starts it); this process
plays Envoy: for each request it opens a baseline and a candidate tap stream on one
HTTP/2 connection, as an Envoy worker does, and sends what an observability-mode tap
sends (request headers, the request body, response headers, the response body, all
STREAMED). The requests are the common case of the docs' measurements: batches of 8
documents, 1,024-d float answers (about 90 kB per answer). Bounded: PAIRS pairs,
CONCURRENCY requests in flight, every wait with a deadline.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import grpc
import numpy as np
import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from tests.harness import start_comparator

pytestmark = pytest.mark.alone  # the pairs per second one comparator sustains

PAIRS = 600
CONCURRENCY = 32
DIMS = 1024
BATCH = 8
DEADLINE_S = 120.0
CHUNK = 64 * 1024  # Envoy streams bodies in chunks of its buffer size


def _headers(**values: str) -> ep.HttpHeaders:
    return ep.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
        )
    )


def _exchange(request_id: str, request: bytes, response: bytes) -> list[ep.ProcessingRequest]:
    messages = [
        ep.ProcessingRequest(request_headers=_headers(**{"x-request-id": request_id})),
        ep.ProcessingRequest(request_body=ep.HttpBody(body=request, end_of_stream=True)),
        ep.ProcessingRequest(
            response_headers=_headers(**{":status": "200", "x-envoy-upstream-service-time": "9"})
        ),
    ]
    for start in range(0, len(response), CHUNK):
        chunk = response[start : start + CHUNK]
        last = start + CHUNK >= len(response)
        messages.append(
            ep.ProcessingRequest(response_body=ep.HttpBody(body=chunk, end_of_stream=last))
        )
    return messages


def _bodies(seed: int) -> tuple[bytes, bytes]:
    rows = np.random.default_rng(seed).standard_normal((BATCH, DIMS)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    request = orjson.dumps({"model": "m", "input": [f"document {i} " * 40 for i in range(BATCH)]})
    response = orjson.dumps(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": row.tolist()}
                for i, row in enumerate(rows)
            ],
            "usage": {"prompt_tokens": 8 * 90, "total_tokens": 8 * 90},
        }
    )
    return request, response


async def _send_pairs(port: int) -> float:
    """Send PAIRS pairs of tap streams; the seconds it took to send them all."""
    bodies = [_bodies(seed) for seed in range(8)]
    limit = asyncio.Semaphore(CONCURRENCY)
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)]
    ) as channel:
        process = channel.stream_stream(
            "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
            request_serializer=ep.ProcessingRequest.SerializeToString,
            response_deserializer=ep.ProcessingResponse.FromString,
        )

        async def stream(role: str, messages: list[ep.ProcessingRequest]) -> None:
            call = process(metadata=(("x-shadow-role", role),))
            for message in messages:
                await call.write(message)
            await call.done_writing()
            async for _ in call:  # the comparator never answers
                pass

        async def pair(i: int) -> None:
            async with limit:
                request, response = bodies[i % len(bodies)]
                messages = _exchange(f"req-{i}", request, response)
                await asyncio.gather(stream("baseline", messages), stream("candidate", messages))

        started = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(pair(i) for i in range(PAIRS))), DEADLINE_S)
        return time.perf_counter() - started


def test_pairs_per_second_one_comparator_sustains(tmp_path: Path) -> None:
    comparator = start_comparator(tmp_path)
    try:
        started = time.perf_counter()
        sent_s = asyncio.run(_send_pairs(comparator.grpc_port))
        deadline = time.monotonic() + DEADLINE_S
        while (summary := comparator.summary())["pairs"] < PAIRS:
            assert time.monotonic() < deadline, summary["halves"]
            time.sleep(0.05)
        took = time.perf_counter() - started
    finally:
        comparator.process.stop()
    assert summary["pairs"] == PAIRS and summary["expired_halves"] == 0
    assert summary["inputs"]["document"]["compared"] == PAIRS * BATCH
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\none comparator: {PAIRS / took:.0f} pairs/s ({PAIRS * BATCH / took:.0f} inputs/s; "
        f"{PAIRS} pairs of batch-{BATCH} {DIMS}-d float answers, {CONCURRENCY} in flight, "
        f"sent in {sent_s:.2f} s, all compared in {took:.2f} s; {os.cpu_count()} CPUs, "
        f"load average {load})"
    )
    # A floor far below the figure, so that only a comparator that stopped keeping
    # up (not a busy machine) fails here.
    assert PAIRS / took > 20
