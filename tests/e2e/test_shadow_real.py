"""Shadow mode on real models: the baseline is real vLLM presenting the legacy
contract (the gateway with the Matryoshka/`query:` policy in front of it), the
candidate is the real Dynamo 1.6.1 behind `extproc shadow`'s rewrite. With the same
policy on the candidate the comparator reports parity on real vectors; with a
policy that drops the query prompt (the seed's silent failure) it says not ready."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testing_support.http import http
from testing_support.processes import free_port
from testing_support.real_upstream import SERVED_MODEL, RealEnv, Stack
from tests.e2e.conftest import MATRYOSHKA_POLICY, PLAIN_POLICY, minilm
from tests.harness import Gateways

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def shadow(
    baseline: str, candidate: str, policy: Path, env: RealEnv, folder: Path
) -> Iterator[tuple[str, str]]:
    listen, summary = free_port(), free_port()
    log_path = folder / f"shadow-{listen}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "extproc",
                "shadow",
                "--baseline",
                baseline,
                "--candidate",
                candidate,
                "--listen",
                f"127.0.0.1:{listen}",
                "--http",
                f"127.0.0.1:{summary}",
                "--config",
                str(policy),
                "--tokenizer",
                f"{SERVED_MODEL}={env.model_dir}",
                "--ttl",
                "120",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 90
        while "extproc shadow ready" not in log_path.read_text(errors="replace"):
            assert process.poll() is None, log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, "shadow mode did not start"
            time.sleep(0.2)
        yield f"http://127.0.0.1:{listen}", f"http://127.0.0.1:{summary}"
    finally:
        process.terminate()
        process.wait(60)


def drive(url: str, *, with_dimensions: bool = True) -> int:
    docs = [
        json.loads(line)
        for line in (REPO / "extproc" / "data" / "corpus.jsonl").read_text().splitlines()
    ]
    texts = [d["text"] for d in docs if d["kind"] == "document"][:16]
    queries = [d["text"] for d in docs if d["kind"] == "query"]
    bodies = [
        {"model": SERVED_MODEL, "input": texts[:8]},
        {"model": SERVED_MODEL, "input": texts[8:16], "dimensions": 128},
        {"model": SERVED_MODEL, "input": queries, "input_type": "query"},
    ]
    if not with_dimensions:
        del bodies[1]
    for body in bodies:
        reply = http("POST", f"{url}/v1/embeddings", body)
        assert reply.status == 200, reply.body[:300]
    return len(bodies)


def wait_pairs(summary_url: str, pairs: int) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while True:
        summary: dict[str, object] = http("GET", f"{summary_url}/summary").json()
        text = json.dumps(summary)
        if f'"pairs": {pairs}' in text or time.monotonic() > deadline:
            return summary
        time.sleep(0.5)


def report(summary_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "extproc", "shadow-report", "--url", summary_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_shadow_parity_on_real_models(
    vllm: Stack,
    dynamo: Stack,
    env: RealEnv,
    e2e_dir: Path,
    gateways: Gateways,
) -> None:
    # real vLLM presenting the legacy contract
    legacy = gateways.shared(minilm(vllm, MATRYOSHKA_POLICY, env)).url

    with shadow(legacy, dynamo.url, MATRYOSHKA_POLICY, env, e2e_dir) as (url, summary):
        wait_pairs(summary, drive(url))
        ok = report(summary)
    print("\n[e2e shadow, rewrite on]\n" + ok.stdout[-3000:])
    assert ok.returncode == 0, ok.stdout + ok.stderr

    # The seed's silent failure: the candidate's rewrite drops the query prompt
    # (every answer is a 200; only the query vectors differ).
    with shadow(legacy, dynamo.url, PLAIN_POLICY, env, e2e_dir) as (url, summary):
        wait_pairs(summary, drive(url, with_dimensions=False))
        bad = report(summary)
    print("\n[e2e shadow, query prompt dropped]\n" + bad.stdout[-3000:])
    assert bad.returncode != 0, bad.stdout
    assert "not ready" in bad.stdout.lower()
