"""What upstreams answer, read by the core: the embeddings-body parser, the
error-body parser, the status classes, and the adapter of each upstream kind."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
import pytest

from extproc.core.embeddings_body import parse_embeddings_body
from extproc.core.plan import Encoding, ResponsePlan
from extproc.core.registry import UnknownNameError
from extproc.core.response_rewrite import rewrite_response
from extproc.core.status import is_success, status_class
from extproc.core.upstream_errors import UpstreamError, parse_upstream_error
from extproc.core.upstreams import (
    ADAPTERS,
    Capabilities,
    UpstreamAsk,
    adapter_for,
)
from extproc.core.vectors import BadVectorsError


def b64(values: list[float]) -> str:
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode("ascii")


def body(data: list[Any], **extra: Any) -> bytes:
    return orjson.dumps({"object": "list", "data": data, "model": "m", **extra})


# -- parse_embeddings_body ---------------------------------------------------------------


def test_rows_come_back_in_index_order_with_the_whole_doc() -> None:
    raw = body(
        [
            {"object": "embedding", "index": 1, "embedding": [0.0, 1.0]},
            {"object": "embedding", "index": 0, "embedding": [1.0, 0.0]},
        ],
        usage={"prompt_tokens": 7, "total_tokens": 7},
    )
    parsed = parse_embeddings_body(raw)
    assert parsed.vectors.dtype == np.float32
    assert parsed.vectors.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert [item["index"] for item in parsed.items] == [0, 1]
    assert parsed.items[0] is parsed.doc["data"][1]  # the parsed objects themselves
    assert parsed.doc["model"] == "m"
    assert (parsed.encoding, parsed.prompt_tokens) == ("float", 7)


@pytest.mark.parametrize(
    ("embeddings", "encoding"),
    [
        pytest.param([[0.5, 0.5], [1.0, 0.0]], "float", id="float"),
        pytest.param([b64([0.5, 0.5]), b64([1.0, 0.0])], "base64", id="base64"),
        pytest.param([b64([0.5, 0.5]), [1.0, 0.0]], "mixed", id="mixed"),
    ],
)
def test_encoding_is_reported(embeddings: list[Any], encoding: str) -> None:
    raw = body([{"index": i, "embedding": e} for i, e in enumerate(embeddings)])
    parsed = parse_embeddings_body(raw, input_count=2, dimensions=2)
    assert parsed.encoding == encoding
    assert parsed.vectors.tolist() == [[0.5, 0.5], [1.0, 0.0]]


@pytest.mark.parametrize(
    "usage",
    [
        pytest.param(None, id="no-usage"),
        pytest.param({"prompt_tokens": True}, id="bool"),
        pytest.param({"prompt_tokens": 3.0}, id="float"),
        pytest.param({"prompt_tokens": "3"}, id="string"),
        pytest.param([3], id="usage-not-object"),
    ],
)
def test_prompt_tokens_only_when_an_int(usage: Any) -> None:
    parsed = parse_embeddings_body(body([{"index": 0, "embedding": [1.0]}], usage=usage))
    assert parsed.prompt_tokens is None


def test_width_is_the_first_rows_when_not_given() -> None:
    parsed = parse_embeddings_body(body([{"index": 0, "embedding": b64([0.25] * 5)}]))
    assert parsed.vectors.shape == (1, 5)


def test_no_rows_is_an_empty_matrix() -> None:
    assert parse_embeddings_body(body([])).vectors.shape == (0, 0)


@pytest.mark.parametrize(
    ("raw", "kwargs", "says"),
    [
        pytest.param(b"{", {}, "not json", id="not-json"),
        pytest.param(b"[]", {}, "'data'", id="no-data"),
        pytest.param(
            body([{"index": 0, "embedding": [1.0]}]),
            {"input_count": 2},
            "1 embeddings for 2",
            id="count",
        ),
        pytest.param(
            body([{"index": 0, "embedding": [1.0]}]),
            {"dimensions": 2},
            "expected 2",
            id="dimensions",
        ),
        pytest.param(
            body([{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1.0, 2.0]}]),
            {},
            "expected 1",
            id="ragged",
        ),
        pytest.param(
            body([{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}]),
            {},
            "'index'",
            id="index-twice",
        ),
        pytest.param(body([{"embedding": [1.0]}]), {}, "'index'", id="index-missing"),
        pytest.param(body([{"index": 0, "embedding": [None]}]), {}, "null", id="null"),
        pytest.param(
            body([{"index": 0, "embedding": ["1"]}]), {}, "not numbers", id="string-number"
        ),
        pytest.param(body([{"index": 0, "embedding": [1e39]}]), {}, "infinite", id="overflow"),
        pytest.param(
            body([{"index": 0, "embedding": b64([float("nan")])}]), {}, "nan", id="b64-nan"
        ),
        pytest.param(body([{"index": 0, "embedding": "AAA"}]), {}, "base64", id="bad-base64"),
        pytest.param(
            body([{"index": 0, "embedding": "AAAAAAA="}]), {}, "whole float32", id="partial-float"
        ),
        pytest.param(body([{"index": 0, "embedding": []}]), {}, "empty", id="empty-row"),
        pytest.param(body([{"index": 0, "embedding": {"x": 1}}]), {}, "neither", id="object-row"),
        pytest.param(body([{"index": 0}]), {}, "neither", id="no-embedding"),
    ],
)
def test_bad_bodies_name_the_first_problem(raw: bytes, kwargs: dict[str, int], says: str) -> None:
    with pytest.raises(BadVectorsError) as caught:
        parse_embeddings_body(raw, **kwargs)
    assert says in str(caught.value).lower()


# -- parse_upstream_error ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        pytest.param(
            b'{"message":"Model not found","type":"Not Found","code":404}',
            UpstreamError("Model not found", shape="flat"),
            id="dynamo-flat",
        ),
        pytest.param(b"", UpstreamError(None, shape="empty"), id="dynamo-empty-404"),
        pytest.param(
            b'{"error":{"message":"too long","type":"BadRequestError","param":"input","code":400}}',
            UpstreamError("too long", "input", "openai"),
            id="vllm-nested",
        ),
        pytest.param(
            b'{"error":"plain"}', UpstreamError("plain", shape="error-string"), id="error-string"
        ),
        pytest.param(
            b'{"detail":"Not Found"}', UpstreamError("Not Found", shape="detail"), id="fastapi-text"
        ),
        pytest.param(
            b'{"detail":[{"type":"missing","loc":["body","input"],"msg":"Field required"}]}',
            UpstreamError("body.input: Field required", "input", "detail-list"),
            id="fastapi-list",
        ),
        pytest.param(
            b'{"detail":[{"loc":["body","dimensions"],"msg":"must be > 0"},'
            b'{"loc":["query","x"],"msg":"bad"},"junk",{"msg":"no location"}]}',
            UpstreamError(
                "body.dimensions: must be > 0; query.x: bad; no location",
                "dimensions",
                "detail-list",
            ),
            id="fastapi-several",
        ),
        pytest.param(
            b'{"detail":[{"loc":["body"],"msg":" "}]}',
            UpstreamError("body: invalid", shape="detail-list"),
            id="fastapi-blank-msg",
        ),
        pytest.param(
            b'{"detail":[]}', UpstreamError(None, shape="detail-list"), id="fastapi-empty-list"
        ),
        pytest.param(
            b"<html><b>Bad\r\n gateway</b></html>",
            UpstreamError("<html><b>Bad gateway</b></html>", shape="text"),
            id="html",
        ),
        pytest.param(b'["a"]', UpstreamError(None), id="json-array"),
        pytest.param(b'{"message":"  "}', UpstreamError(None, shape="flat"), id="blank-message"),
    ],
)
def test_error_bodies(raw: bytes, want: UpstreamError) -> None:
    assert parse_upstream_error(raw) == want


# -- status ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "success", "klass"),
    [
        (200, True, "2xx"),
        (299, True, "2xx"),
        (199, False, "1xx"),
        (300, False, "3xx"),
        (404, False, "4xx"),
        (503, False, "5xx"),
        (0, False, "no answer"),
        (-1, False, "no answer"),
    ],
)
def test_status(status: int, success: bool, klass: str) -> None:
    assert (is_success(status), status_class(status)) == (success, klass)


# -- adapters ----------------------------------------------------------------------------

# What each kind answers for two inputs (docs/upstreams.md): Dynamo writes no 'id' or
# 'created' and float32 reprs; vLLM writes both and float64 reprs.
SUCCESS = {
    "dynamo": b'{"object":"list","data":[{"object":"embedding","index":1,"embedding":[0.0,1.0]},'
    b'{"object":"embedding","index":0,"embedding":[0.6,0.8]}],"model":"m",'
    b'"usage":{"prompt_tokens":6,"total_tokens":6}}',
    "vllm": b'{"id":"embd-1","object":"list","created":1,"model":"m","data":['
    b'{"index":0,"object":"embedding","embedding":[0.6000000238418579,0.800000011920929]},'
    b'{"index":1,"object":"embedding","embedding":[0.0,1.0]}],'
    b'"usage":{"prompt_tokens":6,"total_tokens":6,"completion_tokens":0}}',
}


def test_registry_names_each_adapter_by_its_own_name() -> None:
    assert sorted(ADAPTERS) == ["dynamo", "vllm"]
    for name, adapter in ADAPTERS.items():
        assert adapter.name == name
        assert adapter_for(name) is adapter
        assert adapter.summary


def test_unknown_kind_names_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match=r"'tei' \(known: dynamo, vllm\)"):
        adapter_for("tei")


@pytest.mark.parametrize("kind", sorted(ADAPTERS))
def test_capabilities_every_deployment_has(kind: str) -> None:
    # Both forward a valid truncate_prompt_tokens to vLLM's pooling; `dimensions` depends on
    # how the model was started, so no kind claims it by default. Emulation reads base64.
    adapter = adapter_for(kind)
    assert adapter.defaults == Capabilities(dimensions=False, truncate_prompt_tokens=True)
    assert adapter.vectors_encoding == "base64"


# What each adapter is asked: both kinds take OpenAI's request shape.
ASK = UpstreamAsk(model="m", input=None, encoding="float")


@pytest.mark.parametrize("kind", sorted(ADAPTERS))
@pytest.mark.parametrize(
    ("sent", "ask"),
    [
        pytest.param({"model": "m", "input": "x"}, ASK, id="bare"),
        pytest.param(
            {"model": "m", "input": [1, 2], "encoding_format": "float", "user": "u", "x": [{}]},
            ASK,
            id="float-spelled-out",
        ),
        pytest.param(
            {"input": "x", "model": "m", "encoding_format": "base64", "dimensions": 8},
            UpstreamAsk(model="m", input=None, encoding="base64", dimensions=8),
            id="native-dimensions-base64",
        ),
        pytest.param(
            {"model": "m", "input": "x", "truncate_prompt_tokens": -1},
            UpstreamAsk(model="m", input=None, encoding="float", truncate_prompt_tokens=-1),
            id="truncate-prompt-tokens",
        ),
    ],
)
def test_a_body_that_already_asks_it_goes_as_sent(
    kind: str, sent: dict[str, Any], ask: UpstreamAsk
) -> None:
    assert adapter_for(kind).write_request(ask, sent, force=False) is None
    # Forced (the client's body held more: a null, a prompt field, a byte order mark),
    # the same fields are written, float left out as every upstream's default.
    forced = adapter_for(kind).write_request(ask, sent, force=True)
    assert forced is not None
    expected = {k: v for k, v in sent.items() if (k, v) != ("encoding_format", "float")}
    assert list(orjson.loads(forced).items()) == list(expected.items())


@pytest.mark.parametrize("kind", sorted(ADAPTERS))
@pytest.mark.parametrize(
    ("sent", "ask", "written"),
    [
        pytest.param(
            {"model": "m", "input": "x"},
            UpstreamAsk(model="upstream/m", input=None, encoding="float"),
            b'{"model":"upstream/m","input":"x"}',
            id="model-renamed",
        ),
        pytest.param(
            {"input": "x", "model": "m"},
            UpstreamAsk(model="m", input=[[1, 2], [3]], encoding="float"),
            b'{"input":[[1,2],[3]],"model":"m"}',
            id="input-replaced-in-place",
        ),
        pytest.param(
            {"model": "m", "dimensions": 1024, "input": "x", "encoding_format": "float"},
            UpstreamAsk(model="m", input=None, encoding="base64"),
            b'{"model":"m","input":"x","encoding_format":"base64"}',
            id="dimensions-dropped-base64-asked",
        ),
        pytest.param(
            {"model": "m", "input": "x", "encoding_format": "base64", "extra": {"k": [1.5]}},
            ASK,
            b'{"model":"m","input":"x","extra":{"k":[1.5]}}',
            id="float-left-out",
        ),
        pytest.param(
            {"model": "m", "input": "x"},
            UpstreamAsk(model="m", input=None, encoding="base64"),
            b'{"model":"m","input":"x","encoding_format":"base64"}',
            id="encoding-added-last",
        ),
        pytest.param(
            {"dimensions": "256", "model": "m", "input": "x"},
            UpstreamAsk(model="m", input=None, encoding="float", dimensions=256),
            b'{"dimensions":256,"model":"m","input":"x"}',
            id="dimensions-string-as-integer",
        ),
        pytest.param(
            {"model": "m", "input": "x", "dimensions": 256.0},
            UpstreamAsk(model="m", input=None, encoding="float", dimensions=256),
            b'{"model":"m","input":"x","dimensions":256}',
            id="dimensions-float-as-integer",
        ),
        pytest.param(
            {"model": "m", "input": "x", "truncate_prompt_tokens": True},
            UpstreamAsk(model="m", input=None, encoding="float", truncate_prompt_tokens=1),
            b'{"model":"m","input":"x","truncate_prompt_tokens":1}',
            id="truncate-prompt-tokens-bool-as-integer",
        ),
    ],
)
def test_what_each_adapter_is_asked(
    kind: str, sent: dict[str, Any], ask: UpstreamAsk, written: bytes
) -> None:
    assert adapter_for(kind).write_request(ask, sent, force=False) == written


@pytest.mark.parametrize("kind", sorted(ADAPTERS))
@pytest.mark.parametrize("answer", sorted(SUCCESS))
def test_each_adapter_reads_both_success_shapes(kind: str, answer: str) -> None:
    parsed = adapter_for(kind).parse_success(SUCCESS[answer], input_count=2, dimensions=2)
    np.testing.assert_allclose(parsed.vectors, [[0.6, 0.8], [0.0, 1.0]], rtol=1e-7)
    assert parsed.prompt_tokens == 6


@pytest.mark.parametrize("kind", sorted(ADAPTERS))
def test_each_adapter_checks_success_against_the_request(kind: str) -> None:
    with pytest.raises(BadVectorsError, match="2 embeddings for 3 inputs"):
        adapter_for(kind).parse_success(SUCCESS["vllm"], input_count=3, dimensions=2)
    with pytest.raises(BadVectorsError, match="expected 4"):
        adapter_for(kind).parse_success(SUCCESS["vllm"], input_count=2, dimensions=4)


DYNAMO_500 = b'{"message":"Internal server error","type":"Internal Server Error","code":500}'
VLLM_404 = (
    b'{"error":{"message":"The model `m` does not exist.","type":"NotFoundError",'
    b'"param":null,"code":404}}'
)


@pytest.mark.parametrize(
    ("kind", "status", "raw", "want"),
    [
        pytest.param(
            "dynamo",
            404,
            b"",
            UpstreamError("empty answer: no Dynamo worker serves the model", shape="empty"),
            id="dynamo-worker-gone",
        ),
        pytest.param(
            "dynamo",
            500,
            DYNAMO_500,
            UpstreamError(
                "Internal server error; Dynamo writes the worker's reason only to its logs",
                shape="flat",
            ),
            id="dynamo-generic-500",
        ),
        pytest.param(
            "dynamo",
            400,
            b'{"message":"Invalid request","type":"Bad Request","code":400}',
            UpstreamError("Invalid request", shape="flat"),
            id="dynamo-flat",
        ),
        pytest.param(
            "dynamo",
            404,
            VLLM_404,
            UpstreamError("The model `m` does not exist.", shape="openai"),
            id="dynamo-nested",
        ),
        pytest.param("vllm", 404, b"", UpstreamError(None, shape="empty"), id="vllm-empty"),
        pytest.param(
            "vllm",
            500,
            DYNAMO_500,
            UpstreamError("Internal server error", shape="flat"),
            id="vllm-flat",
        ),
        pytest.param(
            "vllm",
            400,
            b'{"error":{"message":"too long","type":"BadRequestError","param":"input","code":400}}',
            UpstreamError("too long", "input", "openai"),
            id="vllm-nested",
        ),
    ],
)
def test_error_interpretation(kind: str, status: int, raw: bytes, want: UpstreamError) -> None:
    assert adapter_for(kind).parse_error(status, raw) == want


def _plan(kind: str) -> ResponsePlan:
    return ResponsePlan("m", 2, 2, kind, Encoding.FLOAT, Encoding.BASE64, dimensions=1)


def test_the_plans_adapter_reads_the_error() -> None:
    answer = rewrite_response(_plan("dynamo"), 404, b"")
    assert answer is not None and answer.status == 503
    assert "no Dynamo worker serves the model" in orjson.loads(answer.body)["error"]["message"]
    answer = rewrite_response(_plan("vllm"), 404, b"")
    assert answer is not None and answer.status == 503
    assert "Dynamo" not in orjson.loads(answer.body)["error"]["message"]


@pytest.mark.parametrize("kind", sorted(ADAPTERS))
def test_the_plan_carries_the_adapter_name(kind: str) -> None:
    text = _plan(kind).to_json()
    assert orjson.loads(text)[3] == kind
    assert ResponsePlan.from_json(text) == _plan(kind)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        # The older "flavour" field wrote these same strings.
        ('["m",2,2,"dynamo","float","base64",1,false]', "dynamo"),
        ('["m",2,2,"vllm","float","base64",1,false]', "vllm"),
        ('["m",2,2,"tei","float","base64",1,false]', None),
        ('["m",2,2,"DYNAMO","float","base64",1,false]', None),
        ('["m",2,2,["dynamo"],"float","base64",1,false]', None),
    ],
)
def test_plans_in_metadata(text: str, kind: str | None) -> None:
    plan = ResponsePlan.from_json(text)
    assert (plan.upstream_kind if plan else None) == kind
