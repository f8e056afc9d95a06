"""Table-driven tests of the response half of the sans-I/O core.

Plans are built directly; expected vectors are computed here with numpy (float64
re-normalisation of the float32 prefix) and compared to what the gateway writes.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pytest

from extproc.core.dialects import OPENAI
from extproc.core.endpoint import ClientAnswer, Endpoint, needs_response_body
from extproc.core.error_dialect import OPENAI_ERRORS, ErrorDialect
from extproc.core.plan import Encoding, ResponsePlan
from testing_support.http import envelope_error

MODEL = "Qwen/Qwen3-Embedding-0.6B"
NATIVE = 1024

F32 = npt.NDArray[np.float32]


def client_answer(
    the_plan: ResponsePlan | None, status: int, body: bytes, errors: ErrorDialect = OPENAI_ERRORS
) -> ClientAnswer | None:
    """The embeddings endpoint's answer (the OpenAI dialect), as the stream asks it."""
    return Endpoint("/v1/embeddings", OPENAI, "/v1/embeddings", errors).answer(
        the_plan, status, body
    )


def plan(
    *,
    count: int = 3,
    dimensions: int | None = None,
    client: Encoding = Encoding.FLOAT,
    upstream: Encoding = Encoding.FLOAT,
    native: int = NATIVE,
    upstream_kind: str = "dynamo",
) -> ResponsePlan:
    return ResponsePlan(
        model=MODEL,
        input_count=count,
        native_dimensions=native,
        upstream_kind=upstream_kind,
        client_encoding=client,
        upstream_encoding=upstream,
        dimensions=dimensions,
    )


def unit_rows(count: int, dim: int = NATIVE, seed: int = 7) -> F32:
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((count, dim))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows.astype(np.float32)


def b64(row: npt.NDArray[Any]) -> str:
    return base64.b64encode(np.asarray(row, dtype="<f4").tobytes()).decode("ascii")


def from_b64(text: str) -> F32:
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


def embeddings_body(
    rows: npt.NDArray[Any] | list[Any],
    *,
    encoding: Encoding,
    order: list[int] | None = None,
    extra: dict[str, Any] | None = None,
) -> bytes:
    indices = order if order is not None else list(range(len(rows)))
    data = []
    for i in indices:
        row = rows[i]
        embedding: Any = b64(row) if encoding is Encoding.BASE64 else [float(x) for x in row]
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    doc: dict[str, Any] = {
        "object": "list",
        "data": data,
        "model": MODEL,
        "usage": {"prompt_tokens": 28, "total_tokens": 28},
    }
    doc.update(extra or {})
    return orjson.dumps(doc)


def expected_prefix(rows: F32, d: int) -> npt.NDArray[np.float64]:
    head = rows[:, :d].astype(np.float64)
    out: npt.NDArray[np.float64] = head / np.linalg.norm(head, axis=1, keepdims=True)
    return out


def answer_json(answer: ClientAnswer | None) -> dict[str, Any]:
    assert answer is not None
    doc = orjson.loads(answer.body)
    assert isinstance(doc, dict)
    return doc


def client_vectors(doc: dict[str, Any], encoding: Encoding) -> npt.NDArray[Any]:
    rows = [item["embedding"] for item in doc["data"]]
    if encoding is Encoding.BASE64:
        assert all(isinstance(r, str) for r in rows)
        return np.stack([from_b64(r) for r in rows])
    assert all(isinstance(r, list) for r in rows)
    return np.asarray(rows, dtype=np.float64)


def assert_envelope(answer: ClientAnswer | None, status: int, type_: str) -> dict[str, Any]:
    assert answer is not None
    assert answer.status == status, answer
    error = envelope_error(answer.body)
    assert error["type"] == type_
    return dict(error)


