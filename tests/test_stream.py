"""The ext_proc state machine driven with real Envoy protobuf messages."""

from __future__ import annotations

import asyncio
import base64
import gzip
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import numpy as np
import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import struct_pb2

from extproc.core.contract import Contract
from extproc.core.plan import ResponsePlan
from extproc.service.admission import overloaded_error
from extproc.service.reload import ContractHolder
from extproc.service.servicer import ExternalProcessor, stream_shape
from extproc.service.stream import (
    OVERLOADED,
    PROCESSOR_FAILURE,
    REPLY_SENT,
    TRANSITIONS,
    Admission,
    ExtProcStream,
    Outcome,
    Overloaded,
    Phase,
    Shape,
    TransitionError,
)
from testing_support.http import envelope_error
from tests.ext_proc_server import set_headers
from tests.recorded_metrics import RecordedStreamMetrics

MODEL = "Qwen/Qwen3-Embedding-0.6B"
ATTRIBUTES_KEY = "envoy.filters.http.ext_proc"
CONTENT_TYPE_ATTR = "request.headers['content-type']"
CODE_DETAILS_ATTR = "response.code_details"
BUFFERED = processing_mode_pb2.ProcessingMode.BUFFERED
QUERY_PROMPT = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\n"
    "Query:What is the capital city of France?"
)


# -- message builders -------------------------------------------------------------------


def with_attributes(
    request: ep.ProcessingRequest, values: Mapping[str, Any]
) -> ep.ProcessingRequest:
    struct = struct_pb2.Struct()
    struct.update(dict(values))
    request.attributes[ATTRIBUTES_KEY].CopyFrom(struct)
    return request


def header_map(headers: Mapping[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key=k, raw_value=v.encode("latin-1")) for k, v in headers.items()
        ]
    )


def request_headers(headers: Mapping[str, str], *, eos: bool = False) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(
        request_headers=ep.HttpHeaders(headers=header_map(headers), end_of_stream=eos)
    )


def request_body(
    body: bytes | Mapping[str, Any],
    *,
    eos: bool = True,
    content_type: str | None = "application/json",
) -> ep.ProcessingRequest:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    message = ep.ProcessingRequest(request_body=ep.HttpBody(body=raw, end_of_stream=eos))
    attrs: dict[str, Any] = {"request.id": "req-1"}
    if content_type is not None:
        attrs[CONTENT_TYPE_ATTR] = content_type
    return with_attributes(message, attrs)


def response_headers(
    status: int | str, *, eos: bool = False, details: str | None = "via_upstream"
) -> ep.ProcessingRequest:
    message = ep.ProcessingRequest(
        response_headers=ep.HttpHeaders(
            headers=header_map({":status": str(status), "content-type": "application/json"}),
            end_of_stream=eos,
        )
    )
    if details is not None:
        with_attributes(message, {CODE_DETAILS_ATTR: details})
    return message


def response_body(body: bytes, *, eos: bool = True) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(response_body=ep.HttpBody(body=body, end_of_stream=eos))


def assert_immediate(reply: ep.ProcessingResponse, status: int) -> dict[str, Any]:
    assert reply.WhichOneof("response") == "immediate_response", reply
    immediate = reply.immediate_response
    assert immediate.status.code == status
    assert set_headers(immediate.headers)["content-type"] == b"application/json"
    return envelope_error(immediate.body)


AWAITING = (
    Phase.AWAIT_REQUEST,
    Phase.AWAIT_REQUEST_BODY,
    Phase.AWAIT_RESPONSE,
    Phase.AWAIT_ANSWER,
    Phase.AWAIT_RESPONSE_BODY,
)


def assert_finished(stream: ExtProcStream) -> None:
    """The exchange is decided: later messages are answered neutrally, never processed."""
    assert stream.phase not in AWAITING, stream.phase
    late = stream.handle(response_body(b'{"data": []}'))
    assert late == ep.ProcessingResponse(response_body=ep.BodyResponse())


QUERY = {"model": MODEL, "input": "What is the capital city of France?", "input_type": "query"}
PLAIN = {"model": MODEL, "input": ["a", "b"]}
DIMS = {"model": MODEL, "input": ["a", "b"], "dimensions": 256}


def recorded(stream: ExtProcStream) -> RecordedStreamMetrics:
    assert isinstance(stream.metrics, RecordedStreamMetrics)
    return stream.metrics


def new_stream(contract: Contract, shape: Shape = Shape.RESPONSE_ON_SECOND_STREAM) -> ExtProcStream:
    return ExtProcStream(contract, shape, RecordedStreamMetrics())


@pytest.fixture
def stream(qwen_contract: Contract) -> ExtProcStream:
    return new_stream(qwen_contract)


def unit_rows(n: int, dim: int = 1024) -> np.ndarray[Any, np.dtype[np.float32]]:
    rng = np.random.default_rng(42)
    rows = rng.standard_normal((n, dim))
    out: np.ndarray[Any, np.dtype[np.float32]] = (
        rows / np.linalg.norm(rows, axis=1, keepdims=True)
    ).astype(np.float32)
    return out


def b64_body(rows: np.ndarray[Any, np.dtype[np.float32]]) -> bytes:
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(r.astype("<f4").tobytes()).decode(),
        }
        for i, r in enumerate(rows)
    ]
    return orjson.dumps(
        {"object": "list", "data": data, "model": MODEL, "usage": {"prompt_tokens": 4}}
    )


# -- request phase -----------------------------------------------------------------------


def test_good_body_is_rewritten_with_its_content_length(stream: ExtProcStream) -> None:
    reply = stream.handle(request_body(QUERY))
    assert reply.WhichOneof("response") == "request_body"
    common = reply.request_body.response
    body = common.body_mutation.body
    doc = orjson.loads(body)
    assert doc["input"] in ([QUERY_PROMPT], QUERY_PROMPT)
    assert "input_type" not in doc
    headers = set_headers(common.header_mutation)
    assert headers["content-length"] == str(len(body)).encode()
    assert headers["content-type"] == b"application/json"
    assert stream.plan is not None and stream.plan.model == MODEL
    assert stream.phase is Phase.AWAIT_RESPONSE
    assert stream.request_id == "req-1"


def test_unchanged_body_passes_with_an_empty_reply(stream: ExtProcStream) -> None:
    reply = stream.handle(request_body(PLAIN))
    assert reply.WhichOneof("response") == "request_body"
    common = reply.request_body.response
    assert not common.HasField("body_mutation")
    assert len(common.header_mutation.set_headers) == 0
    assert stream.plan is not None and stream.plan.input_count == 2
    assert stream.phase is Phase.AWAIT_RESPONSE


def plan_metadata(reply: ep.ProcessingResponse) -> dict[str, Any]:
    fields = reply.dynamic_metadata.fields
    if "embgw" not in fields:
        return {}
    return {k: v.string_value for k, v in fields["embgw"].struct_value.fields.items()}


