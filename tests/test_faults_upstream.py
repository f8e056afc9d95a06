"""Upstream faults through the real gateway: `extproc run` (ext_proc +
Envoy on envoy/standalone.yaml, ``--upstream-timeout 1``) in front of the scripted
raw-socket upstream of tests/faulty_upstream.py, one gateway for every case.

Each fault is met by two kinds of request:

- (a) ``rewrite``: ``dimensions: 256``. The plan rewrites the vectors, so the request
  takes standalone.yaml's rewrite route, where ``extproc.response`` sees the upstream's
  answer (extproc/core/response_rewrite.needs_response_body). Every fault must end as a
  5xx OpenAI envelope (502/503/504), never garbage and never a 200 with bad vectors.
- (b) ``plain``: no legacy field, nothing to rewrite. By design the response takes the
  route without a response ext_proc stage: Envoy passes the upstream's answer on (only
  upstream error statuses are enveloped, by ``custom_response``). What happens is
  measured and asserted as it is, where it is safe: a 5xx, a connection error or a
  cut body, or the upstream's own bytes unchanged (``PASS_THROUGH``: the gateway
  neither checks nor alters them). Those PASS_THROUGH rows are what the default
  gives (the policy option ``check_responses`` validates every answer instead); this
  test pins them down so a change is noticed, it does not endorse them.
- (c) ``query``: ``input_type: query``. The request is rewritten (the instruction is
  prepended) but the vectors are not, so its response takes the same route as (b)
  and meets every fault as (b) does.

Run with ``-s`` to see one line per case (status, code, time).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from http import client as http_client
from typing import Any, Final

import numpy as np
import orjson
import pytest

from testing_support.gateway import Gateway, GatewaySpec
from testing_support.http import envelope_error
from testing_support.qwen import QWEN_MODEL
from tests.faulty_upstream import FaultyUpstream, Script, Send, scripts
from tests.harness import Gateways

pytestmark = pytest.mark.alone  # a 1 s upstream timeout

UPSTREAM_TIMEOUT_S: Final = 1.0
SCRIPTS: Final = scripts(model=QWEN_MODEL, count=2, dim=1024, slow_seconds=5.0)

REWRITE: Final = {"model": QWEN_MODEL, "input": ["first text", "second text"], "dimensions": 256}
PLAIN: Final = {"model": QWEN_MODEL, "input": ["first text", "second text"]}
QUERY: Final = {**PLAIN, "input_type": "query"}
REQUESTS: Final[dict[str, dict[str, Any]]] = {"rewrite": REWRITE, "plain": PLAIN, "query": QUERY}
INSTRUCTION: Final = "Instruct: Given a web search query"

# What the client gets.
OK: Final = "ok"  # a 200 with valid vectors
CUT: Final = "cut"  # a connection error, or a 200 status line whose body never completes
PASS_THROUGH: Final = "pass-through"  # 200 with the upstream's bytes, unchecked, unchanged

# script -> ((a) rewrite route, (b) plain route; (c) as (b)): a status means that 5xx
# envelope.
EXPECTED: Final[dict[str, tuple[int | str, int | str]]] = {
    "ok": (OK, OK),
    "down": (503, 503),
    "reset": (503, 503),
    "close_no_answer": (503, 503),
    "not_http": (502, 502),
    "slow": (504, 504),
    "headers_then_close": (502, CUT),
    "mid_body_close": (502, CUT),
    "mid_body_reset": (502, CUT),
    "chunked_mid_body_close": (502, CUT),
    "truncated_json": (502, PASS_THROUGH),
    "wrong_dimension": (502, PASS_THROUGH),
    "nan_literal": (502, PASS_THROUGH),
    "nan_as_null": (502, PASS_THROUGH),
    "huge_number": (502, PASS_THROUGH),
    "nan_base64": (502, PASS_THROUGH),
    "wrong_count": (502, PASS_THROUGH),
    "non_json": (502, PASS_THROUGH),
    "index_duplicate": (502, PASS_THROUGH),
    "index_out_of_range": (502, PASS_THROUGH),
}


def test_every_script_has_an_expectation() -> None:
    assert set(EXPECTED) == set(SCRIPTS)


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultyUpstream]:
    with FaultyUpstream(SCRIPTS["ok"]) as faulty:
        yield faulty


@pytest.fixture(scope="module")
def gateway(upstream: FaultyUpstream, gateways: Gateways) -> Iterator[Gateway]:
    spec = GatewaySpec(upstream.url, args=("--upstream-timeout", f"{UPSTREAM_TIMEOUT_S:g}"))
    with gateways.own(spec) as gw:
        yield gw


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: no status line at all
    headers: dict[str, str]
    body: bytes
    error: str  # the client's exception, if the exchange failed
    seconds: float


def post(url: str, body: dict[str, Any], timeout: float = 15.0) -> Answer:
    """One request on its own connection; failures are reported, never raised."""
    host, port = url.split("/")[2].rsplit(":", 1)
    conn = http_client.HTTPConnection(host, int(port), timeout=timeout)
    started = time.monotonic()
    status: int | None = None
    headers: dict[str, str] = {}
    try:
        conn.request(
            "POST", "/v1/embeddings", orjson.dumps(body), {"content-type": "application/json"}
        )
        response = conn.getresponse()
        status = response.status
        headers = {k.lower(): v for k, v in response.getheaders()}
        return Answer(status, headers, response.read(), "", time.monotonic() - started)
    except (OSError, http_client.HTTPException) as error:
        return Answer(status, headers, b"", type(error).__name__, time.monotonic() - started)
    finally:
        conn.close()


def scripted_body(script: Script) -> bytes:
    """The body bytes the script sends after its response head."""
    sent = b"".join(getattr(step, "data", b"") for step in script.steps)
    return sent.partition(b"\r\n\r\n")[2]


def assert_envelope(answer: Answer, status: int) -> dict[str, Any]:
    assert answer.status == status and not answer.error, answer
    assert answer.headers.get("content-type", "").startswith("application/json"), answer
    error = envelope_error(answer.body)
    assert error["type"] == "server_error", error
    return error


def assert_valid_vectors(answer: Answer, size: int) -> None:
    assert answer.status == 200 and not answer.error, answer
    data = orjson.loads(answer.body)["data"]
    assert [item["index"] for item in data] == [0, 1]
    vectors = np.asarray([item["embedding"] for item in data], dtype=np.float64)
    assert vectors.shape == (2, size)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


CASES = [pytest.param(name, kind, id=f"{name}-{kind}") for name in EXPECTED for kind in REQUESTS]


@pytest.mark.parametrize(("name", "kind"), CASES)
def test_upstream_fault(gateway: Gateway, upstream: FaultyUpstream, name: str, kind: str) -> None:
    script = SCRIPTS[name]
    upstream.use(script)
    answer = post(f"{gateway.url}/v1/embeddings", REQUESTS[kind])
    expected = EXPECTED[name][0 if kind == "rewrite" else 1]
    code = ""
    if isinstance(expected, int):
        code = str(assert_envelope(answer, expected)["code"])
    elif expected == OK:
        assert_valid_vectors(answer, 256 if kind == "rewrite" else 1024)
    elif expected == CUT:
        # The 200 head was already on its way to the client when the upstream broke:
        # the client sees the body end early (or the connection go), never a whole body.
        assert answer.error in ("IncompleteRead", "RemoteDisconnected", "ConnectionResetError"), (
            answer
        )
        assert answer.status in (None, 200), answer
    else:
        assert expected == PASS_THROUGH
        # Unchecked: the client gets exactly the upstream's bytes, status and all.
        assert answer.status == 200 and not answer.error, answer
        assert answer.body == scripted_body(script), answer.body[:200]
    print(
        f"\n[fault] {name:24} {kind:8} -> {answer.status} {answer.error or code or expected} "
        f"in {answer.seconds:.2f} s"
    )

    # What reached the upstream: nothing when nothing listens; otherwise exactly the
    # one request (no retry), rewritten for (a) and (c), byte for byte the client's for (b).
    received = list(upstream.received)
    assert len(received) == (0 if not script.listening else 1), received
    for raw in received:
        sent = orjson.loads(raw.body)
        if kind == "rewrite":
            assert "dimensions" not in sent and sent["encoding_format"] == "base64", sent
        elif kind == "query":
            assert all(text.startswith(INSTRUCTION) for text in sent["input"]), sent
        else:
            assert raw.body == orjson.dumps(PLAIN)


# -- check_responses: the policy option that checks every 2xx ---------------------------------

# With `check_responses: true` the plain and query requests meet the faults as (a) does
# (every 2xx answer is parsed and checked), except that a good answer passes unchanged.
CHECKED: Final = {name: expected[0] for name, expected in EXPECTED.items()}


@pytest.fixture(scope="module")
def checking_gateway(upstream: FaultyUpstream, gateways: Gateways) -> Iterator[Gateway]:
    policy = (
        f"models:\n  - name: {QWEN_MODEL}\n    preset: qwen3-embedding-0.6b\n"
        "    max_tokens: 1024\n    encoding_profile: LEGACY\n    upstream_flavour: DYNAMO\n"
        "    check_responses: true\n"
    )
    spec = GatewaySpec(
        upstream.url, policy=policy, args=("--upstream-timeout", f"{UPSTREAM_TIMEOUT_S:g}")
    )
    with gateways.own(spec) as gw:
        yield gw


@pytest.mark.parametrize("name", sorted(CHECKED))
def test_checked_plain_request_never_gets_bad_vectors(
    checking_gateway: Gateway, upstream: FaultyUpstream, name: str
) -> None:
    upstream.use(SCRIPTS[name])
    answer = post(checking_gateway.url, PLAIN)
    expected = CHECKED[name]
    if expected == OK:
        assert answer.status == 200, answer
        # Checked, not rewritten: the upstream's answer, byte for byte.
        sent = SCRIPTS["ok"].steps[0]
        assert isinstance(sent, Send)
        assert answer.body == sent.data.split(b"\r\n\r\n", 1)[1]
        return
    assert answer.status == expected, answer
    error = envelope_error(answer.body)
    assert error["type"] == "server_error", error
