"""The request line and header checks of extproc/core/request_target.py."""

from __future__ import annotations

import pytest

from extproc.core.errors import ApiError
from extproc.core.request_target import (
    UPSTREAM_PATH,
    check_content_encoding,
    check_method,
    upstream_path,
)


@pytest.mark.parametrize(
    "path",
    ["/v1/embeddings", "/embeddings", "/v1/embeddings?", "/embeddings?x=1&y", "///v1//embeddings"],
)
def test_endpoint_spellings_map_to_the_upstream_path(path: str) -> None:
    assert upstream_path(path) == UPSTREAM_PATH == "/v1/embeddings"


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
def test_other_paths_are_a_404(path: str) -> None:
    with pytest.raises(ApiError) as caught:
        upstream_path(path)
    assert (caught.value.status, caught.value.code) == (404, "unknown_url")


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