def test_a_rewrite_on_a_second_stream_gets_the_plan_and_a_reroute(
    stream: ExtProcStream,
) -> None:
    """standalone.yaml's fallback: the response comes on another stream."""
    reply = stream.handle(request_body(DIMS))
    meta = plan_metadata(reply)
    assert meta["respond"] == "rewrite"
    assert ResponsePlan.from_json(meta["plan"]) == stream.plan
    assert reply.request_body.response.clear_route_cache


def test_a_rewrite_on_the_one_stream_route_gets_only_the_cue(qwen_contract: Contract) -> None:
    """The one-stream route says the response comes on this stream, so the reply
    carries no plan and no re-route, only the Lua filter's cue."""
    stream = new_stream(qwen_contract, Shape.RESPONSE_BODY_ON_THIS_STREAM)
    reply = stream.handle(request_body(DIMS))
    assert plan_metadata(reply) == {"respond": "rewrite"}
    assert not reply.request_body.response.clear_route_cache
    assert stream.phase is Phase.AWAIT_ANSWER
    # The answer on the same stream is the one the second stream would give.
    rows = unit_rows(2)
    answer = stream.handle(skipped_headers_body(b64_body(rows), 200))
    doc = orjson.loads(answer.response_body.response.body_mutation.body)
    assert [len(item["embedding"]) for item in doc["data"]] == [256, 256]
    assert status_metadata(answer) == "200"


def test_a_rewrite_on_the_whole_exchange_needs_no_metadata(qwen_contract: Contract) -> None:
    """The one-filter shape: its stream sees the whole exchange, so the response
    headers come on it too; no metadata, no re-route."""
    stream = new_stream(qwen_contract, Shape.WHOLE_EXCHANGE)
    stream.handle(request_headers({":path": "/v1/embeddings", ":method": "POST"}))
    reply = stream.handle(request_body(DIMS))
    assert not reply.HasField("dynamic_metadata")
    assert not reply.request_body.response.clear_route_cache
    assert stream.handle(response_headers(200)).mode_override.response_body_mode == BUFFERED


def test_a_rewrite_after_request_headers_on_standalone_gets_the_plan(
    stream: ExtProcStream,
) -> None:
    """standalone.yaml's route for large bodies: it sends the request headers
    (to admit the body first) but the response comes on a second stream, so the plan
    and the re-route are needed as on any other standalone route."""
    stream.handle(request_headers({":path": "/v1/embeddings", ":method": "POST"}))
    reply = stream.handle(request_body(DIMS))
    meta = plan_metadata(reply)
    assert meta["respond"] == "rewrite"
    assert ResponsePlan.from_json(meta["plan"]) == stream.plan
    assert reply.request_body.response.clear_route_cache


def test_no_metadata_when_the_response_needs_nothing(qwen_contract: Contract) -> None:
    for stream in (
        new_stream(qwen_contract),
        new_stream(qwen_contract, Shape.RESPONSE_BODY_ON_THIS_STREAM),
    ):
        reply = stream.handle(request_body(QUERY))
        assert not reply.HasField("dynamic_metadata")
        assert not reply.request_body.response.clear_route_cache
        assert stream.phase is Phase.AWAIT_RESPONSE


@pytest.mark.parametrize(
    ("body", "content_type", "status", "param"),
    [
        pytest.param(b"{not json", "application/json", 400, None, id="malformed-json"),
        pytest.param(b"", "application/json", 400, None, id="empty"),
        pytest.param(
            {"model": "nope", "input": "x"}, "application/json", 404, "model", id="unknown-model"
        ),
        pytest.param(
            {"model": MODEL, "input": "x", "dimensions": 31},
            "application/json",
            400,
            "dimensions",
            id="dims-31",
        ),
        pytest.param(
            {"model": MODEL, "input": []}, "application/json", 400, "input", id="empty-input"
        ),
        pytest.param(PLAIN, "text/plain", 415, None, id="attr-text-plain"),
        pytest.param(PLAIN, "application/x-www-form-urlencoded", 415, None, id="attr-form"),
    ],
)
def test_bad_body_is_answered_immediately(
    body: bytes | dict[str, Any],
    content_type: str,
    status: int,
    param: str | None,
    stream: ExtProcStream,
) -> None:
    reply = stream.handle(request_body(body, content_type=content_type))
    error = assert_immediate(reply, status)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert stream.phase is Phase.DONE
    assert stream.plan is None


@pytest.mark.parametrize(
    "content_type",
    [None, "application/json; charset=utf-8", "APPLICATION/JSON"],
    ids=["no-attribute", "charset", "upper"],
)
def test_json_content_type_attribute_accepted(
    content_type: str | None, stream: ExtProcStream
) -> None:
    reply = stream.handle(request_body(PLAIN, content_type=content_type))
    assert reply.WhichOneof("response") == "request_body"


@pytest.mark.parametrize(
    ("headers", "eos", "status"),
    [
        pytest.param({":method": "POST", "content-type": "application/json"}, False, None, id="ok"),
        pytest.param({":method": "GET"}, True, 405, id="get"),
        pytest.param(
            {":method": "POST", "content-type": "application/json"}, True, 400, id="no-body"
        ),
        pytest.param(
            {":method": "POST", "content-type": "text/plain"}, False, 415, id="text-plain"
        ),
        pytest.param(
            {":method": "POST", "Content-Type": "Text/Plain"}, False, 415, id="text-plain-case"
        ),
        pytest.param(
            {":method": "POST", "content-type": "application/json", "content-length": "100"},
            False,
            None,
            id="small-length",
        ),
        pytest.param(
            {
                ":method": "POST",
                "content-type": "application/json",
                "content-length": str(8 * 1024 * 1024 + 1),
            },
            False,
            413,
            id="length-over-8MiB",
        ),
        pytest.param(
            {":method": "POST", "content-type": "application/json", "content-length": "-5"},
            False,
            None,
            id="garbage-length-left-to-envoy",
        ),
    ],
)
def test_request_headers(
    headers: dict[str, str], eos: bool, status: int | None, stream: ExtProcStream
) -> None:
    reply = stream.handle(request_headers(headers, eos=eos))
    if status is None:
        assert reply.WhichOneof("response") == "request_headers"
        mutation = reply.request_headers.response.header_mutation
        assert set_headers(mutation) == {"accept-encoding": b"identity"}
        assert list(mutation.remove_headers) == []
        assert stream.phase is Phase.AWAIT_REQUEST_BODY
        follow = stream.handle(request_body(PLAIN, content_type=None))
        assert follow.WhichOneof("response") == "request_body"
    else:
        assert_immediate(reply, status)
        assert stream.phase is Phase.DONE


# The one-filter shape's matchers send every spelling of the endpoint: the server
# answers the others and gives the upstream the canonical path.
POST_JSON = {":method": "POST", "content-type": "application/json"}


