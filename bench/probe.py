"""One request sent by hand before the load: is the answer right?"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from bench.envoy_admin import MSGS_SENT, Envoy


def probe(url: str, body: Path, inputs: int, dims: int) -> dict[str, Any]:
    """One request: 200 with the right number and size of vectors?"""
    request = urllib.request.Request(
        f"{url}/v1/embeddings",
        data=body.read_bytes(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            status, data = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, data = error.code, error.read()
    elapsed_ms = (time.perf_counter() - started) * 1000
    result: dict[str, Any] = {
        "status": status,
        "response_bytes": len(data),
        "ms": round(elapsed_ms, 2),
    }
    if status != 200:
        result["ok"] = False
        result["body"] = data[:600].decode(errors="replace")
        return result
    try:
        parsed = orjson.loads(data)
        vectors = [item["embedding"] for item in parsed["data"]]
        sizes = {len(v) for v in vectors}
        result["vectors"] = len(vectors)
        result["dimensions"] = sorted(sizes)
        result["ok"] = len(vectors) == inputs and sizes == {dims}
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        result["ok"] = False
        result["body"] = f"{exc}: {data[:300].decode(errors='replace')}"
    return result


def probe_through(envoy: Envoy, url: str, body: Path, inputs: int, dims: int) -> dict[str, Any]:
    """probe() through an Envoy, with the exact count of ext_proc messages it took
    (nothing else is in flight)."""
    before = envoy.stats().get(MSGS_SENT, 0)
    result = probe(url, body, inputs, dims)
    result["ext_proc_msgs"] = envoy.stats().get(MSGS_SENT, 0) - before
    return result
