"""Compressed request bodies through `extproc run` (envoy/standalone.yaml): what decoding costs
(docs/operations.md).

For a seed-sized batch (8 documents of 400 characters, answered 200 by the fake Dynamo
upstream) and a bulk one (2,048 of 1,000: ~2 MB, naming a model the gateway does not
serve, so that it is answered 404 right after it was read and parsed: what is timed
is reading, decoding and parsing, not the upstream), each sent plain, gzip and br: the
bytes sent, the median and p90 time of a request through Envoy and the ext_proc
server (one keep-alive connection, one request at a time), Envoy's own count of the
bytes it decoded and of the ext_proc messages it sent per request.
Then Envoy's memory for the largest decoding a request can cause (a gzip and a br
decompression bomb at the size-as-sent caps) against a plain body of the same decoded
size, each on a fresh gateway (the peak RSS, VmHWM, only grows).

    .venv/bin/python bench/request_decoding.py [--repeat 31]

The text is made-up English (common words, Zipf-weighted, seeded): it compresses
about as prose does (gzip ~3x), unlike a repeated sentence.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import random
import re
import statistics
import sys
import tempfile
import time
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path

import brotli
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testing_support.fake_upstream import FakeUpstream  # noqa: E402
from testing_support.gateway import Gateway, start_gateway  # noqa: E402
from testing_support.qwen import QWEN_MODEL, SHIPPED_QWEN_POLICY, qwen_tokenizer_dir  # noqa: E402

COMMON_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "so no will can more about said what out up some into them than only other new time "
    "could these two may first then do any like my now over such our man me even most made "
    "after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another "
    "know while last might us great old year off come since against go came right used take "
    "three capital city river country language history science energy market water system"
)
WORDS = tuple(COMMON_WORDS.split())


def english(chars: int, rng: random.Random) -> str:
    weights = [1.0 / (rank + 1) for rank in range(len(WORDS))]
    out: list[str] = []
    size = 0
    while size < chars:
        sentence = " ".join(rng.choices(WORDS, weights, k=rng.randint(6, 18)))
        sentence = sentence[0].upper() + sentence[1:] + rng.choice([". ", ". ", ", ", "; "])
        out.append(sentence)
        size += len(sentence)
    return "".join(out)[:chars]


def batch(docs: int, chars: int, model: str = QWEN_MODEL) -> bytes:
    rng = random.Random(docs * 100_003 + chars)
    return orjson.dumps({"model": model, "input": [english(chars, rng) for _ in range(docs)]})


CODERS: dict[str, Callable[[bytes], bytes]] = {
    "identity": lambda body: body,
    "gzip": lambda body: gzip.compress(body, 6),
    "br": lambda body: brotli.compress(body, quality=5),
}


def admin_stats(gateway: Gateway, pattern: str) -> dict[str, int]:
    port = re.search(r"admin 127\.0\.0\.1:(\d+)", gateway.ready_line)
    assert port is not None, gateway.ready_line
    url = f"http://127.0.0.1:{port[1]}/stats?filter={pattern}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {name: int(n) for name, n in re.findall(r"^(\S+): (\d+)$", text, re.M)}


def envoy_pid(gateway: Gateway) -> int:
    found = re.search(r"envoy pid (\d+)", gateway.ready_line)
    assert found is not None, gateway.ready_line
    return int(found[1])


def rss_mb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def post(conn: http.client.HTTPConnection, body: bytes, coding: str) -> tuple[int, bytes]:
    headers = {"content-type": "application/json"}
    if coding != "identity":
        headers["content-encoding"] = coding
    conn.request("POST", "/v1/embeddings", body, headers)
    answer = conn.getresponse()
    return answer.status, answer.read()


def start(upstream: FakeUpstream, folder: Path) -> Gateway:
    return start_gateway(
        upstream.url,
        folder,
        config=SHIPPED_QWEN_POLICY,
        tokenizer_overrides=f"{QWEN_MODEL}={qwen_tokenizer_dir()}",
        extra_args=["--envoy-template", str(REPO / "envoy" / "standalone.yaml")],
    )


def latencies(upstream: FakeUpstream, folder: Path, repeat: int) -> None:
    gateway = start(upstream, folder)
    try:
        host, port = gateway.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        print(
            "| body | coding | bytes sent | answer | median ms | p90 ms | decoded bytes/request |"
            " ext_proc messages/request |"
        )
        print("|---|---|---|---|---|---|---|---|")
        bodies = (
            ("8 x 400 chars", batch(8, 400)),
            ("2,048 x 1,000 chars, unknown model", batch(2048, 1000, "not-served")),
        )
        for name, body in bodies:
            for coding, coder in CODERS.items():
                sent = coder(body)
                for _ in range(3):  # warm
                    post(conn, sent, coding)
                before_msgs = sum(admin_stats(gateway, "ext_proc.stream_msgs_sent").values())
                before = admin_stats(gateway, "decompressor.*request.total_uncompressed_bytes")
                times, statuses = [], set()
                for _ in range(repeat):
                    started = time.perf_counter()
                    status, _ = post(conn, sent, coding)
                    times.append((time.perf_counter() - started) * 1000)
                    statuses.add(str(status))
                after = admin_stats(gateway, "decompressor.*request.total_uncompressed_bytes")
                msgs = sum(admin_stats(gateway, "ext_proc.stream_msgs_sent").values()) - before_msgs
                decoded = (sum(after.values()) - sum(before.values())) / repeat
                times.sort()
                p90 = times[int(0.9 * (len(times) - 1))]
                print(
                    f"| {name} ({len(body):,} B) | {coding} | {len(sent):,} | "
                    f"{'/'.join(sorted(statuses))} | "
                    f"{statistics.median(times):.1f} | {p90:.1f} | {decoded:,.0f} | "
                    f"{msgs / repeat:.2f} |"
                )
        conn.close()
    finally:
        gateway.stop()


def gzip_bomb(sent_bytes: int) -> bytes:
    head = batch(1, 40)[:-1]
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts, size = [packer.compress(head)], 0
    while size < sent_bytes - 4096:
        part = packer.compress(b" " * (1 << 20))
        parts.append(part)
        size += len(part)
    return b"".join([*parts, packer.compress(b"}"), packer.flush()])


def br_bomb(sent_bytes: int) -> bytes:
    head = batch(1, 40)[:-1]
    packer = brotli.Compressor(quality=1)
    parts, size = [packer.process(head)], 0
    while size < sent_bytes - 64:
        part = packer.process(b" " * 4096) + packer.flush()
        parts.append(part)
        size += len(part)
    return b"".join([*parts, packer.process(b"}"), packer.finish()])


def memory(upstream: FakeUpstream, folder: Path) -> None:
    plain_size = 20 * 1_310_000
    cases = [
        ("gzip bomb at the cap", "gzip", gzip_bomb(1_310_000)),
        ("br bomb at the cap", "br", br_bomb(262_000)),
        ("plain body, same decoded size", "identity", batch(1, 40)[:-1] + b" " * plain_size + b"}"),
    ]
    print()
    print(
        "| request (3 in a row, fresh gateway) | bytes sent | answers | ms each |"
        " Envoy RSS before -> peak (VmHWM) MB |"
    )
    print("|---|---|---|---|---|")
    for name, coding, body in cases:
        gateway = start(upstream, folder)
        try:
            pid = envoy_pid(gateway)
            host, port = gateway.url.removeprefix("http://").split(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=120)
            assert post(conn, batch(8, 400), "identity")[0] == 200
            before = rss_mb(pid, "VmRSS")
            statuses, times = [], []
            for _ in range(3):
                started = time.perf_counter()
                status, _ = post(conn, body, coding)
                times.append(f"{(time.perf_counter() - started) * 1000:.0f}")
                statuses.append(str(status))
            conn.close()
            peak = rss_mb(pid, "VmHWM")
            print(
                f"| {name} | {len(body):,} | {', '.join(statuses)} | {', '.join(times)} | "
                f"{before:.0f} -> {peak:.0f} |"
            )
        finally:
            gateway.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=31)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="bench-decoding-") as tmp,
        FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_tokenizer_dir()) as upstream,
    ):
        folder = Path(tmp)
        latencies(upstream, folder, args.repeat)
        memory(upstream, folder)


if __name__ == "__main__":
    main()