@pytest.mark.parametrize(
    ("path", "upstream"),
    [
        ("/v1/embeddings", None),
        ("/embeddings", b"/v1/embeddings"),
        ("/v1/embeddings?x=1", b"/v1/embeddings"),
        ("/embeddings?a=b&c", b"/v1/embeddings"),
        ("//v1//embeddings", b"/v1/embeddings"),
    ],
)
def test_endpoint_spellings_go_to_the_canonical_path(
    path: str, upstream: bytes | None, stream: ExtProcStream
) -> None:
    reply = stream.handle(request_headers({**POST_JSON, ":path": path}))
    assert set_headers(reply.request_headers.response.header_mutation).get(":path") == upstream
    follow = stream.handle(request_body(QUERY))
    assert follow.request_body.response.HasField("body_mutation")


@pytest.mark.parametrize(
    "path",
    [
        "/V1/embeddings",
        "/v1/Embeddings",
        "/Embeddings?x=1",
        "/v1/embeddings;x=1",
        "/v1/embeddings%3Bx=1",
        "/v1/embeddings.json",
        "/v1/embeddings/",
        "/embeddings/x",
        "/v2/embeddings",
    ],
)
def test_other_spellings_are_a_404(path: str, stream: ExtProcStream) -> None:
    reply = stream.handle(request_headers({**POST_JSON, ":path": path}))
    assert assert_immediate(reply, 404)["code"] == "unknown_url"
    assert_finished(stream)


def test_a_path_below_the_endpoint_is_a_404_whatever_the_method(stream: ExtProcStream) -> None:
    reply = stream.handle(
        request_headers({":method": "GET", ":path": "/v1/embeddings/x"}, eos=True)
    )
    assert assert_immediate(reply, 404)["code"] == "unknown_url"


@pytest.mark.parametrize("coding", ["gzip", "GZIP", "br", "deflate", "zstd", "gzip, identity", ""])
def test_compressed_body_is_a_415(coding: str, stream: ExtProcStream) -> None:
    headers = {**POST_JSON, ":path": "/v1/embeddings", "content-encoding": coding}
    reply = stream.handle(request_headers(headers))
    assert assert_immediate(reply, 415)["code"] == "unsupported_content_encoding"


@pytest.mark.parametrize("coding", ["identity", "Identity", " identity\t"])
def test_identity_coding_is_accepted_and_not_forwarded(coding: str, stream: ExtProcStream) -> None:
    headers = {**POST_JSON, ":path": "/v1/embeddings", "content-encoding": coding}
    reply = stream.handle(request_headers(headers))
    assert list(reply.request_headers.response.header_mutation.remove_headers) == [
        "content-encoding"
    ]


def test_a_body_without_content_type_gets_the_json_one(stream: ExtProcStream) -> None:
    reply = stream.handle(request_headers({":method": "POST", ":path": "/v1/embeddings"}))
    mutation = reply.request_headers.response.header_mutation
    assert set_headers(mutation)["content-type"] == b"application/json"


def test_content_type_from_headers_applies_to_the_body(stream: ExtProcStream) -> None:
    stream.handle(request_headers({":method": "POST", "content-type": "application/json"}))
    reply = stream.handle(request_body(PLAIN, content_type="text/plain"))  # attribute wins
    assert_immediate(reply, 415)


# -- response phase ----------------------------------------------------------------------


def test_200_without_rewrite_streams_untouched(stream: ExtProcStream) -> None:
    stream.handle(request_body(QUERY))
    reply = stream.handle(response_headers(200))
    assert reply.WhichOneof("response") == "response_headers"
    assert not reply.HasField("mode_override")
    assert reply.response_headers == ep.HeadersResponse()
    assert_finished(stream)


def test_dimensions_emulation_buffers_the_response(stream: ExtProcStream) -> None:
    stream.handle(request_body(DIMS))
    reply = stream.handle(response_headers(200))
    assert reply.WhichOneof("response") == "response_headers"
    assert reply.HasField("mode_override")
    assert reply.mode_override.response_body_mode == BUFFERED
    assert reply.mode_override.request_body_mode == BUFFERED
    assert stream.phase is Phase.AWAIT_RESPONSE_BODY


@pytest.mark.parametrize("status", [400, 404, 415, 500, 503])
def test_error_with_body_is_buffered(status: int, stream: ExtProcStream) -> None:
    stream.handle(request_body(PLAIN))
    reply = stream.handle(response_headers(status))
    assert reply.mode_override.response_body_mode == BUFFERED
    assert reply.mode_override.request_body_mode == BUFFERED
    assert stream.phase is Phase.AWAIT_RESPONSE_BODY


@pytest.mark.parametrize(
    ("body", "upstream_status", "client_status"),
    [
        pytest.param(PLAIN, 404, 503, id="empty-404-is-503"),
        pytest.param(PLAIN, 500, 500, id="empty-500"),
        pytest.param(PLAIN, 503, 503, id="empty-503"),
        pytest.param(DIMS, 200, 502, id="empty-200-needing-rewrite"),
    ],
)
def test_bodyless_response_answered_immediately(
    body: dict[str, Any], upstream_status: int, client_status: int, stream: ExtProcStream
) -> None:
    stream.handle(request_body(body))
    reply = stream.handle(response_headers(upstream_status, eos=True))
    error = assert_immediate(reply, client_status)
    assert error["type"] == "server_error"
    assert stream.phase is Phase.DONE


def test_response_body_vectors_rewritten(stream: ExtProcStream) -> None:
    stream.handle(request_body(DIMS))
    stream.handle(response_headers(200))
    rows = unit_rows(2)
    reply = stream.handle(response_body(b64_body(rows)))
    assert reply.WhichOneof("response") == "response_body"
    common = reply.response_body.response
    body = common.body_mutation.body
    headers = set_headers(common.header_mutation)
    assert headers[":status"] == b"200"
    assert headers["content-type"] == b"application/json"
    assert headers["content-length"] == str(len(body)).encode()
    doc = orjson.loads(body)
    got = np.asarray([item["embedding"] for item in doc["data"]], dtype=np.float64)
    head = rows[:, :256].astype(np.float64)
    np.testing.assert_allclose(got, head / np.linalg.norm(head, axis=1, keepdims=True), atol=1e-6)
    assert doc["usage"] == {"prompt_tokens": 4}
    assert stream.phase is Phase.DONE


@pytest.mark.parametrize(
    ("upstream_status", "client_status", "error_type"),
    [
        pytest.param(500, 500, "server_error", id="500"),
        pytest.param(400, 400, "invalid_request_error", id="400"),
        pytest.param(404, 503, "server_error", id="404"),
    ],
)
def test_response_body_error_enveloped(
    upstream_status: int, client_status: int, error_type: str, stream: ExtProcStream
) -> None:
    stream.handle(request_body(PLAIN))
    stream.handle(response_headers(upstream_status))
    upstream = b'{"message":"Internal server error","type":"Internal Server Error","code":500}'
    reply = stream.handle(response_body(upstream))
    common = reply.response_body.response
    headers = set_headers(common.header_mutation)
    assert headers[":status"] == str(client_status).encode()
    assert headers["content-length"] == str(len(common.body_mutation.body)).encode()
    error = envelope_error(common.body_mutation.body)
    assert error["type"] == error_type
    assert "Internal server error" in error["message"]