# -- needs_response_body -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("the_plan", "status", "needed"),
    [
        pytest.param(None, 200, False, id="unvalidated-200"),
        pytest.param(plan(), 200, False, id="float-float-200"),
        pytest.param(
            plan(client=Encoding.BASE64, upstream=Encoding.BASE64), 200, False, id="b64-b64-200"
        ),
        pytest.param(plan(dimensions=256, upstream=Encoding.BASE64), 200, True, id="dims-200"),
        pytest.param(plan(client=Encoding.BASE64), 200, True, id="float-to-b64-200"),
        pytest.param(plan(upstream=Encoding.BASE64), 200, True, id="b64-to-float-200"),
        pytest.param(plan(dimensions=256), 201, True, id="dims-201"),
        pytest.param(plan(), 404, True, id="404"),
        pytest.param(plan(), 500, True, id="500"),
        pytest.param(None, 503, True, id="unvalidated-503"),
        pytest.param(None, 400, True, id="unvalidated-400"),
        pytest.param(plan(), 302, True, id="302"),
        pytest.param(plan(), 100, True, id="100"),
    ],
)
def test_needs_response_body(the_plan: ResponsePlan | None, status: int, needed: bool) -> None:
    assert needs_response_body(the_plan, status) is needed


@pytest.mark.parametrize(
    "the_plan",
    [
        pytest.param(None, id="unvalidated"),
        pytest.param(plan(), id="no-rewrite"),
        pytest.param(plan(client=Encoding.BASE64, upstream=Encoding.BASE64), id="b64-no-rewrite"),
    ],
)
def test_success_without_rewrite_passes_through(the_plan: ResponsePlan | None) -> None:
    body = embeddings_body(unit_rows(3), encoding=Encoding.FLOAT)
    assert client_answer(the_plan, 200, body) is None


# -- vectors -------------------------------------------------------------------------


@pytest.mark.parametrize("dimensions", [32, 64, 256, 512, 1000, 1023])
@pytest.mark.parametrize("upstream", [Encoding.BASE64, Encoding.FLOAT], ids=["up-b64", "up-float"])
@pytest.mark.parametrize(
    "client", [Encoding.FLOAT, Encoding.BASE64], ids=["client-float", "client-b64"]
)
def test_matryoshka_prefix_renormalised(
    dimensions: int, upstream: Encoding, client: Encoding
) -> None:
    rows = unit_rows(4, seed=dimensions)
    body = embeddings_body(rows, encoding=upstream)
    answer = client_answer(
        plan(count=4, dimensions=dimensions, client=client, upstream=upstream), 200, body
    )
    doc = answer_json(answer)
    assert answer is not None and answer.status == 200
    got = client_vectors(doc, client)
    assert got.shape == (4, dimensions)
    np.testing.assert_allclose(got, expected_prefix(rows, dimensions), atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got.astype(np.float64), axis=1), 1.0, atol=1e-5)
    assert [item["index"] for item in doc["data"]] == [0, 1, 2, 3]


def test_float_and_base64_answers_carry_the_same_float32_bits() -> None:
    rows = unit_rows(3, seed=11)
    body = embeddings_body(rows, encoding=Encoding.BASE64)
    as_float = client_vectors(
        answer_json(client_answer(plan(dimensions=256, upstream=Encoding.BASE64), 200, body)),
        Encoding.FLOAT,
    ).astype(np.float32)
    as_b64 = client_vectors(
        answer_json(
            client_answer(
                plan(dimensions=256, upstream=Encoding.BASE64, client=Encoding.BASE64), 200, body
            )
        ),
        Encoding.BASE64,
    )
    assert as_b64.dtype == np.dtype("<f4")
    np.testing.assert_array_equal(as_float.view(np.uint32), as_b64.view(np.uint32))


def test_reencoding_without_dimensions_is_bit_exact() -> None:
    rows = unit_rows(3, seed=5)
    rows[0, :4] = [-0.0, 1.4e-45, 3.4028235e38, -1.1754944e-38]  # -0, subnormal, max, min normal
    # float upstream -> base64 client: base64 holds exactly the upstream float32s
    body = embeddings_body(rows, encoding=Encoding.FLOAT)
    doc = answer_json(client_answer(plan(client=Encoding.BASE64), 200, body))
    got = client_vectors(doc, Encoding.BASE64)
    np.testing.assert_array_equal(got.view(np.uint32), rows.view(np.uint32))
    # base64 upstream -> float client: each float parses back to the same float32
    body = embeddings_body(rows, encoding=Encoding.BASE64)
    doc = answer_json(client_answer(plan(upstream=Encoding.BASE64), 200, body))
    back = client_vectors(doc, Encoding.FLOAT).astype(np.float32)
    np.testing.assert_array_equal(back.view(np.uint32), rows.view(np.uint32))


