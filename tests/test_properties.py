"""Property tests of the sans-I/O core (hypothesis).

Example counts are kept modest so the whole file runs in well under a minute.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tokenizers import Tokenizer

from extproc.core.api_errors import ApiError
from extproc.core.contract import Contract
from extproc.core.dialects import OPENAI
from extproc.core.endpoint import Endpoint
from extproc.core.error_dialect import OPENAI_ERRORS
from extproc.core.plan import Encoding, ResponsePlan
from extproc.core.request_rewrite import Forward, rewrite_request
from extproc.core.response_rewrite import rewrite_response
from extproc.core.vectors import decode_rows, encode_base64, truncate_renormalise
from testing_support.http import envelope_error

MODEL = "Qwen/Qwen3-Embedding-0.6B"
EOS = 151643
LIMIT = 1024
QUERY_PREFIX = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)


def cfg(max_examples: int) -> settings:
    """Modest example counts, no deadline, no example database written into the repo."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@pytest.fixture(scope="module")
def raw_tok(qwen_dir: Path) -> Tokenizer:
    tok = Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def check_request(body: bytes, contract: Contract) -> Forward | None:
    """The property: a Forward, or an ApiError with a 4xx status - nothing else."""
    try:
        forward = rewrite_request(body, contract.policy, contract.tokenizers, clock=time.monotonic)
    except ApiError as exc:
        assert 400 <= exc.status < 500, repr(exc)
        envelope_error(exc.envelope())
        return None
    assert isinstance(forward, Forward)
    if forward.upstream_body is not None:
        doc = orjson.loads(forward.upstream_body)
        assert isinstance(doc, dict)
        assert not {"dimensions", "input_type", "instruction"} & set(doc)
    return forward


# -- (1) arbitrary bodies ----------------------------------------------------------------

INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
scalars = (
    st.none()
    | st.booleans()
    | INT64
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=25,
)
FIELDS = [
    "model",
    "input",
    "encoding_format",
    "dimensions",
    "input_type",
    "instruction",
    "truncate_prompt_tokens",
    "user",
]
field_values = st.one_of(
    json_values,
    st.sampled_from([MODEL, "query", "document", "float", "base64", 256, 32, 1024, -1, 0]),
    st.lists(st.integers(min_value=-5, max_value=160_000), max_size=6),
    st.lists(st.lists(st.integers(min_value=-1, max_value=152_000), max_size=4), max_size=3),
    st.lists(st.text(max_size=15), max_size=4),
)
near_valid = st.fixed_dictionaries(
    {"model": st.sampled_from([MODEL, MODEL]) | json_values, "input": field_values},
    optional={name: field_values for name in FIELDS[2:]},
)


@cfg(200)
@given(value=json_values)
def test_any_json_body_is_forwarded_or_4xx(value: Any, qwen_contract: Contract) -> None:
    check_request(orjson.dumps(value), qwen_contract)


@cfg(300)
@given(value=near_valid)
def test_any_near_valid_body_is_forwarded_or_4xx(
    value: dict[str, Any], qwen_contract: Contract
) -> None:
    check_request(orjson.dumps(value), qwen_contract)


@cfg(200)
@given(body=st.binary(max_size=300))
@example(body=b"\xef\xbb\xbf{}")
@example(body=b'{"model": "Qwen/Qwen3-Embedding-0.6B", "input": "\\ud800"}')
@example(body=b'{"model": "Qwen/Qwen3-Embedding-0.6B", "input": [99999999999999999999999]}')
@example(body=b"[" * 2000)
def test_any_bytes_body_is_forwarded_or_4xx(body: bytes, qwen_contract: Contract) -> None:
    check_request(body, qwen_contract)


# -- (2) the upstream never receives more than the limit -----------------------------------