@pytest.mark.parametrize(
    "details",
    [
        "request_payload_too_large",
        "response_payload_too_large",
        "upstream_response_timeout",
        "direct_response",
    ],
)
@pytest.mark.parametrize("status", [413, 500, 503, 504, 200])
def test_envoy_local_reply_left_alone(details: str, status: int, stream: ExtProcStream) -> None:
    stream.handle(request_body(DIMS))
    reply = stream.handle(response_headers(status, eos=True, details=details))
    assert reply.WhichOneof("response") == "response_headers"
    assert reply.response_headers == ep.HeadersResponse()
    assert not reply.HasField("mode_override")
    assert_finished(stream)


def test_unvalidated_response_error_keeps_status(stream: ExtProcStream) -> None:
    """No request body was seen (no plan): a 404 is the upstream's own answer."""
    reply = stream.handle(response_headers(404))
    assert reply.mode_override.response_body_mode == BUFFERED
    reply = stream.handle(
        response_body(b'{"message":"Model not found","type":"Not Found","code":404}')
    )
    headers = set_headers(reply.response_body.response.header_mutation)
    assert headers[":status"] == b"404"


@pytest.mark.parametrize("status", ["abc", "", "99999"])
def test_garbage_status_never_raises(status: str, stream: ExtProcStream) -> None:
    stream.handle(request_body(PLAIN))
    reply = stream.handle(response_headers(status, eos=True))
    assert reply.WhichOneof("response") in ("immediate_response", "response_headers")
    if reply.WhichOneof("response") == "immediate_response":
        assert reply.immediate_response.status.code >= 500


# -- out of order --------------------------------------------------------------------


def _trailers_req() -> ep.ProcessingRequest:
    return ep.ProcessingRequest(request_trailers=ep.HttpTrailers())


def _trailers_resp() -> ep.ProcessingRequest:
    return ep.ProcessingRequest(response_trailers=ep.HttpTrailers())


NEUTRAL = {
    "request_headers": ep.ProcessingResponse(request_headers=ep.HeadersResponse()),
    "request_body": ep.ProcessingResponse(request_body=ep.BodyResponse()),
    "response_headers": ep.ProcessingResponse(response_headers=ep.HeadersResponse()),
    "response_body": ep.ProcessingResponse(response_body=ep.BodyResponse()),
    "request_trailers": ep.ProcessingResponse(request_trailers=ep.TrailersResponse()),
    "response_trailers": ep.ProcessingResponse(response_trailers=ep.TrailersResponse()),
}


def _after_reject(stream: ExtProcStream) -> None:
    assert stream.handle(request_body(b"{")).WhichOneof("response") == "immediate_response"


def _after_passthrough(stream: ExtProcStream) -> None:
    stream.handle(request_body(PLAIN))
    stream.handle(response_headers(200))
    assert stream.phase not in AWAITING


def _after_response_body(stream: ExtProcStream) -> None:
    stream.handle(request_body(DIMS))
    stream.handle(response_headers(200))
    stream.handle(response_body(b64_body(unit_rows(2))))
    assert stream.phase is Phase.DONE


def _after_request_body(stream: ExtProcStream) -> None:
    stream.handle(request_body(PLAIN))


def _fresh(stream: ExtProcStream) -> None:
    pass


SETUPS = {
    "fresh": _fresh,
    "after-request-body": _after_request_body,
    "after-reject": _after_reject,
    "after-passthrough-done": _after_passthrough,
    "after-response-body-done": _after_response_body,
}
LATE_MESSAGES = {
    "request_headers": lambda: request_headers(
        {":method": "POST", "content-type": "application/json"}
    ),
    "request_body": lambda: request_body(PLAIN),
    "response_headers": lambda: response_headers(200),
    "response_body": lambda: response_body(b64_body(unit_rows(2))),
    "request_trailers": _trailers_req,
    "response_trailers": _trailers_resp,
}

# (setup, message) pairs neutral but expected: no anomaly. A response left as it is
# ends its stream once the reply is sent, so a later body is an anomaly too.
UNCOUNTED: set[tuple[str, str]] = set()

# (setup, message) pairs that are legitimately processed rather than neutral
PROCESSED = {
    ("fresh", "request_headers"),
    ("fresh", "request_body"),
    ("fresh", "response_headers"),
    ("after-request-body", "response_headers"),
}


@pytest.mark.parametrize("kind", list(LATE_MESSAGES))
@pytest.mark.parametrize("setup", list(SETUPS))
def test_out_of_order_message_gets_a_neutral_reply(
    setup: str, kind: str, stream: ExtProcStream
) -> None:
    SETUPS[setup](stream)
    phase_before = stream.phase
    plan_before = stream.plan
    anomalies_before = len(recorded(stream).named("anomaly"))
    reply = stream.handle(LATE_MESSAGES[kind]())
    if (setup, kind) in PROCESSED:
        assert reply.WhichOneof("response") == kind
        return
    assert reply == NEUTRAL[kind], reply
    assert stream.phase is phase_before
    assert stream.plan is plan_before
    # Counted as an anomaly unless the message is expected: trailers, while the
    # stream awaits a message at all.
    expected = ("trailers" in kind and phase_before in AWAITING) or (setup, kind) in UNCOUNTED
    counted = recorded(stream).named("anomaly")[anomalies_before:]
    assert counted == ([] if expected else [("anomaly", kind)])


def test_request_body_twice(stream: ExtProcStream) -> None:
    first = stream.handle(request_body(QUERY))
    assert first.request_body.response.HasField("body_mutation")
    plan = stream.plan
    second = stream.handle(request_body({"model": MODEL, "input": "other", "dimensions": 64}))
    assert second == NEUTRAL["request_body"]
    assert stream.plan is plan
    assert stream.phase is Phase.AWAIT_RESPONSE


def test_response_body_first(stream: ExtProcStream) -> None:
    reply = stream.handle(response_body(b"{}"))
    assert reply == NEUTRAL["response_body"]
    assert stream.phase is Phase.AWAIT_REQUEST


def stream_state(stream: ExtProcStream) -> dict[str, Any]:
    """Everything the stream holds but its metrics (where an anomaly is counted)."""
    state = dict(vars(stream))
    del state["metrics"]
    # What admission control does after this message, not the stream's state: a
    # message taking no transition asks for nothing.
    del state["admission"]
    return state


def carrying_everything(message: ep.ProcessingRequest, plan: ResponsePlan) -> ep.ProcessingRequest:
    """The message with every attribute and metadata a processed message takes (a
    request id, a content type, a plan, a body's coding), all unlike the stream's own;
    no response status, so that a response body left without one is unusable."""
    with_attributes(message, {"request.id": "other", CONTENT_TYPE_ATTR: "text/csv"})
    metadata = message.metadata_context.filter_metadata
    metadata["embgw"].update({"respond": "rewrite", "plan": plan.to_json()})
    metadata["embgw.request"].update({"content_encoding": "gzip", "sent_bytes": "10"})
    return message