@pytest.mark.parametrize(
    "order",
    [
        pytest.param([2, 0, 1], id="rotated"),
        pytest.param([3, 2, 1, 0], id="reversed"),
        pytest.param([1, 3, 0, 2], id="shuffled"),
    ],
)
def test_items_come_back_ordered_by_index(order: list[int]) -> None:
    n = len(order)
    rows = unit_rows(n, seed=3)
    body = embeddings_body(rows, encoding=Encoding.BASE64, order=order)
    doc = answer_json(
        client_answer(plan(count=n, dimensions=128, upstream=Encoding.BASE64), 200, body)
    )
    assert [item["index"] for item in doc["data"]] == list(range(n))
    np.testing.assert_allclose(
        client_vectors(doc, Encoding.FLOAT), expected_prefix(rows, 128), atol=1e-6
    )


def test_other_body_fields_are_kept() -> None:
    rows = unit_rows(2)
    extra = {"id": "embd-123", "created": 1700000000, "x_vendor": {"a": [1, 2]}}
    body = embeddings_body(rows, encoding=Encoding.BASE64, extra=extra)
    doc = answer_json(
        client_answer(plan(count=2, dimensions=64, upstream=Encoding.BASE64), 200, body)
    )
    assert doc["object"] == "list"
    assert doc["usage"] == {"prompt_tokens": 28, "total_tokens": 28}
    assert doc["model"] == MODEL
    for key, value in extra.items():
        assert doc[key] == value
    for item in doc["data"]:
        assert item["object"] == "embedding"
        assert set(item) == {"object", "index", "embedding"}


def test_zero_vector_stays_zero_and_finite() -> None:
    rows = unit_rows(2)
    rows[1, :64] = 0.0
    body = embeddings_body(rows, encoding=Encoding.BASE64)
    doc = answer_json(
        client_answer(plan(count=2, dimensions=64, upstream=Encoding.BASE64), 200, body)
    )
    got = client_vectors(doc, Encoding.FLOAT)
    assert np.isfinite(got).all()
    assert not got[1].any()


# -- invalid 2xx bodies -> 502 -------------------------------------------------------


def _b64_rows_with(value: float) -> bytes:
    rows = unit_rows(3)
    rows[1, 17] = value
    return embeddings_body(rows, encoding=Encoding.BASE64)


def _doc(data: Any) -> bytes:
    return orjson.dumps({"object": "list", "data": data, "model": MODEL})


_GOOD = unit_rows(3)

BAD_SUCCESS_BODIES: list[Any] = [
    pytest.param(
        embeddings_body(_GOOD[:2], encoding=Encoding.BASE64), ("2", "3"), id="too-few-items"
    ),
    pytest.param(
        embeddings_body(unit_rows(4), encoding=Encoding.BASE64), ("4", "3"), id="too-many-items"
    ),
    pytest.param(
        embeddings_body(unit_rows(3, dim=512), encoding=Encoding.BASE64),
        ("512", "1024"),
        id="b64-wrong-dimension",
    ),
    pytest.param(
        embeddings_body(unit_rows(3, dim=1023), encoding=Encoding.FLOAT),
        ("1023", "1024"),
        id="float-wrong-dimension",
    ),
    pytest.param(_b64_rows_with(float("nan")), ("nan",), id="b64-nan"),
    pytest.param(_b64_rows_with(float("inf")), ("inf",), id="b64-infinity"),
    pytest.param(_b64_rows_with(float("-inf")), ("inf",), id="b64-minus-infinity"),
    pytest.param(
        b'{"object":"list","data":[{"index":0,"embedding":[NaN]}]}',
        ("json",),
        id="json-nan-literal",
    ),
    pytest.param(
        b'{"object":"list","data":[{"index":0,"embedding":[Infinity]}]}',
        ("json",),
        id="json-infinity-literal",
    ),
    pytest.param(b"not json at all", ("json",), id="non-json"),
    pytest.param(b"", ("json",), id="empty"),
    pytest.param(b"<html><body>OK</body></html>", ("json",), id="html-200"),
    pytest.param(orjson.dumps({"object": "list", "model": MODEL}), ("data",), id="missing-data"),
    pytest.param(_doc(None), ("data",), id="null-data"),
    pytest.param(_doc({"0": []}), ("data",), id="object-data"),
    pytest.param(orjson.dumps([{"index": 0}]), ("data",), id="top-level-array"),
    pytest.param(_doc([1, 2, 3]), ("object",), id="items-not-objects"),
    pytest.param(_doc([{"index": i} for i in range(3)]), ("embedding",), id="missing-embedding"),
    pytest.param(
        _doc([{"index": i, "embedding": "!!notbase64!!"} for i in range(3)]),
        ("base64",),
        id="bad-base64",
    ),
    pytest.param(
        _doc([{"index": i, "embedding": "é" * 8} for i in range(3)]),
        ("base64",),
        id="non-ascii-base64",
    ),
    pytest.param(
        _doc([{"index": i, "embedding": ["x"] * NATIVE} for i in range(3)]),
        ("number",),
        id="strings-in-float-array",
    ),
    pytest.param(
        _doc([{"index": i, "embedding": [[0.1]] * NATIVE} for i in range(3)]),
        ("number",),
        id="nested-float-array",
    ),
    pytest.param(
        _doc([{"index": i, "embedding": [None] * NATIVE} for i in range(3)]),
        ("nan",),
        id="nulls-in-float-array",
    ),
    # 'index' must name each input exactly once (found by tests/test_faults_upstream.py:
    # these were 200s with vectors paired to the wrong inputs).
    *[
        pytest.param(
            _doc([{"index": i, "embedding": b64(r)} for i, r in zip(order, _GOOD, strict=True)]),
            ("index",),
            id=name,
        )
        for name, order in [
            ("index-duplicate", [0, 0, 1]),
            ("index-out-of-range", [1, 2, 3]),
            ("index-negative", [-1, 0, 1]),
            ("index-missing", [0, 1, None]),
            ("index-string", [0, 1, "2"]),
            ("index-boolean", [True, 0, 2]),
            ("index-float", [0, 1, 2.0]),
        ]
    ],
]


