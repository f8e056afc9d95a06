"""What upstreams answer, read by the core: the embeddings-body parser, the
error-body parser and the status classes."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
import pytest

from extproc.core.embeddings_body import parse_embeddings_body
from extproc.core.status import is_success, status_class
from extproc.core.upstream_errors import UpstreamError, parse_upstream_error
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
            UpstreamError("Model not found"),
            id="dynamo-flat",
        ),
        pytest.param(b"", UpstreamError(None), id="dynamo-empty-404"),
        pytest.param(
            b'{"error":{"message":"too long","type":"BadRequestError","param":"input","code":400}}',
            UpstreamError("too long", "input"),
            id="vllm-nested",
        ),
        pytest.param(b'{"error":"plain"}', UpstreamError("plain"), id="error-string"),
        pytest.param(b'{"detail":"Not Found"}', UpstreamError("Not Found"), id="fastapi-text"),
        pytest.param(
            b'{"detail":[{"type":"missing","loc":["body","input"],"msg":"Field required"}]}',
            UpstreamError("body.input: Field required", "input"),
            id="fastapi-list",
        ),
        pytest.param(
            b'{"detail":[{"loc":["body","dimensions"],"msg":"must be > 0"},'
            b'{"loc":["query","x"],"msg":"bad"},"junk",{"msg":"no location"}]}',
            UpstreamError("body.dimensions: must be > 0; query.x: bad; no location", "dimensions"),
            id="fastapi-several",
        ),
        pytest.param(
            b'{"detail":[{"loc":["body"],"msg":" "}]}',
            UpstreamError("body: invalid"),
            id="fastapi-blank-msg",
        ),
        pytest.param(b'{"detail":[]}', UpstreamError(None), id="fastapi-empty-list"),
        pytest.param(
            b"<html><b>Bad\r\n gateway</b></html>",
            UpstreamError("<html><b>Bad gateway</b></html>"),
            id="html",
        ),
        pytest.param(b'["a"]', UpstreamError(None), id="json-array"),
        pytest.param(b'{"message":"  "}', UpstreamError(None), id="blank-message"),
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