@pytest.mark.parametrize(
    ("setup", "kind"),
    [(setup, kind) for setup in SETUPS for kind in LATE_MESSAGES if (setup, kind) not in PROCESSED],
)
def test_a_message_left_unprocessed_changes_nothing(
    setup: str, kind: str, stream: ExtProcStream, qwen_contract: Contract
) -> None:
    """Out of order (no row), or in order but unusable (a response body without a
    status) or left as it is (trailers): the stream is as it was, attributes and
    metadata included."""
    other = new_stream(qwen_contract)
    other.handle(request_body(DIMS))
    assert other.plan is not None
    SETUPS[setup](stream)
    before = stream_state(stream)
    stream.handle(carrying_everything(LATE_MESSAGES[kind](), other.plan))
    after = stream_state(stream)
    assert after == before
    assert after["plan"] is before["plan"]


# -- the table -------------------------------------------------------------------------
# Each row driven in each shape, from every way of reaching its phase, with real
# messages of its kind: its handler returns only phases the row allows, and each
# phase the row allows is returned by some message (the row allows no more).


def _accepted_headers(stream: ExtProcStream) -> None:
    stream.handle(request_headers({**POST_JSON, ":path": "/v1/embeddings"}))
    assert stream.admission is Admission.RESERVE_BODY


def _forwarded_for_a_rewrite(stream: ExtProcStream) -> None:
    stream.handle(request_body(DIMS))
    assert stream.admission is Admission.RESERVE_ANSWER


def _error_to_envelope(stream: ExtProcStream) -> None:
    stream.handle(request_body(PLAIN))
    stream.handle(response_headers(500))


def _after_response_headers(stream: ExtProcStream) -> None:
    stream.handle(request_body(DIMS))
    stream.handle(response_headers(200))


REACHING: dict[Phase, list[Callable[[ExtProcStream], None]]] = {
    Phase.AWAIT_REQUEST: [_fresh],
    Phase.AWAIT_REQUEST_BODY: [_accepted_headers],
    Phase.AWAIT_RESPONSE: [_after_request_body],
    Phase.AWAIT_ANSWER: [_forwarded_for_a_rewrite],
    Phase.AWAIT_RESPONSE_BODY: [_error_to_envelope, _after_response_headers],
    Phase.PASS_THROUGH: [_after_passthrough],
    Phase.DONE: [_after_reject, _after_response_body],
}


# Messages of each kind (and the servicer's events), between them taking every
# branch of the handlers.
SAMPLES: dict[str, list[Callable[[], Any]]] = {
    "request_headers": [
        lambda: request_headers({**POST_JSON, ":path": "/embeddings"}),
        lambda: request_headers({":method": "GET", ":path": "/v1/embeddings"}, eos=True),
        # a rerank path the policy does not cover: the legacy server's, left whole
        lambda: request_headers({**POST_JSON, ":path": "/v1/rerank"}),
    ],
    "request_body": [
        lambda: request_body(PLAIN),
        lambda: request_body(DIMS),
        lambda: request_body(b"{not json"),
    ],
    "response_headers": [
        lambda: response_headers(200),
        lambda: response_headers(500),
        lambda: response_headers(404, eos=True),
        lambda: response_headers(503, eos=True, details="upstream_response_timeout"),
    ],
    "response_body": [
        lambda: response_body(b64_body(unit_rows(2))),
        lambda: response_body(b"{}"),
        lambda: skipped_headers_body(b64_body(unit_rows(2)), 200),
        lambda: skipped_headers_body(b"{}", 500),
        lambda: skipped_headers_body(b"{}", 504, details="upstream_response_timeout"),
        lambda: skipped_headers_body(b"{}", None),
    ],
    "request_trailers": [_trailers_req],
    "response_trailers": [_trailers_resp],
    OVERLOADED: [lambda: Overloaded(overloaded_error(3), 3)],
    PROCESSOR_FAILURE: [lambda: None],
    REPLY_SENT: [lambda: None],
}
# The reply each servicer event gets.
EVENT_REPLIES = {OVERLOADED: "immediate_response", PROCESSOR_FAILURE: "immediate_response"}


def test_every_row_is_driven_by_some_message() -> None:
    for phase, kind in TRANSITIONS:
        assert phase in REACHING and kind in SAMPLES, (phase, kind)


@pytest.mark.parametrize(
    ("phase", "kind"), list(TRANSITIONS), ids=[f"{p.value}-{k}" for p, k in TRANSITIONS]
)
def test_each_handler_reports_exactly_the_outcomes_its_row_lists(
    phase: Phase, kind: str, qwen_contract: Contract
) -> None:
    """Each outcome a row lists is reported by some message in some shape, and no
    other: the table lists what happens, not what might."""
    handler, targets = TRANSITIONS[(phase, kind)]
    reported: set[Outcome] = set()
    for shape in Shape:
        for reach in REACHING[phase]:
            for sample in SAMPLES[kind]:
                stream = new_stream(qwen_contract, shape)
                reach(stream)
                assert stream.phase is phase, reach
                message = sample()
                reply, outcome = handler(stream, message)
                assert outcome in targets, (reach, message)
                if isinstance(message, ep.ProcessingRequest):
                    assert message.WhichOneof("request") == kind
                    assert reply.WhichOneof("response") in (kind, "immediate_response")
                elif kind == REPLY_SENT:
                    assert reply is None
                else:
                    assert reply.WhichOneof("response") == EVENT_REPLIES[kind]
                reported.add(outcome)
    assert reported == set(targets)


ENVOY_KINDS = {f.name for f in ep.ProcessingRequest.DESCRIPTOR.oneofs_by_name["request"].fields}


def test_every_row_is_reachable() -> None:
    """From a new stream, the table's own transitions reach every row: an Envoy
    message's row in a phase a stream rests in between messages (a reply sent and
    the stream still open), an event's row in a phase the servicer feeds it in (a
    message being handled: before its transition, or right after it)."""
    resting = {Phase.AWAIT_REQUEST} | {
        target.phase
        for (_, kind), row in TRANSITIONS.items()
        if kind == REPLY_SENT
        for outcome, target in row.targets.items()
        if outcome is Outcome.STAYS
    }
    handled = resting | {
        target.phase
        for (phase, kind), row in TRANSITIONS.items()
        if kind in ENVOY_KINDS and phase in resting
        for target in row.targets.values()
    }
    for phase, kind in TRANSITIONS:
        where = resting if kind in ENVOY_KINDS or kind == PROCESSOR_FAILURE else handled
        assert phase in where, (phase, kind)
    # Every phase a transition can take a stream to has its reply's row.
    for row in TRANSITIONS.values():
        for target in row.targets.values():
            assert (target.phase, REPLY_SENT) in TRANSITIONS