alphabets = st.sampled_from(
    [
        # any character a JSON body can carry as UTF-8 (lone surrogates are the hostile
        # corpus's: a 400 before any limit applies)
        st.characters(codec="utf-8"),
        st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF),  # CJK
        st.characters(min_codepoint=0xAC00, max_codepoint=0xD7A3),  # Hangul syllables
        st.characters(min_codepoint=0x1100, max_codepoint=0x11FF),  # Hangul jamo (NFC changes)
        st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF),  # emoji
        st.characters(codec="ascii"),
        st.sampled_from([" ", "\n", "\t", "\u3000", "\u200d", "\u0301"]),
    ]
)


@st.composite
def texts(draw: st.DrawFn) -> str:
    unit = draw(st.text(alphabet=draw(alphabets), min_size=1, max_size=40))
    repeat = draw(st.sampled_from([1, 1, 2, 10, 50, 200, 600]))
    return unit * repeat


@cfg(120)
@given(
    inputs=st.lists(texts(), min_size=1, max_size=4),
    input_type=st.sampled_from([None, "query", "document"]),
)
def test_upstream_never_gets_more_than_the_limit(
    inputs: list[str], input_type: str | None, qwen_contract: Contract, raw_tok: Tokenizer
) -> None:
    body: dict[str, Any] = {"model": MODEL, "input": inputs}
    if input_type is not None:
        body["input_type"] = input_type
    forward = check_request(orjson.dumps(body), qwen_contract)
    assert forward is not None
    prefix = QUERY_PREFIX if input_type == "query" else ""
    prompts = [prefix + t for t in inputs]
    if forward.upstream_body is None:
        sent: list[Any] = list(inputs)
    else:
        got = orjson.loads(forward.upstream_body)["input"]
        sent = [got] if isinstance(got, str) else list(got)
    assert len(sent) == len(inputs)
    for prompt, item in zip(prompts, sent, strict=True):
        if isinstance(item, str):
            assert item == prompt
            assert len(raw_tok.encode(item, add_special_tokens=False).ids) + 1 <= LIMIT
        else:
            assert len(item) <= LIMIT
            assert item[-1] == EOS
            full = raw_tok.encode(prompt, add_special_tokens=False).ids
            assert item[:-1] == full[: len(item) - 1]
            assert len(item) == min(LIMIT, len(full) + 1)


# -- (3) Matryoshka re-normalisation ---------------------------------------------------


@st.composite
def matrices_and_d(draw: st.DrawFn) -> tuple[npt.NDArray[np.float32], int]:
    rows = draw(st.integers(1, 6))
    cols = draw(st.integers(1, 96))
    elements = st.floats(min_value=-1e3, max_value=1e3, width=32, allow_subnormal=False)
    matrix = draw(hnp.arrays(np.float32, (rows, cols), elements=elements))
    d = draw(st.integers(1, cols))
    return matrix, d


@cfg(300)
@given(case=matrices_and_d())
def test_truncate_renormalise_gives_unit_norms(case: tuple[npt.NDArray[np.float32], int]) -> None:
    matrix, d = case
    out = truncate_renormalise(matrix.copy(), d)  # a copy: see the aliasing test below
    assert out.shape == (matrix.shape[0], d)
    assert out.dtype == np.float32
    head = matrix[:, :d].astype(np.float64)
    norms = np.linalg.norm(head, axis=1)
    for row in range(matrix.shape[0]):
        if norms[row] > 1e-3:
            assert abs(float(np.linalg.norm(out[row].astype(np.float64))) - 1.0) <= 1e-5
            np.testing.assert_allclose(out[row], head[row] / norms[row], atol=1e-5)
        elif norms[row] == 0:
            assert not out[row].any()


@pytest.mark.parametrize(
    ("shape", "d"),
    [
        pytest.param((1, 1024), 256, id="one-row"),
        pytest.param((3, 8), 8, id="full-width"),
        pytest.param((3, 8), 4, id="several-rows"),
    ],
)
def test_truncate_renormalise_leaves_its_input_alone(shape: tuple[int, int], d: int) -> None:
    matrix = np.arange(1, 1 + shape[0] * shape[1], dtype=np.float32).reshape(shape)
    original = matrix.copy()
    truncate_renormalise(matrix, d)
    np.testing.assert_array_equal(matrix, original)