@pytest.mark.parametrize(
    "body", [p.values[0] for p in BAD_SUCCESS_BODIES], ids=[str(p.id) for p in BAD_SUCCESS_BODIES]
)
@pytest.mark.parametrize(
    "client", [Encoding.FLOAT, Encoding.BASE64], ids=["client-float", "client-b64"]
)
def test_invalid_success_body_is_502(body: bytes, client: Encoding) -> None:
    answer = client_answer(plan(dimensions=256, upstream=Encoding.BASE64, client=client), 200, body)
    error = assert_envelope(answer, 502, "server_error")
    assert "upstream" in error["message"].lower()


@pytest.mark.parametrize(("body", "says"), BAD_SUCCESS_BODIES)
def test_invalid_success_body_message_names_the_problem(body: bytes, says: tuple[str, ...]) -> None:
    answer = client_answer(plan(dimensions=256, upstream=Encoding.BASE64), 200, body)
    message = assert_envelope(answer, 502, "server_error")["message"].lower()
    for fragment in says:
        assert fragment in message, (fragment, message)


def test_float_array_overflowing_float32_is_502() -> None:
    data = [{"index": i, "embedding": [1e39] + [0.0] * (NATIVE - 1)} for i in range(3)]
    answer = client_answer(plan(dimensions=256, upstream=Encoding.FLOAT), 200, _doc(data))
    assert_envelope(answer, 502, "server_error")


# -- upstream errors ---------------------------------------------------------------------

UPSTREAM_MESSAGE = "Input length 2000 exceeds the maximum context length 1024"


def dynamo_body(status: int) -> bytes:
    return orjson.dumps({"message": UPSTREAM_MESSAGE, "type": "Bad Request", "code": status})


def vllm_body(status: int) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "message": UPSTREAM_MESSAGE,
                "type": "BadRequestError",
                "param": "input",
                "code": status,
            }
        }
    )


def html_body(status: int) -> bytes:
    return (
        f"<html>\r\n<head><title>{status} Upstream Trouble</title></head>\r\n"
        f"<body>\r\n<center><h1>{status} Upstream Trouble</h1></center>\r\n"
        "<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
    ).encode()


BODIES: dict[str, Callable[[int], bytes]] = {
    "dynamo-flat": dynamo_body,
    "vllm-nested": vllm_body,
    "empty": lambda status: b"",
    "html": html_body,
    "plain-text": lambda status: UPSTREAM_MESSAGE.encode(),
}
CARRIES_MESSAGE = {"dynamo-flat", "vllm-nested", "plain-text"}