def test_the_servicers_events_are_no_message_of_envoys() -> None:
    assert {kind for _, kind in TRANSITIONS} - {OVERLOADED, PROCESSOR_FAILURE, REPLY_SENT} <= (
        ENVOY_KINDS
    )
    for event in (OVERLOADED, PROCESSOR_FAILURE, REPLY_SENT):
        assert event not in ENVOY_KINDS
    assert all((phase, REPLY_SENT) in TRANSITIONS for phase in Phase)
    assert all((phase, PROCESSOR_FAILURE) in TRANSITIONS for phase in AWAITING)


def test_every_transition_into_done_gives_the_room_back() -> None:
    for row in TRANSITIONS.values():
        for target in row.targets.values():
            assert (target.phase is Phase.DONE) is (target.admission is Admission.RELEASE)


@pytest.mark.parametrize("shape", list(Shape))
def test_a_stream_ends_after_a_reply_by_the_rule_of_its_shape(
    shape: Shape, qwen_contract: Contract
) -> None:
    """A decided stream ends; a whole-exchange stream carries everything until then;
    a one-message stream ends unless its request body, or the answer it holds open
    for, is still to come."""
    for reaching in REACHING.values():
        for reach in reaching:
            stream = new_stream(qwen_contract, shape)
            reach(stream)
            ends = stream.decided or (
                shape is not Shape.WHOLE_EXCHANGE
                and stream.phase not in (Phase.AWAIT_REQUEST_BODY, Phase.AWAIT_ANSWER)
            )
            phase = stream.phase
            assert stream.reply_sent() is ends, (reach, phase)
            assert stream.phase is (Phase.DONE if ends else phase)


def test_an_outcome_the_row_does_not_list_is_refused(
    stream: ExtProcStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table, not the handler, moves the stream: a handler that reports an outcome
    its row does not list fails (the servicer's 500), the phase unmoved."""
    row = TRANSITIONS[(Phase.AWAIT_REQUEST, "request_trailers")]

    def wanders(stream: ExtProcStream, request: ep.ProcessingRequest) -> Any:
        return ep.ProcessingResponse(), Outcome.LEFT_ALONE

    monkeypatch.setitem(
        TRANSITIONS, (Phase.AWAIT_REQUEST, "request_trailers"), row._replace(handler=wanders)
    )
    with pytest.raises(TransitionError):
        stream.handle(_trailers_req())
    assert stream.phase is Phase.AWAIT_REQUEST


# -- a body followed by trailers (end_of_stream false) ---------------------------------
# BUFFERED mode sends the whole body in one message; end_of_stream is false only
# because trailers follow (docs/envoy-facts.md). The contract applies all the same.


def test_request_body_before_trailers_is_rewritten(stream: ExtProcStream) -> None:
    reply = stream.handle(request_body(QUERY, eos=False))
    common = reply.request_body.response
    assert orjson.loads(common.body_mutation.body)["input"] in ([QUERY_PROMPT], QUERY_PROMPT)
    assert (
        set_headers(common.header_mutation)["content-length"]
        == str(len(common.body_mutation.body)).encode()
    )
    assert stream.phase is Phase.AWAIT_RESPONSE


def test_bad_request_body_before_trailers_is_refused(stream: ExtProcStream) -> None:
    reply = stream.handle(request_body(b'{"model": 5, "input": "x"}', eos=False))
    assert assert_immediate(reply, 400)["param"] == "model"
    assert_finished(stream)


def test_response_body_before_trailers_is_rewritten(stream: ExtProcStream) -> None:
    stream.handle(request_body(DIMS))
    stream.handle(response_headers(200))
    reply = stream.handle(response_body(b64_body(unit_rows(2)), eos=False))
    doc = orjson.loads(reply.response_body.response.body_mutation.body)
    assert [len(item["embedding"]) for item in doc["data"]] == [256, 256]
    assert stream.phase is Phase.DONE


# -- a body Envoy decoded (standalone.yaml: gzip or br as sent) -------------------------
# request_coding hands over the coding and the size as sent as dynamic metadata
# (embgw.request); the decoder's trailers make the body message's end_of_stream false.


def decoded_body(body: bytes | Mapping[str, Any], coding: str, sent: int) -> ep.ProcessingRequest:
    message = request_body(body, eos=False)
    metadata = struct_pb2.Struct()
    metadata.update({"content_encoding": coding, "sent_bytes": str(sent)})
    message.metadata_context.filter_metadata["embgw.request"].CopyFrom(metadata)
    return message


def test_decoded_body_goes_through_the_contract(stream: ExtProcStream) -> None:
    reply = stream.handle(decoded_body(QUERY, "gzip", 90))
    common = reply.request_body.response
    assert orjson.loads(common.body_mutation.body)["input"] in ([QUERY_PROMPT], QUERY_PROMPT)
    assert stream.phase is Phase.AWAIT_RESPONSE


@pytest.mark.parametrize(
    "body,status,says",
    [
        (b"", 400, "(sent with Content-Encoding: br, 104 bytes) decoded to nothing"),
        (b"  \n", 400, "decoded to 3 bytes of whitespace"),
        (b'{"model": "x', 400, "decoded to 12 bytes, not valid JSON"),
        # More than 100 x 104 bytes: the decoder stopped at its bound.
        (b" " * 10_401, 413, "expands more than 100-fold"),
    ],
    ids=["nothing", "whitespace", "cut-off", "cut-by-the-bound"],
)
def test_decoded_body_that_is_no_json_names_the_coding(
    body: bytes, status: int, says: str, stream: ExtProcStream
) -> None:
    error = assert_immediate(stream.handle(decoded_body(body, "br", 104)), status)
    assert says in error["message"], error
    assert error["code"] == ("invalid_compressed_body" if status == 400 else "request_too_large")
    assert_finished(stream)


def test_decoded_gzip_body_is_checked_against_its_trailer(stream: ExtProcStream) -> None:
    packed = gzip.compress(orjson.dumps(QUERY))
    message = decoded_body(orjson.dumps(QUERY) + b" ", "gzip", len(packed))
    message.metadata_context.filter_metadata["embgw.request"].update(
        {"gzip_trailer": packed[-8:].hex()}
    )
    error = assert_immediate(stream.handle(message), 400)
    assert error["code"] == "invalid_compressed_body" and "CRC-32" in error["message"]
    assert_finished(stream)


def test_plain_body_errors_do_not_mention_a_coding(stream: ExtProcStream) -> None:
    error = assert_immediate(stream.handle(request_body(b"")), 400)
    assert error["code"] == "invalid_json" and "Content-Encoding" not in error["message"]


def test_second_body_message_is_neutral(stream: ExtProcStream) -> None:
    """Only a second body message is out of order (a STREAMED chunk, were one ever
    configured): the first one was the whole body."""
    first = stream.handle(request_body(QUERY, eos=False))
    assert first.request_body.response.HasField("body_mutation")
    plan = stream.plan
    second = stream.handle(request_body(b'"more"', eos=True))
    assert second == NEUTRAL["request_body"]
    assert stream.plan is plan


@pytest.mark.parametrize(
    "request_message",
    [
        pytest.param(ep.ProcessingRequest(), id="empty"),
        pytest.param(
            with_attributes(ep.ProcessingRequest(), {"request.id": "x"}), id="attributes-only"
        ),
        pytest.param(ep.ProcessingRequest(observability_mode=True), id="observability-only"),
    ],
)
def test_unknown_message_never_raises(
    request_message: ep.ProcessingRequest, stream: ExtProcStream
) -> None:
    reply = stream.handle(request_message)
    assert reply.WhichOneof("response") is None
    assert stream.phase is Phase.AWAIT_REQUEST


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(415.0, id="number"),
        pytest.param(1e300, id="huge-number"),
        pytest.param(True, id="bool"),
        pytest.param(None, id="null"),
        pytest.param({"a": 1}, id="struct"),
        pytest.param(["application/json"], id="list"),
        pytest.param(
            float("nan"),
            id="nan",
        ),
        pytest.param(
            float("inf"),
            id="inf",
        ),
    ],
)
def test_odd_attribute_values_never_raise(value: Any, stream: ExtProcStream) -> None:
    message = ep.ProcessingRequest(
        request_body=ep.HttpBody(body=orjson.dumps(PLAIN), end_of_stream=True)
    )
    with_attributes(
        message, {CONTENT_TYPE_ATTR: value, "request.id": value, CODE_DETAILS_ATTR: value}
    )
    reply = stream.handle(message)
    assert reply.WhichOneof("response") in ("request_body", "immediate_response")


