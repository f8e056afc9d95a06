"""Runs last (file name): a real fault. With Dynamo's worker stopped, the frontend
answers 404 with an empty body; through the gateway that is a 5xx envelope with
`type: server_error`, never a 4xx that tells clients their request was wrong."""

from __future__ import annotations

import time

from testing_support.http import http
from testing_support.real_upstream import SERVED_MODEL, RealEnv, Stack
from tests.e2e.conftest import PLAIN_POLICY, minilm
from tests.harness import Gateways


def test_stopped_worker_is_a_5xx_not_a_4xx(dynamo: Stack, env: RealEnv, gateways: Gateways) -> None:
    gateway = gateways.shared(minilm(dynamo, PLAIN_POLICY, env))
    body = {"model": SERVED_MODEL, "input": ["still there?"]}
    assert gateway.embeddings(body).status == 200

    worker = next(p for p in dynamo.processes if p.name == "dynamo-worker")
    worker.stop()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the frontend notices the worker is gone
        models = http("GET", f"{dynamo.url}/v1/models").json().get("data", [])
        if not models:
            break
        time.sleep(1)
    reply = gateway.embeddings(body)
    assert 500 <= reply.status < 600, (reply.status, reply.body)
    error = reply.json()["error"]
    assert error["type"] == "server_error"
    assert set(error) == {"message", "type", "param", "code"}