# -- (4) base64 round trip ------------------------------------------------------------------

finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True)


@cfg(300)
@given(vector=hnp.arrays(np.float32, st.integers(1, 64), elements=finite32))
@example(vector=np.array([-0.0, 0.0], dtype=np.float32))
@example(vector=np.array([1.4e-45, -1.4e-45, 1.1754942e-38], dtype=np.float32))  # subnormals
@example(vector=np.array([3.4028235e38, -3.4028235e38, 1e-30], dtype=np.float32))
def test_base64_round_trip_is_bit_exact(vector: npt.NDArray[np.float32]) -> None:
    text = encode_base64(vector)
    raw = np.frombuffer(base64.b64decode(text), dtype="<f4")
    np.testing.assert_array_equal(raw.view(np.uint32), vector.view(np.uint32))
    decoded = decode_rows([text], vector.size)
    np.testing.assert_array_equal(decoded[0].view(np.uint32), vector.view(np.uint32))


@cfg(150)
@given(
    matrix=hnp.arrays(
        np.float32, st.tuples(st.integers(1, 4), st.integers(1, 48)), elements=finite32
    )
)
def test_float_answer_round_trips_float32_bits(matrix: npt.NDArray[np.float32]) -> None:
    """base64 upstream -> float client: the JSON floats parse back to the same float32s."""
    n, dim = matrix.shape
    plan = ResponsePlan(MODEL, n, dim, "dynamo", Encoding.FLOAT, Encoding.BASE64)
    body = orjson.dumps(
        {"data": [{"index": i, "embedding": encode_base64(matrix[i])} for i in range(n)]}
    )
    answer = rewrite_response(plan, 200, body)
    assert answer is not None and answer.status == 200
    rows = [item["embedding"] for item in orjson.loads(answer.body)["data"]]
    back = np.asarray(rows, dtype=np.float64).astype(np.float32)
    np.testing.assert_array_equal(back.view(np.uint32), matrix.view(np.uint32))


# -- (5) any upstream answer -------------------------------------------------------------

PLANS = [
    None,
    ResponsePlan(MODEL, 1, 4, "dynamo", Encoding.FLOAT, Encoding.FLOAT),
    ResponsePlan(MODEL, 2, 4, "vllm", Encoding.FLOAT, Encoding.BASE64, dimensions=2),
    ResponsePlan(MODEL, 1, 4, "dynamo", Encoding.BASE64, Encoding.FLOAT),
]

error_bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(orjson.dumps),
    st.builds(
        lambda m, t, c: orjson.dumps({"message": m, "type": t, "code": c}),
        st.text(max_size=30) | st.none(),
        st.text(max_size=10),
        INT64,
    ),
    st.builds(
        lambda m, p: orjson.dumps({"error": {"message": m, "param": p, "code": 400}}),
        json_values,
        json_values,
    ),
)


@cfg(400)
@given(
    plan_index=st.integers(0, len(PLANS) - 1),
    status=st.integers(100, 599),
    body=error_bodies,
)
def test_any_upstream_answer_is_handled(plan_index: int, status: int, body: bytes) -> None:
    plan = PLANS[plan_index]
    endpoint = Endpoint("/v1/embeddings", OPENAI, "/v1/embeddings", OPENAI_ERRORS)
    answer = endpoint.answer(plan, status, body)
    if answer is None:
        assert 200 <= status < 300
        return
    if 200 <= answer.status < 300:
        assert 200 <= status < 300 and plan is not None
        orjson.loads(answer.body)
        return
    assert answer.status >= 400
    envelope_error(answer.body)
    if plan is not None and status >= 500:
        assert answer.status >= 500
    if not 200 <= status < 300 and status >= 400 and plan is None:
        assert answer.status == status