# -- response headers skipped (standalone.yaml's extproc.response) ---------------------------


def skipped_headers_body(
    body: bytes, status: int | str | None, details: str | None = "via_upstream"
) -> ep.ProcessingRequest:
    """The response body as standalone.yaml's extproc.response sends it: no headers
    message before it; the status and code details come as attributes."""
    attrs: dict[str, Any] = {}
    if status is not None:
        attrs["response.code"] = status
    if details is not None:
        attrs[CODE_DETAILS_ATTR] = details
    return with_attributes(response_body(body), attrs)


def status_metadata(reply: ep.ProcessingResponse) -> str | None:
    fields = reply.dynamic_metadata.fields
    if "embgw" not in fields:
        return None
    value = fields["embgw"].struct_value.fields.get("status")
    return None if value is None else str(value.string_value)


def test_skipped_headers_vectors_rewritten_status_as_metadata(stream: ExtProcStream) -> None:
    stream.handle(request_body(DIMS))
    rows = unit_rows(2)
    reply = stream.handle(skipped_headers_body(b64_body(rows), 200))
    assert reply.WhichOneof("response") == "response_body"
    doc = orjson.loads(reply.response_body.response.body_mutation.body)
    assert [len(item["embedding"]) for item in doc["data"]] == [256, 256]
    assert status_metadata(reply) == "200"
    assert stream.phase is Phase.DONE


@pytest.mark.parametrize(("upstream", "client"), [(500, "500"), (404, "503"), (400, "400")])
def test_skipped_headers_error_enveloped_status_as_metadata(
    upstream: int, client: str, stream: ExtProcStream
) -> None:
    stream.handle(request_body(DIMS))
    body = b'{"message":"Internal server error","type":"Internal Server Error","code":500}'
    reply = stream.handle(skipped_headers_body(body, upstream))
    assert status_metadata(reply) == client
    envelope_error(reply.response_body.response.body_mutation.body)


def test_skipped_headers_bad_vectors_become_502(stream: ExtProcStream) -> None:
    stream.handle(request_body(DIMS))
    rows = unit_rows(3)  # the request had 2 inputs
    reply = stream.handle(skipped_headers_body(b64_body(rows), 200))
    assert status_metadata(reply) == "502"
    assert envelope_error(reply.response_body.response.body_mutation.body)["type"] == "server_error"


def test_skipped_headers_local_reply_left_alone(stream: ExtProcStream) -> None:
    stream.handle(request_body(DIMS))
    reply = stream.handle(skipped_headers_body(b"{}", 504, details="upstream_response_timeout"))
    assert reply == ep.ProcessingResponse(response_body=ep.BodyResponse())
    assert stream.phase is Phase.PASS_THROUGH


def test_skipped_headers_body_before_trailers_is_rewritten(stream: ExtProcStream) -> None:
    stream.handle(request_body(DIMS))
    message = skipped_headers_body(b64_body(unit_rows(2)), 200)
    message.response_body.end_of_stream = False
    reply = stream.handle(message)
    doc = orjson.loads(reply.response_body.response.body_mutation.body)
    assert [len(item["embedding"]) for item in doc["data"]] == [256, 256]
    assert status_metadata(reply) == "200"


@pytest.mark.parametrize("status", [None, "abc", -1])
def test_skipped_headers_without_a_usable_status_is_neutral(
    status: str | int | None, stream: ExtProcStream
) -> None:
    stream.handle(request_body(DIMS))
    reply = stream.handle(skipped_headers_body(b"{}", status))
    assert reply == ep.ProcessingResponse(response_body=ep.BodyResponse())
    assert status_metadata(reply) is None


# -- what the stream reports (its metrics) ---------------------------------------------


def event_names(metrics: RecordedStreamMetrics) -> list[str]:
    return [event[0] for event in metrics.events]


def test_a_rewritten_exchange_reports_forward_status_times_and_rewrite(
    qwen_contract: Contract,
) -> None:
    metrics = RecordedStreamMetrics()
    stream = ExtProcStream(qwen_contract, Shape.WHOLE_EXCHANGE, metrics)
    stream.handle(request_headers({**POST_JSON, ":path": "/v1/embeddings"}))
    assert metrics.events == []  # accepted headers report nothing
    stream.handle(request_body(DIMS))
    stream.handle(response_headers(200))
    stream.handle(response_body(b64_body(unit_rows(2))))
    assert event_names(metrics) == [
        "forwarded",
        "phase_seconds",
        "upstream_response",
        "phase_seconds",
        "stream_seconds",
        "response_rewritten",
    ]
    _, stats, rewritten = metrics.events[0]
    assert rewritten and stats.inputs == 2 and stats.dimensions_emulated
    assert metrics.events[1] == ("phase_seconds", "request")
    assert metrics.events[2] == ("upstream_response", 200, False)
    assert metrics.events[3] == ("phase_seconds", "response")
    assert metrics.events[5] == ("response_rewritten", "vectors")
    assert all(0 <= seconds < 60 for seconds in metrics.seconds)
    # The whole stream took at least its two processing phases.
    assert metrics.seconds[2] >= metrics.seconds[0] + metrics.seconds[1]


