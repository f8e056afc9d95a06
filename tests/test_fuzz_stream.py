"""Stream-level fuzz of the real grpc.aio ext_proc server.

The real server (``extproc.service.server.serve``: processor, health, limits) runs in-process
on 127.0.0.1 with the shipped Qwen3 policy and the real tokenizer. A real gRPC client
(``ExternalProcessorStub``) sends it random sequences of ProcessingRequest messages:
every kind, in realistic and random orders, repeated, with valid and hostile bodies,
headers, statuses, attributes and plan metadata, ``end_of_stream`` either way,
half-closing or cancelling early. Properties, for every message sent:

- the server answers it exactly once, with a reply of the same kind or an
  ``immediate_response``, or ends the stream cleanly; never UNKNOWN / a traceback;
- every immediate response is a 4xx/5xx OpenAI envelope, and none is the servicer's
  ``gateway_error`` (an exception escaped our own code);
- every body it rewrites carries its own content-length (and a 3-digit ``:status``
  for responses), with header values in ``raw_value``;
- nothing hangs: every await is bounded;

and afterwards no stream is left open, health says SERVING and a normal exchange
(dimensions emulation) still gets exactly the right answer.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import math
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
import pytest_asyncio
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extproc.core.contract import Contract
from extproc.core.plan import Encoding, ResponsePlan
from extproc.service.server import PROCESSOR_SERVICE
from testing_support.http import envelope_error
from tests.ext_proc_server import serving, set_headers
from tests.recorded_metrics import RecordedServerMetrics

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "Qwen/Qwen3-Embedding-0.6B"
NATIVE = 1024
ATTRIBUTES_KEY = "envoy.filters.http.ext_proc"
PLAN_NAMESPACE = "embgw"
CONTENT_TYPE_ATTR = "request.headers['content-type']"
CODE_DETAILS_ATTR = "response.code_details"
RESPONSE_CODE_ATTR = "response.code"
BUFFERED = processing_mode_pb2.ProcessingMode.BUFFERED
STEP_TIMEOUT = 10.0  # per await: a reply, a write, the final status
STREAM_DEADLINE = 30.0  # gRPC deadline of each fuzzed stream
HALF_CLOSE = "half-close"
CANCEL = "cancel"


# -- the server ----------------------------------------------------------------------------


@dataclass
class Server:
    port: int
    channel: grpc.aio.Channel
    metrics: RecordedServerMetrics


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(qwen_contract: Contract) -> AsyncIterator[Server]:
    metrics = RecordedServerMetrics()
    async with serving(qwen_contract, metrics) as port:
        limit = qwen_contract.policy.max_message_bytes()
        channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{port}",
            options=[
                ("grpc.max_send_message_length", limit),
                ("grpc.max_receive_message_length", limit),
            ],
        )
        try:
            yield Server(port, channel, metrics)
        finally:
            await channel.close()


# -- messages -------------------------------------------------------------------------------


def unit_rows(n: int, seed: int = 7) -> np.ndarray[Any, np.dtype[np.float32]]:
    rows = np.random.default_rng(seed).standard_normal((n, NATIVE))
    out: np.ndarray[Any, np.dtype[np.float32]] = (
        rows / np.linalg.norm(rows, axis=1, keepdims=True)
    ).astype(np.float32)
    return out


def answer_body(n: int, *, encoding: Encoding = Encoding.BASE64, width: int = NATIVE) -> bytes:
    rows = unit_rows(n)[:, :width] if width <= NATIVE else np.ones((n, width), np.float32)
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": (
                base64.b64encode(row.astype("<f4").tobytes()).decode()
                if encoding is Encoding.BASE64
                else row.tolist()
            ),
        }
        for i, row in enumerate(rows)
    ]
    return orjson.dumps(
        {"object": "list", "data": data, "model": MODEL, "usage": {"total_tokens": 3}}
    )


DIMS = {"model": MODEL, "input": ["a", "b"], "dimensions": 256}
REQUEST_BODIES = [
    orjson.dumps(DIMS),
    orjson.dumps(
        {"model": MODEL, "input": "What is the capital of France?", "input_type": "query"}
    ),
    orjson.dumps({"model": MODEL, "input": ["a", "b"]}),
    orjson.dumps({"model": MODEL, "input": [[1, 2, 3]], "dimensions": 32}),
    orjson.dumps({"model": MODEL, "input": "x", "dimensions": 31}),
    orjson.dumps({"model": "nope", "input": "x"}),
    orjson.dumps({"model": MODEL, "input": "\u202e\u200b" * 700, "dimensions": 1024}),  # truncated
    orjson.dumps({"model": MODEL, "input": "word " * 60_000}),  # > 256 KiB: worker thread
    b"",
    b"{",
    b"[]",
    b"\xff\xfe",
    b'{"model": "'
    + MODEL.encode()
    + b'", "input": "x", "extra": '
    + b"[" * 300
    + b"]" * 300
    + b"}",
]
RESPONSE_BODIES = [
    answer_body(2),
    answer_body(1),
    answer_body(2, encoding=Encoding.FLOAT),
    answer_body(2, width=NATIVE - 1),
    answer_body(3),
    answer_body(2).replace(b'"index":1', b'"index":0'),
    b'{"object":"list","data":[{"index":0,"embedding":[NaN]}]}',
    b'{"message":"Internal server error","type":"Internal Server Error","code":500}',
    b'{"error":{"message":"bad","type":"BadRequestError","param":"input","code":400}}',
    b"<html>502 Bad Gateway</html>",
    b"",
    b'{"data": ' + b"[" * 400 + b"]" * 400 + b"}",
    b'{"data":[' + b"0," * 150_000 + b"0]}",  # > 256 KiB: worker thread
]
STATUSES = [
    "200", "200", "201", "204", "400", "404", "413", "429", "500", "503", "504",
    "100", "302", "600", "999", "0", "-200", " 200", "2_00", "abc", "", "\xb2", "9" * 400,
]  # fmt: skip
PLANS = [
    ResponsePlan(MODEL, 2, NATIVE, "dynamo", Encoding.FLOAT, Encoding.BASE64, 256),
    ResponsePlan(MODEL, 1, NATIVE, "vllm", Encoding.BASE64, Encoding.FLOAT),
    ResponsePlan(MODEL, 2, NATIVE, "dynamo", Encoding.FLOAT, Encoding.FLOAT),
]
PLAN_TEXTS = [plan.to_json() for plan in PLANS] + [
    "",
    "[]",
    "null",
    '["m",1,4,"dynamo","float","base64",0]',
    '["m",1,1000000000000,"dynamo","float","base64",2]',
    '["m",2,1024,"dynamo","float","base64",-3]',
    '{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7}',
]

texts = st.text(st.characters(codec="utf-8"), max_size=20)
raw_values = st.one_of(
    st.sampled_from(
        [b"POST", b"GET", b"application/json", b"text/plain", b"100", b"\xb2", b"9" * 5000, b""]
    ),
    st.binary(max_size=20),
)


@st.composite
def header_maps(draw: st.DrawFn, extra: dict[str, st.SearchStrategy[bytes]]) -> base_pb2.HeaderMap:
    pairs: list[tuple[str, bytes]] = []
    for key, values in extra.items():
        if draw(st.integers(0, 4)) > 0:
            pairs.append((key, draw(values)))
    keys = st.sampled_from(
        [":method", ":path", "content-type", "Content-Length", "x-request-id", "transfer-encoding"]
    )
    pairs += draw(st.lists(st.tuples(keys | texts, raw_values), max_size=3))
    headers = base_pb2.HeaderMap()
    for key, value in pairs:
        if draw(st.integers(0, 5)) == 0:  # the string field instead of raw_value
            headers.headers.add(key=key, value=value.decode("latin-1"))
        else:
            headers.headers.add(key=key, raw_value=value)
    return headers


struct_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(
        [200.0, 404.0, 600.0, -1.0, 0.5, 1e300, math.nan, math.inf, -math.inf, 2.0**31]
    ),
    st.floats(),
    st.sampled_from(
        [
            "via_upstream",
            "upstream_reset_before_response_started",
            "application/json",
            "text/plain",
            "200",
            "404",
            "503",
            "600",
            "\xb2",
            "\u0663\u0660\u0660",
            "9" * 400,
            "0" * 5000 + "200",
            "",
        ]
    ),
    texts,
)
struct_values = st.recursive(
    struct_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=6,
)


STATUS_VALUES = st.sampled_from(STATUSES) | st.sampled_from(
    [200.0, 404.0, 503.0, 600.0, 1e300, math.nan, -1.0, "0" * 5000 + "200", "\u0663\u0660\u0660"]
)
ATTRIBUTE_VALUES: dict[str, st.SearchStrategy[Any]] = {
    CONTENT_TYPE_ATTR: st.sampled_from(["application/json", "text/plain", "", "\xb2"]),
    "request.id": texts,
    CODE_DETAILS_ATTR: st.sampled_from(
        [
            "via_upstream",
            "via_upstream",
            "upstream_reset_before_response_started",
            "direct_response",
        ]
    ),
    RESPONSE_CODE_ATTR: STATUS_VALUES,
}


@st.composite
def with_context(draw: st.DrawFn, message: ep.ProcessingRequest) -> ep.ProcessingRequest:
    """Random attributes (Envoy's, and others) and plan metadata on ``message``."""
    if draw(st.booleans()):
        attrs: dict[str, Any] = {}
        for name, values in ATTRIBUTE_VALUES.items():
            if draw(st.booleans()):
                attrs[name] = draw(values | struct_values)  # half targeted, half anything
        attrs.update(draw(st.dictionaries(texts, struct_values, max_size=2)))
        key = draw(st.sampled_from([ATTRIBUTES_KEY, ATTRIBUTES_KEY, ATTRIBUTES_KEY, "other"]))
        message.attributes[key].update(attrs)
    if draw(st.integers(0, 3)) == 0:
        fields: dict[str, Any] = {}
        if draw(st.integers(0, 4)) > 0:
            fields["plan"] = draw(st.sampled_from(PLAN_TEXTS) | struct_values)
        if draw(st.booleans()):
            fields["respond"] = draw(st.sampled_from(["rewrite"]) | struct_values)
        namespace = draw(st.sampled_from([PLAN_NAMESPACE, PLAN_NAMESPACE, "envoy.lb"]))
        message.metadata_context.filter_metadata[namespace].update(fields)
    if draw(st.integers(0, 9)) == 0:
        message.observability_mode = True
    return message


eos = st.integers(0, 4).map(lambda n: n > 0)  # mostly True: BUFFERED bodies end the stream


@st.composite
def messages(draw: st.DrawFn) -> ep.ProcessingRequest:
    kind = draw(
        st.sampled_from(
            ["request_headers", "request_body", "response_headers", "response_body",
             "request_trailers", "response_trailers", "empty"]
        )
    )  # fmt: skip
    message = ep.ProcessingRequest()
    if kind == "request_headers":
        message.request_headers.headers.CopyFrom(
            draw(
                header_maps(
                    {
                        ":method": st.sampled_from([b"POST", b"GET"]) | raw_values,
                        "content-type": st.sampled_from([b"application/json"]) | raw_values,
                        "content-length": st.sampled_from([b"20", b"99999999999"]) | raw_values,
                    }
                )
            )
        )
        message.request_headers.end_of_stream = draw(st.booleans())
    elif kind == "request_body":
        body = draw(st.sampled_from(REQUEST_BODIES) | st.binary(max_size=60))
        message.request_body.body = body
        message.request_body.end_of_stream = draw(eos)
    elif kind == "response_headers":
        statuses = st.sampled_from(STATUSES).map(lambda s: s.encode("latin-1"))
        message.response_headers.headers.CopyFrom(
            draw(header_maps({":status": statuses, "content-type": raw_values}))
        )
        message.response_headers.end_of_stream = draw(st.booleans())
    elif kind == "response_body":
        message.response_body.body = draw(st.sampled_from(RESPONSE_BODIES) | st.binary(max_size=60))
        message.response_body.end_of_stream = draw(eos)
    elif kind == "request_trailers":
        message.request_trailers.trailers.CopyFrom(draw(header_maps({})))
    elif kind == "response_trailers":
        message.response_trailers.trailers.CopyFrom(draw(header_maps({})))
    return draw(with_context(message))


def exchange(status: str, body_index: int, response_index: int) -> list[ep.ProcessingRequest]:
    """A well-formed single-filter exchange, for the realistic sequences."""
    request_headers = ep.ProcessingRequest()
    request_headers.request_headers.headers.headers.add(key=":method", raw_value=b"POST")
    request_headers.request_headers.headers.headers.add(
        key="content-type", raw_value=b"application/json"
    )
    request_body = ep.ProcessingRequest()
    request_body.request_body.body = REQUEST_BODIES[body_index]
    request_body.request_body.end_of_stream = True
    response_headers = ep.ProcessingRequest()
    response_headers.response_headers.headers.headers.add(
        key=":status", raw_value=status.encode("latin-1")
    )
    response_headers.attributes[ATTRIBUTES_KEY].update({CODE_DETAILS_ATTR: "via_upstream"})
    response_body = ep.ProcessingRequest()
    response_body.response_body.body = RESPONSE_BODIES[response_index]
    response_body.response_body.end_of_stream = True
    return [request_headers, request_body, response_headers, response_body]


def standalone_response(status: Any, plan: str, response_index: int) -> list[ep.ProcessingRequest]:
    """envoy/standalone.yaml's response stream: one body message, status as an attribute,
    the plan as metadata."""
    message = ep.ProcessingRequest()
    message.response_body.body = RESPONSE_BODIES[response_index]
    message.response_body.end_of_stream = True
    message.attributes[ATTRIBUTES_KEY].update(
        {RESPONSE_CODE_ATTR: status, CODE_DETAILS_ATTR: "via_upstream"}
    )
    message.metadata_context.filter_metadata[PLAN_NAMESPACE].update(
        {"respond": "rewrite", "plan": plan}
    )
    return [message]


@st.composite
def realistic(draw: st.DrawFn) -> list[Any]:
    """A valid exchange, then dropped, repeated, swapped and extra messages."""
    if draw(st.booleans()):
        steps: list[Any] = exchange(
            draw(st.sampled_from(STATUSES)),
            draw(st.integers(0, len(REQUEST_BODIES) - 1)),
            draw(st.integers(0, len(RESPONSE_BODIES) - 1)),
        )
    else:
        steps = standalone_response(
            draw(STATUS_VALUES),
            draw(st.sampled_from(PLAN_TEXTS)),
            draw(st.integers(0, len(RESPONSE_BODIES) - 1)),
        )
    for _ in range(draw(st.integers(0, 3))):
        edit = draw(st.sampled_from(["drop", "repeat", "swap", "insert"]))
        at = draw(st.integers(0, max(0, len(steps) - 1)))
        if edit == "drop" and steps:
            del steps[at]
        elif edit == "repeat" and steps:
            steps.insert(at, steps[at])
        elif edit == "swap" and len(steps) >= 2:
            steps[at], steps[at - 1] = steps[at - 1], steps[at]
        else:
            steps.insert(at, draw(messages()))
    return steps


@st.composite
def sequences(draw: st.DrawFn) -> list[Any]:
    """Messages for one stream, maybe ending in an early half-close or cancel."""
    steps = draw(realistic() | st.lists(messages(), min_size=1, max_size=7))
    stop = draw(st.sampled_from([None, None, None, HALF_CLOSE, CANCEL]))
    if stop is None:  # half-closed after the last message
        return steps
    return [*steps[: draw(st.integers(0, len(steps)))], stop]


# -- the properties ---------------------------------------------------------------------------


def decode_vector(value: Any) -> np.ndarray[Any, np.dtype[np.float64]]:
    if isinstance(value, str):
        raw = np.frombuffer(base64.b64decode(value, validate=True), dtype="<f4")
        return raw.astype(np.float64)
    return np.asarray(value, dtype=np.float64)


def check_reply(request: ep.ProcessingRequest, reply: ep.ProcessingResponse) -> None:
    kind = request.WhichOneof("request")
    got = reply.WhichOneof("response")
    if kind is None:
        assert got in (None, "immediate_response"), reply
    else:
        assert got in (kind, "immediate_response"), (kind, reply)
    if got == "immediate_response":
        immediate = reply.immediate_response
        assert 400 <= immediate.status.code < 600, immediate.status
        assert set_headers(immediate.headers).get("content-type") == b"application/json"
        error = envelope_error(immediate.body)
        assert error["code"] != "gateway_error", f"an exception escaped the stream: {request}"
        return
    if reply.HasField("dynamic_metadata") and PLAN_NAMESPACE in reply.dynamic_metadata.fields:
        ours = reply.dynamic_metadata.fields[PLAN_NAMESPACE].struct_value.fields
        if "plan" in ours:  # for the response filter: must read back
            assert ResponsePlan.from_json(ours["plan"].string_value) is not None, ours
        if "status" in ours:  # for standalone.yaml's Lua filter
            status_text = ours["status"].string_value
            assert status_text.isdigit() and 200 <= int(status_text) < 600, ours
    if got is None:
        return
    common = getattr(reply, got).response if got.endswith(("headers", "body")) else None
    if common is None:
        return
    headers = set_headers(common.header_mutation)
    if common.body_mutation.WhichOneof("mutation") == "body":
        body = common.body_mutation.body
        assert headers.get("content-length") == str(len(body)).encode(), headers
        if got == "response_body" and ":status" in headers:
            status = int(headers[":status"])
            assert 200 <= status < 600, headers
            doc = orjson.loads(body)
            if status >= 400:
                envelope_error(body)
            else:  # every upstream row sent here is a unit vector: so is every answer
                for item in doc["data"]:
                    vector = decode_vector(item["embedding"])
                    assert vector.size and abs(np.linalg.norm(vector) - 1.0) < 1e-3, item
    if ":status" in headers:
        assert len(headers[":status"]) == 3 and headers[":status"].isdigit(), headers


async def drive(channel: grpc.aio.Channel, steps: Sequence[Any]) -> None:
    """Send ``steps`` on one stream, reading each reply before the next message."""
    stub = ep_grpc.ExternalProcessorStub(channel)
    call = stub.Process(timeout=STREAM_DEADLINE)
    try:
        await _drive(call, steps)
    finally:
        call.cancel()  # a no-op once the stream ended; frees it when a check failed


async def _drive(call: Any, steps: Sequence[Any]) -> None:
    try:
        for step in steps:
            if step is CANCEL:
                call.cancel()
                return
            if step is HALF_CLOSE:
                break
            try:
                await asyncio.wait_for(call.write(step), STEP_TIMEOUT)
            except asyncio.InvalidStateError:
                break  # the server ended the stream (cleanly: checked below)
            except grpc.aio.AioRpcError as error:
                # The server ends a stream once the exchange is decided (servicer.py);
                # a message written after that fails on the client's side, with this
                # client-made INTERNAL (the server's own status is then not visible
                # here). Every message before it got its reply, checked above.
                if "SendMessageOperation" not in (error.debug_error_string() or ""):
                    raise
                return
            reply = await asyncio.wait_for(call.read(), STEP_TIMEOUT)
            if reply is grpc.aio.EOF:
                break  # ended by the server instead of answering: checked below
            check_reply(step, reply)
        with contextlib.suppress(asyncio.InvalidStateError):
            await asyncio.wait_for(call.done_writing(), STEP_TIMEOUT)
        extra = await asyncio.wait_for(call.read(), STEP_TIMEOUT)
        assert extra is grpc.aio.EOF, f"a reply nobody asked for: {extra}"
        code = await asyncio.wait_for(call.code(), STEP_TIMEOUT)
        details = await asyncio.wait_for(call.details(), STEP_TIMEOUT)
    except grpc.aio.AioRpcError as error:
        code, details = error.code(), error.details()
    assert code is grpc.StatusCode.OK or code not in (
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    ), (code, details)
    assert "Traceback" not in (details or ""), details


@pytest.mark.parametrize(
    "status",
    [
        pytest.param("\xb2", id="superscript-two"),  # str.isdigit() is True, int() refuses it
        pytest.param("0" * 5000 + "200", id="5003-digits"),  # int() refuses > 4,300 digits
    ],
)
async def test_status_attribute_that_int_refuses(server: Server, status: str) -> None:
    """Found by test_random_message_sequences: standalone.yaml's response stream with a
    ``response.code`` attribute that passes ``str.isdigit()`` but not ``int()``. The
    server must answer it like any unusable status, not with the servicer's 500."""
    await drive(server.channel, standalone_response(status, PLANS[0].to_json(), 0))


@pytest.mark.parametrize("length", [b"\xb2", b"9" * 5000, b"\xb9\xb3"])
async def test_content_length_that_int_refuses(server: Server, length: bytes) -> None:
    """Found by tests/test_fuzz_core.py (check_declared_length raised ValueError): a
    request_headers message with such a content-length got the servicer's 500."""
    message = ep.ProcessingRequest()
    for key, value in ((":method", b"POST"), ("content-type", b"application/json")):
        message.request_headers.headers.headers.add(key=key, raw_value=value)
    message.request_headers.headers.headers.add(key="content-length", raw_value=length)
    await drive(server.channel, [message, *exchange("200", 0, 0)[1:]])


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(steps=sequences())
async def test_random_message_sequences(server: Server, steps: list[Any]) -> None:
    await drive(server.channel, steps)


async def test_concurrent_hostile_streams(server: Server) -> None:
    """Thirty-six streams at once, mixing the realistic exchanges: each still gets its own
    answers (no state shared between streams)."""
    sequences = [
        exchange(status, body, response)
        for status in ("200", "400", "404", "503", "\xb2", "999")
        for body, response in ((0, 0), (1, 7), (3, 1), (5, 9), (7, 12), (12, 11))
    ]
    await asyncio.wait_for(asyncio.gather(*(drive(server.channel, s) for s in sequences[:40])), 120)


async def test_server_still_serves_after_the_fuzz(server: Server) -> None:
    """Health SERVING, no stream left open, and a normal exchange answered exactly."""
    health = health_pb2_grpc.HealthStub(server.channel)
    for service in ("", PROCESSOR_SERVICE):
        answer = await asyncio.wait_for(
            health.Check(health_pb2.HealthCheckRequest(service=service)), STEP_TIMEOUT
        )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    streams = server.metrics.streams
    for _ in range(100):  # cancelled streams finish on the server a moment later
        if streams.open_streams() == 0:
            break
        await asyncio.sleep(0.05)
    assert streams.open_streams() == 0

    steps = exchange("200", 0, 0)
    stub = ep_grpc.ExternalProcessorStub(server.channel)
    call = stub.Process(timeout=STREAM_DEADLINE)
    replies = []
    for step in steps:
        await asyncio.wait_for(call.write(step), STEP_TIMEOUT)
        replies.append(await asyncio.wait_for(call.read(), STEP_TIMEOUT))
    await asyncio.wait_for(call.done_writing(), STEP_TIMEOUT)
    assert await asyncio.wait_for(call.read(), STEP_TIMEOUT) is grpc.aio.EOF
    assert await asyncio.wait_for(call.code(), STEP_TIMEOUT) is grpc.StatusCode.OK

    kinds = [reply.WhichOneof("response") for reply in replies]
    assert kinds == ["request_headers", "request_body", "response_headers", "response_body"]
    upstream = orjson.loads(replies[1].request_body.response.body_mutation.body)
    assert upstream == {"model": MODEL, "input": ["a", "b"], "encoding_format": "base64"}
    assert replies[2].mode_override.response_body_mode == BUFFERED
    common = replies[3].response_body.response
    body = common.body_mutation.body
    headers = set_headers(common.header_mutation)
    assert headers[":status"] == b"200"
    assert headers["content-length"] == str(len(body)).encode()
    got = np.asarray([item["embedding"] for item in orjson.loads(body)["data"]], np.float64)
    head = unit_rows(2)[:, :256].astype(np.float64)
    np.testing.assert_allclose(got, head / np.linalg.norm(head, axis=1, keepdims=True), atol=1e-6)


# -- streams as envoy/standalone.yaml's filters open them -----------------------------------


def standalone_request(body: bytes) -> ep.ProcessingRequest:
    message = ep.ProcessingRequest()
    message.request_body.body = body
    message.request_body.end_of_stream = True
    message.attributes[ATTRIBUTES_KEY].update({CONTENT_TYPE_ATTR: "application/json"})
    return message


async def test_standalone_streams_end_on_the_server_and_leave_nothing_to_finalize(
    server: Server,
) -> None:
    """A one-message stream ends right after its reply (OK, from the server), and so
    does a one-stream-route stream after its response body; the plan stays off the
    one-stream route's metadata. grpc.aio's request generator is closed by the
    server, not left to asyncio's async-generator finalizer (a thread-safe callback
    and a task per stream)."""
    finalized: list[str] = []
    firstiter, finalizer = sys.get_asyncgen_hooks()
    assert finalizer is not None

    def counting(agen: Any) -> None:
        finalized.append(agen.__name__)
        finalizer(agen)

    stub = ep_grpc.ExternalProcessorStub(server.channel)
    one_message = (("x-embgw-one-message", "1"),)
    on_stream = (*one_message, ("x-embgw-response-on-stream", "1"))
    sys.set_asyncgen_hooks(firstiter, counting)
    try:
        for _ in range(10):
            call = stub.Process(metadata=one_message, timeout=STREAM_DEADLINE)
            await asyncio.wait_for(call.write(standalone_request(REQUEST_BODIES[2])), STEP_TIMEOUT)
            reply = await asyncio.wait_for(call.read(), STEP_TIMEOUT)
            assert reply.WhichOneof("response") == "request_body"
            assert await asyncio.wait_for(call.read(), STEP_TIMEOUT) is grpc.aio.EOF
            assert await asyncio.wait_for(call.code(), STEP_TIMEOUT) is grpc.StatusCode.OK

            call = stub.Process(metadata=on_stream, timeout=STREAM_DEADLINE)
            await asyncio.wait_for(call.write(standalone_request(REQUEST_BODIES[0])), STEP_TIMEOUT)
            reply = await asyncio.wait_for(call.read(), STEP_TIMEOUT)
            meta = reply.dynamic_metadata.fields[PLAN_NAMESPACE].struct_value.fields
            assert set(meta) == {"respond"} and not reply.request_body.response.clear_route_cache
            answer = standalone_response("200", "", 0)[0]
            answer.ClearField("metadata_context")
            await asyncio.wait_for(call.write(answer), STEP_TIMEOUT)
            reply = await asyncio.wait_for(call.read(), STEP_TIMEOUT)
            body = orjson.loads(reply.response_body.response.body_mutation.body)
            assert [len(item["embedding"]) for item in body["data"]] == [256, 256]
            assert await asyncio.wait_for(call.read(), STEP_TIMEOUT) is grpc.aio.EOF
            assert await asyncio.wait_for(call.code(), STEP_TIMEOUT) is grpc.StatusCode.OK
        await asyncio.sleep(0.2)  # a finalizer runs once the server drops the call
        gc.collect()
    finally:
        sys.set_asyncgen_hooks(firstiter, finalizer)
    assert "_async_message_receiver" not in finalized, finalized


async def test_what_the_server_loaded_is_out_of_the_collectors_reach(server: Server) -> None:
    """serve() freezes the objects that live as long as the process (modules, policy,
    gRPC's and prometheus' objects), so full collections no longer scan them."""
    assert gc.get_freeze_count() > 10_000
