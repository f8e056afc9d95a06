"""The benchmark's library floor (case L) does the shipped gateway's body work.

L's figures bound what cutting the server's own Python can reach only if it does the
same work as the server: the same new request body for the upstream (apart from the
instruction's words) and the same answer for the client (the same vectors, cut and
re-normalised, written as floats). Checked here against the real server code.
"""

from __future__ import annotations

import time

import numpy as np
import orjson

from bench.library_floor import CUT_DIMENSIONS, request_work, response_work
from bench.upstream import SMALL_BATCH, embeddings_body
from bench.workloads import REWRITE_DIMENSIONS, request_body
from extproc.core.contract import Contract
from extproc.core.request_rewrite import rewrite_request
from extproc.core.response_rewrite import rewrite_response


def test_the_cut_is_the_benchmarks() -> None:
    assert CUT_DIMENSIONS == REWRITE_DIMENSIONS


def test_request_work_is_the_servers_rewrite(qwen_contract: Contract) -> None:
    body = request_body("rewrite", SMALL_BATCH)
    forward = rewrite_request(
        body, qwen_contract.policy, qwen_contract.tokenizers, clock=time.monotonic
    )
    assert forward.upstream_body is not None
    server = orjson.loads(forward.upstream_body)
    library_body = request_work(body, rewrite=True)
    assert library_body is not None
    library = orjson.loads(library_body)
    assert set(library) == set(server)
    assert library["encoding_format"] == server["encoding_format"] == "base64"
    texts = orjson.loads(body)["input"]
    for sent, mine, original in zip(server["input"], library["input"], texts, strict=True):
        assert sent.endswith(original) and mine.endswith(original)
        assert len(sent) > len(original) and len(mine) > len(original)  # an instruction each


def test_a_plain_request_is_passed_on(qwen_contract: Contract) -> None:
    body = request_body("plain", SMALL_BATCH)
    forward = rewrite_request(
        body, qwen_contract.policy, qwen_contract.tokenizers, clock=time.monotonic
    )
    assert forward.upstream_body is None
    assert request_work(body, rewrite=False) is None


def test_response_work_is_the_servers_answer(qwen_contract: Contract) -> None:
    request = request_body("rewrite", SMALL_BATCH)
    plan = rewrite_request(
        request, qwen_contract.policy, qwen_contract.tokenizers, clock=time.monotonic
    ).plan
    answer = embeddings_body(SMALL_BATCH, "base64")
    server = rewrite_response(plan, 200, answer)
    assert server is not None and server.status == 200
    mine, theirs = orjson.loads(response_work(answer)), orjson.loads(server.body)
    assert set(mine) == set(theirs)
    assert len(mine["data"]) == len(theirs["data"]) == SMALL_BATCH
    for a, b in zip(mine["data"], theirs["data"], strict=True):
        assert a["index"] == b["index"]
        ours, gateway = np.asarray(a["embedding"]), np.asarray(b["embedding"])
        assert ours.shape == gateway.shape == (CUT_DIMENSIONS,)
        np.testing.assert_allclose(ours, gateway, rtol=0, atol=1e-6)
        assert abs(float(np.linalg.norm(ours)) - 1.0) < 1e-5