def test_a_response_left_alone_reports_the_stream_time_once(qwen_contract: Contract) -> None:
    metrics = RecordedStreamMetrics()
    stream = ExtProcStream(qwen_contract, Shape.RESPONSE_ON_SECOND_STREAM, metrics)
    stream.handle(request_body(PLAIN))
    stream.handle(response_headers(200))
    assert stream.reply_sent()  # left alone: the stream ends with its reply
    stream.handle(response_body(b"{}"))  # nothing after that is processed
    assert event_names(metrics) == [
        "forwarded",
        "phase_seconds",
        "upstream_response",
        "stream_seconds",
        "anomaly",
    ]
    assert metrics.events[0][2] is False  # forwarded as sent


@pytest.mark.parametrize(
    ("message", "rejection", "timed"),
    [
        pytest.param(request_body(b"{not json"), ("rejected", 400, None), True, id="body"),
        pytest.param(
            request_body({"model": MODEL, "input": "x", "dimensions": 31}),
            ("rejected", 400, "dimensions"),
            True,
            id="body-param",
        ),
        pytest.param(
            request_headers({":method": "GET", ":path": "/v1/embeddings"}, eos=True),
            ("rejected", 405, None),
            False,
            id="headers",
        ),
    ],
)
def test_a_refused_request_reports_its_rejection_and_no_forward(
    message: ep.ProcessingRequest,
    rejection: tuple[Any, ...],
    timed: bool,
    qwen_contract: Contract,
) -> None:
    metrics = RecordedStreamMetrics()
    stream = ExtProcStream(qwen_contract, Shape.WHOLE_EXCHANGE, metrics)
    stream.handle(message)
    timing = [("phase_seconds", "request")] if timed else []
    assert metrics.events == [*timing, rejection]


def test_envoy_local_reply_reports_a_local_status(qwen_contract: Contract) -> None:
    metrics = RecordedStreamMetrics()
    stream = ExtProcStream(qwen_contract, Shape.RESPONSE_ON_SECOND_STREAM, metrics)
    stream.handle(skipped_headers_body(b"{}", 504, details="upstream_response_timeout"))
    assert metrics.events == [("upstream_response", 504, True)]


def test_a_bodyless_error_reports_an_envelope(qwen_contract: Contract) -> None:
    metrics = RecordedStreamMetrics()
    stream = ExtProcStream(qwen_contract, Shape.WHOLE_EXCHANGE, metrics)
    stream.handle(request_body(PLAIN))
    stream.handle(response_headers(404, eos=True))
    assert metrics.events[-2:] == [
        ("upstream_response", 404, False),
        ("response_rewritten", "error_envelope"),
    ]


def test_anomalies_are_reported_by_message_kind(qwen_contract: Contract) -> None:
    metrics = RecordedStreamMetrics()
    stream = ExtProcStream(qwen_contract, Shape.RESPONSE_ON_SECOND_STREAM, metrics)
    stream.handle(ep.ProcessingRequest())
    stream.handle(skipped_headers_body(b"{}", None))  # no status attribute
    stream.handle(_trailers_req())
    stream.handle(request_body(PLAIN))
    stream.handle(request_body(PLAIN))
    stream.handle(request_headers(POST_JSON))
    stream.handle(_trailers_resp())
    assert metrics.named("anomaly") == [
        ("anomaly", "unknown_message"),
        ("anomaly", "response_body"),
        ("anomaly", "request_body"),
        ("anomaly", "request_headers"),
    ]


# -- the shapes, as the servicer reads them ------------------------------------------


@pytest.mark.parametrize(
    ("metadata", "shape"),
    [
        pytest.param((), Shape.WHOLE_EXCHANGE, id="single-filter"),
        pytest.param(
            (("x-embgw-one-message", "1"),), Shape.RESPONSE_ON_SECOND_STREAM, id="one-message"
        ),
        pytest.param(
            (("x-embgw-one-message", "1"), ("x-embgw-response-on-stream", "1")),
            Shape.RESPONSE_BODY_ON_THIS_STREAM,
            id="one-stream-route",
        ),
        pytest.param(
            (("x-embgw-response-on-stream", "1"),), Shape.WHOLE_EXCHANGE, id="route-mark-alone"
        ),
        pytest.param(
            (("x-embgw-one-message", "0"), ("user-agent", "grpc-c++")),
            Shape.WHOLE_EXCHANGE,
            id="not-1",
        ),
    ],
)
def test_the_shape_comes_from_the_streams_grpc_metadata(
    metadata: tuple[tuple[str, str], ...], shape: Shape
) -> None:
    assert stream_shape(metadata) is shape


class _Context:
    """What the servicer reads of grpc.aio's ServicerContext: the stream's metadata."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


async def _process(
    contract: Contract,
    metadata: tuple[tuple[str, str], ...],
    messages: list[ep.ProcessingRequest],
    metrics: RecordedStreamMetrics,
) -> list[ep.ProcessingResponse]:
    async def requests() -> AsyncIterator[ep.ProcessingRequest]:
        for message in messages:
            yield message

    servicer = ExternalProcessor(ContractHolder(contract), metrics)
    context: Any = _Context(metadata)  # grpc.aio's ServicerContext, as far as read
    return [reply async for reply in servicer.Process(requests(), context)]


@pytest.mark.parametrize(
    ("metadata", "replies"),
    [
        pytest.param((), 2, id="whole-exchange-stays-open"),
        pytest.param((("x-embgw-one-message", "1"),), 1, id="one-message-ends"),
    ],
)
def test_the_servicer_ends_a_one_message_stream_after_its_reply(
    metadata: tuple[tuple[str, str], ...], replies: int, qwen_contract: Contract
) -> None:
    """The servicer's decision from the shape: a one-message stream whose request
    needs nothing more ends after its reply; a whole-exchange stream waits for the
    response. Its events: the stream opened and closed, the work admitted and given back."""
    metrics = RecordedStreamMetrics()
    messages = [request_body(PLAIN), response_headers(200)]
    got = asyncio.run(_process(qwen_contract, metadata, messages, metrics))
    assert [reply.WhichOneof("response") for reply in got] == [
        "request_body",
        "response_headers",
    ][:replies]
    names = event_names(metrics)
    assert names[0] == "stream_opened" and names[-1] == "stream_closed"
    in_flight = [event[1] for event in metrics.named("admission_in_flight")]
    assert in_flight[0] > 0 and in_flight[-1] == 0
    assert "forwarded" in names and "anomaly" not in names


def test_the_servicer_answers_an_exception_with_a_500_and_ends_the_stream(
    qwen_contract: Contract, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug of ours fails closed: the envelope's 500, never a "continue" that would
    forward the request unrewritten, and the stream is over (DONE), so the servicer
    ends it as it ends any answered stream."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr("extproc.core.tasks.embed.plan_request", broken)
    metrics = RecordedStreamMetrics()
    messages = [request_body(PLAIN), response_headers(200)]
    got = asyncio.run(_process(qwen_contract, (), messages, metrics))
    assert len(got) == 1
    error = assert_immediate(got[0], 500)
    assert error["code"] == "gateway_error" and error["type"] == "server_error"
    assert metrics.named("anomaly") == [("anomaly", "internal_error")]
    assert event_names(metrics)[-1] == "stream_closed"
