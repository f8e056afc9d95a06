"""The request line and header checks of extproc/core/request_headers.py, and the
route table that maps a path to its endpoint (extproc/core/routes.py)."""

from __future__ import annotations

import orjson
import pytest

from extproc.core.api_errors import ApiError
from extproc.core.policy.model import GatewayPolicy
from extproc.core.request_headers import (
    UPSTREAM_PATH,
    check_content_encoding,
    check_content_type,
    check_method,
    route_of,
)
from extproc.core.routes import routes_of

ROUTES = routes_of(GatewayPolicy(models={}))


@pytest.mark.parametrize(
    "path",
    ["/v1/embeddings", "/embeddings", "/v1/embeddings?", "/embeddings?x=1&y", "///v1//embeddings"],
)
def test_endpoint_spellings_map_to_the_upstream_path(path: str) -> None:
    endpoint = ROUTES.at(route_of(path))
    assert endpoint is not None and endpoint.dialect.task == "embeddings"
    assert endpoint.upstream_path == UPSTREAM_PATH == "/v1/embeddings"


@pytest.mark.parametrize(
    "path",
    [
        "/V1/embeddings",
        "/v1/EMBEDDINGS",
        "/v1/embeddings;x=1",
        "/v1/embeddings%3B",
        "/v1/embeddings/",
        "/v1/embeddings/x",
        "/v1/embeddings.json",
        "/v1/v1/embeddings",
        "v1/embeddings",
        "",
        "?/v1/embeddings",
    ],
)
def test_other_paths_have_no_endpoint(path: str) -> None:
    assert ROUTES.at(route_of(path)) is None
    assert not ROUTES.left_alone(route_of(path))  # a 404, not the legacy server's


@pytest.mark.parametrize("method", ["GET", "PUT", "HEAD", "post", ""])
def test_only_post_is_accepted(method: str) -> None:
    with pytest.raises(ApiError) as caught:
        check_method(method)
    assert caught.value.status == 405
    check_method("POST")


@pytest.mark.parametrize("coding", [None, "identity", "IDENTITY", " identity\t"])
def test_uncompressed_bodies_are_read(coding: str | None) -> None:
    check_content_encoding(coding)


@pytest.mark.parametrize("coding", ["gzip", "br", "deflate", "zstd", "gzip, identity", "", "x"])
def test_any_other_coding_is_a_415(coding: str) -> None:
    with pytest.raises(ApiError) as caught:
        check_content_encoding(coding)
    assert (caught.value.status, caught.value.code) == (415, "unsupported_content_encoding")


# -- Content-Type ------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        pytest.param(None, id="none"),
        pytest.param("application/json", id="json"),
        pytest.param("application/json; charset=utf-8", id="json-charset"),
        pytest.param("Application/JSON", id="json-upper"),
        pytest.param(" application/json ", id="json-spaces"),
        pytest.param("text/json", id="text-json"),
        pytest.param("application/vnd.api+json", id="plus-json"),
    ],
)
def test_json_content_types_accepted(content_type: str | None) -> None:
    check_content_type(content_type)


@pytest.mark.parametrize(
    ("content_type", "media"),
    [
        pytest.param("text/plain", "text/plain", id="text-plain"),
        pytest.param("text/plain; charset=utf-8", "text/plain", id="text-plain-charset"),
        pytest.param(
            "application/x-www-form-urlencoded", "application/x-www-form-urlencoded", id="form"
        ),
        pytest.param("multipart/form-data; boundary=xyz", "multipart/form-data", id="multipart"),
        pytest.param("application/jsonl", "application/jsonl", id="jsonl"),
        pytest.param("", "", id="empty"),
    ],
)
def test_other_content_types_are_415(content_type: str, media: str) -> None:
    with pytest.raises(ApiError) as caught:
        check_content_type(content_type)
    exc = caught.value
    assert exc.status == 415
    assert exc.type == "invalid_request_error"
    assert repr(media) in exc.message
    assert "application/json" in exc.message
    envelope = orjson.loads(exc.envelope())
    assert set(envelope["error"]) == {"message", "type", "param", "code"}
