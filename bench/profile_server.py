"""Where the ext_proc server's own Python time goes, per request, without gRPC.

    .venv/bin/python -m bench.profile_server [--rounds 25] [--top 12]

Feeds the benchmark's requests to the real server code in this process, with the
shipped Qwen3 policy and its real tokenizer: (a) the seed's batch of 8 documents, (b)
the same plus ``input_type: "query"`` and ``dimensions: 256``, answered by the
instant upstream's 8 x 1,024-d base64 body (``bench/upstream.py``). Each request as
envoy/standalone.yaml sends it: the request body with its attributes, then for (b)
the response body with the status as an attribute, on the one-stream route (the
stream's gRPC metadata says so).

Prints, in microseconds per request (the best of ``--rounds`` rounds of 200, so
other work on the machine inflates it least):

- ``handle``: ``ExtProcStream.handle``, the state machine and the core;
- ``servicer``: ``ExternalProcessor.Process`` around it (admission, metrics, stream
  end), driven by a stand-in for grpc.aio's iterator and context (a tuple of gRPC
  metadata, no network);
- the floor: ``bench/floor_processor.py``'s ``Process`` on the same messages;
- then the top functions of a cProfile of the servicer by own time (cProfile's
  overhead inflates these: compare them with each other).

What it cannot show is gRPC's and asyncio's own share of a real stream (the floor
rows of ``python -m bench.run`` measure that); ``py-spy record --native`` on a running
``extproc serve`` does (bench/README.md). Runs against whatever ``extproc`` package
Python imports, so ``PYTHONPATH=/path/to/other/checkout`` profiles another version.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from bench.floor_processor import FloorProcessor
from bench.upstream import SMALL_BATCH, embeddings_body
from bench.workloads import MODEL, POLICY, request_body
from extproc.service.contract_loading import load_contract
from extproc.service.metrics import process_metrics
from extproc.service.policy_file import load_policy_file
from extproc.service.reload import ContractHolder
from extproc.service.servicer import ExternalProcessor, stream_shape
from extproc.service.stream import ExtProcStream
from testing_support.qwen import qwen_tokenizer_dir

ATTRIBUTES = "envoy.filters.http.ext_proc"
ITERATIONS = 200
ONE_MESSAGE = (("x-embgw-one-message", "1"),)
ON_STREAM = (*ONE_MESSAGE, ("x-embgw-response-on-stream", "1"))


def _message(kind: str, body: bytes, attributes: dict[str, str]) -> ep.ProcessingRequest:
    message = ep.ProcessingRequest()
    part = getattr(message, kind)
    part.body = body
    part.end_of_stream = True
    message.attributes[ATTRIBUTES].update(attributes)
    return message


def messages() -> dict[str, list[ep.ProcessingRequest]]:
    request = {"request.headers['content-type']": "application/json", "request.id": "bench"}
    status = {"response.code": "200", "response.code_details": "via_upstream"}
    plain = _message("request_body", request_body("plain", SMALL_BATCH), request)
    rewrite = _message("request_body", request_body("rewrite", SMALL_BATCH), request)
    answer = _message("response_body", embeddings_body(SMALL_BATCH, "base64"), status)
    return {"a": [plain], "b": [rewrite, answer]}


class _Context:
    """What Process reads of grpc.aio's ServicerContext: the stream's gRPC metadata."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


async def _requests(sequence: Sequence[ep.ProcessingRequest]) -> AsyncIterator[Any]:
    for message in sequence:
        yield message


def _best(rounds: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(rounds))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=25, help="rounds of 200 (best kept)")
    parser.add_argument("--top", type=int, default=12, help="functions listed per profile")
    args = parser.parse_args(argv)

    policy = load_policy_file(POLICY, tokenizer_overrides={MODEL: qwen_tokenizer_dir()})
    contract = load_contract(policy)
    sequences = messages()
    contexts = {"a": _Context(ONE_MESSAGE), "b": _Context(ON_STREAM)}
    shapes = {
        kind: stream_shape(context.invocation_metadata()) for kind, context in contexts.items()
    }
    metrics = process_metrics().streams
    servicer = ExternalProcessor(ContractHolder(contract), metrics)
    floor = FloorProcessor()

    def handle(kind: str) -> float:
        started = time.perf_counter()
        for _ in range(ITERATIONS):
            stream = ExtProcStream(contract, shapes[kind], metrics)
            for message in sequences[kind]:
                stream.handle(message)
        return (time.perf_counter() - started) / ITERATIONS * 1e6

    async def drive(processor: Any, kind: str) -> float:
        started = time.perf_counter()
        for _ in range(ITERATIONS):
            async for _reply in processor.Process(_requests(sequences[kind]), contexts[kind]):
                pass
        return (time.perf_counter() - started) / ITERATIONS * 1e6

    async def measure() -> None:
        print("us per request (best round)   handle  servicer  floor")
        for kind, label in (("a", "(a) no rewrite"), ("b", "(b) full rewrite")):
            times = {"handle": 1e9, "servicer": 1e9, "floor": 1e9}
            for _ in range(args.rounds):
                times["handle"] = min(times["handle"], handle(kind))
                times["servicer"] = min(times["servicer"], await drive(servicer, kind))
                times["floor"] = min(times["floor"], await drive(floor, kind))
            print(
                f"  {label:27s} {times['handle']:7.1f} {times['servicer']:9.1f}"
                f" {times['floor']:6.1f}"
            )

    asyncio.run(measure())

    for kind, label in (("a", "(a) no rewrite"), ("b", "(b) full rewrite")):
        rounds = 5
        profile = cProfile.Profile()
        for _ in range(rounds):
            profile.runcall(asyncio.run, drive(servicer, kind))
        print(f"\ncProfile, servicer {label}: own time, us per request (with cProfile's cost)")
        for line in top_functions(profile, ITERATIONS * rounds, args.top):
            print(line)


def top_functions(profile: cProfile.Profile, requests: int, top: int) -> list[str]:
    stats = pstats.Stats(profile, stream=io.StringIO())
    table: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    rows = sorted(table.items(), key=lambda item: item[1][2], reverse=True)
    lines = []
    for (filename, line, name), (_, ncalls, tottime, *_rest) in rows[:top]:
        where = f"{filename.rsplit('/', 1)[-1]}:{line}" if filename != "~" else ""
        per_request = tottime / requests * 1e6
        lines.append(f"  {per_request:7.1f}  {ncalls / requests:5.1f} calls  {where}({name})")
    return lines


if __name__ == "__main__":
    main()