def expected_status_and_type(status: int, validated: bool) -> tuple[int, str]:
    if validated and status == 404:
        return 503, "server_error"
    if status >= 500:
        return status, "server_error"
    return status, "invalid_request_error"


@pytest.mark.parametrize("validated", [True, False], ids=["validated", "unvalidated"])
@pytest.mark.parametrize("status", [400, 404, 415, 500, 503])
@pytest.mark.parametrize("shape", list(BODIES))
def test_upstream_error_is_enveloped(shape: str, status: int, validated: bool) -> None:
    the_plan = plan(dimensions=256, upstream=Encoding.BASE64) if validated else None
    answer = client_answer(the_plan, status, BODIES[shape](status))
    want_status, want_type = expected_status_and_type(status, validated)
    error = assert_envelope(answer, want_status, want_type)
    if shape in CARRIES_MESSAGE:
        assert UPSTREAM_MESSAGE in error["message"]
    else:
        assert str(status) in error["message"]  # at least says what the upstream answered
    if status >= 500:
        assert answer is not None and answer.status >= 500
    if shape == "vllm-nested" and 400 <= want_status < 500:
        assert error["param"] == "input"


@pytest.mark.parametrize("validated", [True, False], ids=["validated", "unvalidated"])
@pytest.mark.parametrize("status", [400, 404, 415, 500, 503])
def test_upstream_html_error_text_is_kept(status: int, validated: bool) -> None:
    the_plan = plan() if validated else None
    answer = client_answer(the_plan, status, html_body(status))
    want_status, want_type = expected_status_and_type(status, validated)
    error = assert_envelope(answer, want_status, want_type)
    assert "Upstream Trouble" in error["message"]


def test_dynamo_generic_500_stays_500() -> None:
    body = b'{"message":"Internal server error","type":"Internal Server Error","code":500}'
    error = assert_envelope(client_answer(plan(), 500, body), 500, "server_error")
    assert "Internal server error" in error["message"]


def test_dynamo_empty_404_after_worker_gone_is_503() -> None:
    error = assert_envelope(client_answer(plan(), 404, b""), 503, "server_error")
    assert MODEL in error["message"]
    assert "404" in error["message"]


def test_vllm_matryoshka_400_keeps_status_and_message() -> None:
    body = orjson.dumps(
        {
            "error": {
                "message": "Model 'x' does not support Matryoshka embeddings; dimensions must be unset.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        }
    )
    error = assert_envelope(client_answer(plan(), 400, body), 400, "invalid_request_error")
    assert "Matryoshka" in error["message"]
    assert error["param"] is None


@pytest.mark.parametrize(
    ("status", "want_type"),
    [
        pytest.param(401, "authentication_error", id="401"),
        pytest.param(403, "permission_error", id="403"),
        pytest.param(429, "rate_limit_error", id="429"),
        pytest.param(413, "invalid_request_error", id="413"),
        pytest.param(502, "server_error", id="502"),
        pytest.param(504, "server_error", id="504"),
    ],
)
def test_status_classes(status: int, want_type: str) -> None:
    assert_envelope(client_answer(plan(), status, dynamo_body(status)), status, want_type)


@pytest.mark.parametrize("status", [100, 101, 300, 301, 302, 304, 307])
def test_non_success_non_error_status_is_502(status: int) -> None:
    assert_envelope(client_answer(plan(), status, b"moved"), 502, "server_error")


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(orjson.dumps({"error": "plain string error"}), id="error-string"),
        pytest.param(orjson.dumps({"detail": "FastAPI style detail"}), id="detail"),
        pytest.param(orjson.dumps(["a", "list"]), id="json-array"),
        pytest.param(orjson.dumps({"error": {"message": 5}}), id="message-not-string"),
        pytest.param(b"\x00\x01\x02binary\xff", id="binary"),
        pytest.param(b"x" * 5000, id="long-text"),
    ],
)
@pytest.mark.parametrize("status", [400, 500])
def test_odd_error_bodies_still_enveloped(body: bytes, status: int) -> None:
    want_type = "server_error" if status >= 500 else "invalid_request_error"
    error = assert_envelope(client_answer(plan(), status, body), status, want_type)
    assert len(error["message"]) <= 1200
