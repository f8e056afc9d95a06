"""The legacy profile accepts what the legacy server's request model accepted.

That server was FastAPI: the body parsed as JSON, then validated by a pydantic v2
model in lax mode. The oracle here is pydantic itself, with a model mirroring the
legacy request (the fields the gateway interprets, typed as the legacy server and
OpenAI's API declare them). For every value of a field, the gateway must:

- refuse it (400, ``param`` = the field) exactly when pydantic refuses it;
- otherwise answer exactly as it answers the same request with pydantic's converted
  value spelled as a plain JSON value: same refusal (a converted ``dimensions`` may
  still be out of range) or the same plan and the same upstream body, so the upstream
  never sees the client's spelling (``"256"``, ``256.0``, ``[1.0]``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Literal

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from extproc.core.api_errors import ApiError
from extproc.core.contract import Contract
from extproc.core.lax import integral_float_int, lax_int
from extproc.core.request_rewrite import Forward, rewrite_request
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import Gateway, GatewaySpec
from testing_support.qwen import QWEN_MODEL
from tests.harness import Gateways

MODEL = QWEN_MODEL
BOM = b"\xef\xbb\xbf"


class LegacyRequest(BaseModel):
    """The legacy server's request, as FastAPI validated it (lax mode, extra ignored)."""

    model: str
    input: str | list[str] | list[int] | list[list[int]]
    dimensions: int | None = None
    encoding_format: Literal["float", "base64"] | None = None
    input_type: str | None = None
    instruction: str | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None


BASE: dict[str, Any] = {"model": MODEL, "input": "hello"}


def run(body: bytes, contract: Contract) -> Forward | ApiError:
    try:
        return rewrite_request(body, contract.policy, contract.tokenizers, clock=time.monotonic)
    except ApiError as exc:
        return exc


def seen_upstream(body: bytes, forward: Forward) -> Any:
    """The body the upstream gets: the rewritten one, or the client's as sent."""
    return orjson.loads(forward.upstream_body if forward.upstream_body is not None else body)


def oracle(doc: dict[str, Any], field: str) -> tuple[bool, Any]:
    """(pydantic accepts the body, the field's converted value)."""
    try:
        parsed = LegacyRequest.model_validate(doc)
    except ValidationError as exc:
        assert {error["loc"][0] for error in exc.errors()} == {field}, exc
        return False, None
    return True, getattr(parsed, field)


def assert_same_as_pydantic(field: str, value: Any, contract: Contract) -> None:
    doc = {**BASE, field: value}
    body = orjson.dumps(doc)
    accepted, converted = oracle(orjson.loads(body), field)
    got = run(body, contract)
    if not accepted:
        assert isinstance(got, ApiError), f"pydantic refuses {field}={value!r}, the gateway not"
        assert (got.status, got.param) == (400, field), got
        return
    plain = orjson.dumps({**BASE, field: converted} if converted is not None else BASE)
    want = run(plain, contract)
    if isinstance(want, ApiError):
        assert isinstance(got, ApiError), f"{field}={value!r} accepted, {converted!r} refused"
        assert (got.status, got.param, got.code) == (want.status, want.param, want.code)
        return
    assert isinstance(got, Forward), f"pydantic takes {field}={value!r} as {converted!r}: {got}"
    assert got.plan == want.plan
    assert seen_upstream(body, got) == seen_upstream(plain, want)


# -- what clients send -------------------------------------------------------------

NUMBER_CHARS = st.sampled_from(list("0123456789+-_.e x\t\u3000\u0663"))
NUMERIC_TEXT = st.text(NUMBER_CHARS, max_size=8)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([256.0, 32.0, 1024.0, -1.0, 8.0, 1e308, 256.5, -0.0]),
    NUMERIC_TEXT,
    st.text(max_size=6),
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=6,
)
TOKEN_ID_LIKE = st.one_of(
    st.integers(min_value=-2, max_value=151_700),
    st.sampled_from([1.0, 2.5, True, False, "7", " 8 ", "9.0", "1_0", "x", None, [1]]),
)
INPUTS = st.one_of(
    JSON_VALUES,
    st.lists(TOKEN_ID_LIKE, max_size=4),
    st.lists(st.lists(TOKEN_ID_LIKE, max_size=3), max_size=3),
    st.lists(st.one_of(st.text(max_size=4), NUMERIC_TEXT, TOKEN_ID_LIKE), max_size=4),
)
FIELDS = {
    "dimensions": JSON_VALUES,
    "truncate_prompt_tokens": JSON_VALUES,
    "encoding_format": st.one_of(JSON_VALUES, st.sampled_from(["float", "base64", "FLOAT"])),
    "input_type": st.one_of(JSON_VALUES, st.sampled_from(["query", "document", "passage"])),
    "instruction": JSON_VALUES,
    "user": JSON_VALUES,
    "input": INPUTS,
}
FAST = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_every_field_is_read_as_pydantic_lax_mode_reads_it(
    field: str, qwen_contract: Contract
) -> None:
    @FAST
    @given(FIELDS[field])
    def check(value: Any) -> None:
        assert_same_as_pydantic(field, value, qwen_contract)

    check()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dimensions", 256.0),
        ("dimensions", "256"),
        ("dimensions", " 256 "),
        ("dimensions", "256.00"),
        ("dimensions", "0256"),
        ("dimensions", "1_024"),
        ("dimensions", 256.5),
        ("dimensions", "256.5"),
        ("dimensions", "2.56e2"),
        ("dimensions", "0x100"),
        ("dimensions", "２５６"),
        ("dimensions", True),
        ("dimensions", 1e308),
        ("dimensions", [256]),
        ("truncate_prompt_tokens", "8"),
        ("truncate_prompt_tokens", 8.0),
        ("truncate_prompt_tokens", True),
        ("truncate_prompt_tokens", "-1"),
        ("truncate_prompt_tokens", 8.5),
        ("input", [1.0, "2", True]),
        ("input", [[1.0], ["2", 3]]),
        ("input", ["1", "2"]),
        ("input", ["1", 2]),
        ("input", ["a", 2]),
        ("input", [1, "a"]),
        ("input", [[1], 2]),
        ("input", [None]),
        ("input", 5),
        ("encoding_format", "FLOAT"),
        ("encoding_format", None),
        ("input_type", 1),
        ("instruction", ["task"]),
        ("user", 5),
    ],
)
def test_named_spellings(field: str, value: Any, qwen_contract: Contract) -> None:
    assert_same_as_pydantic(field, value, qwen_contract)


@pytest.mark.parametrize("value", [256.0, "256", " 256\n", "256.0", "+256"])
def test_dimensions_spellings_give_the_cut(value: Any, qwen_contract: Contract) -> None:
    forward = run(orjson.dumps({**BASE, "dimensions": value}), qwen_contract)
    assert isinstance(forward, Forward)
    assert forward.plan.dimensions == 256
    assert forward.upstream_body is not None
    assert "dimensions" not in orjson.loads(forward.upstream_body)


@pytest.mark.parametrize(
    ("value", "says"),
    [(256.5, "integer"), ("256.5", "integer"), (True, "got true"), (False, "got false")],
)
def test_dimensions_that_are_no_integer_stay_400(
    value: Any, says: str, qwen_contract: Contract
) -> None:
    got = run(orjson.dumps({**BASE, "dimensions": value}), qwen_contract)
    assert isinstance(got, ApiError)
    assert (got.status, got.param) == (400, "dimensions")
    assert says in got.message


def test_converted_values_reach_the_upstream_as_integers(qwen_contract: Contract) -> None:
    body = orjson.dumps({**BASE, "input": [1.0, "2", True], "truncate_prompt_tokens": "8"})
    forward = run(body, qwen_contract)
    assert isinstance(forward, Forward)
    doc = seen_upstream(body, forward)
    assert doc["input"] == [1, 2, 1]
    assert doc["truncate_prompt_tokens"] == 8
    assert all(type(v) is int for v in [*doc["input"], doc["truncate_prompt_tokens"]])


@pytest.mark.parametrize(
    "doc",
    [BASE, {**BASE, "dimensions": 256}, {**BASE, "input_type": "query", "user": "u"}],
    ids=["plain", "dimensions", "query"],
)
def test_a_byte_order_mark_is_skipped_and_never_forwarded(
    doc: dict[str, Any], qwen_contract: Contract
) -> None:
    plain = orjson.dumps(doc)
    with_bom = run(BOM + plain, qwen_contract)
    without = run(plain, qwen_contract)
    assert isinstance(with_bom, Forward) and isinstance(without, Forward)
    assert with_bom.plan == without.plan
    assert with_bom.upstream_body is not None, "the upstream must not get the BOM"
    assert seen_upstream(BOM + plain, with_bom) == seen_upstream(plain, without)


@pytest.mark.parametrize("body", [BOM, BOM + BOM + orjson.dumps(BASE), BOM + b"[1]"])
def test_a_byte_order_mark_before_no_object_is_still_invalid_json(
    body: bytes, qwen_contract: Contract
) -> None:
    got = run(body, qwen_contract)
    assert isinstance(got, ApiError)
    assert (got.status, got.code) == (400, "invalid_json")


def test_lax_int_is_pydantics_int() -> None:
    """The conversion alone, on the strings where pydantic's rules are most intricate."""
    from pydantic import TypeAdapter

    adapter: TypeAdapter[int] = TypeAdapter(int)

    @settings(max_examples=2000, deadline=None)
    @given(st.one_of(NUMERIC_TEXT, st.floats(), st.integers(), st.booleans()))
    def check(value: Any) -> None:
        try:
            want: int | None = adapter.validate_python(value)
        except ValidationError:
            want = None
        assert lax_int(value) == want

    check()


def test_integral_floats_are_pydantics_lax_literal() -> None:
    """``leniency.integral_floats`` reads an integer as a lax pydantic ``Literal`` of
    integers does (a legacy server's ``dimensions: Literal[64, 128, 256]``): the
    integer, a float equal to it, or a boolean equal to it; never a string."""
    from pydantic import TypeAdapter

    sizes = (0, 1, 64, 128, 256, 2**40)
    adapter: TypeAdapter[Any] = TypeAdapter(Literal[sizes])  # type: ignore[valid-type]

    @settings(max_examples=2000, deadline=None)
    @given(
        st.one_of(
            NUMERIC_TEXT,
            st.sampled_from([float(n) for n in sizes] + list(sizes)),
            st.floats(),
            st.integers(),
            st.booleans(),
        )
    )
    def check(value: Any) -> None:
        try:
            want: int | None = adapter.validate_python(value)
        except ValidationError:
            want = None
        got = integral_float_int(value)
        assert (got if got in sizes else None) == want, value

    check()


# -- through a real Envoy and the real ext_proc server (`extproc run`) ----------------


@pytest.fixture(scope="module")
def stack(fake_vllm: FakeUpstream, gateways: Gateways) -> Iterator[tuple[Gateway, FakeUpstream]]:
    """The shipped policy behind `extproc run`, in front of the fake vLLM (which, like
    vLLM, would take a forwarded null as the default: the test looks at what it got)."""
    fake_vllm.reset()
    with gateways.own(GatewaySpec(fake_vllm.url)) as gw:
        yield gw, fake_vllm


@pytest.mark.parametrize(
    ("body", "size"),
    [
        pytest.param(orjson.dumps({**BASE, "dimensions": 256.0}), 256, id="dimensions-256.0"),
        pytest.param(orjson.dumps({**BASE, "dimensions": "256"}), 256, id="dimensions-string"),
        pytest.param(BOM + orjson.dumps(BASE), 1024, id="byte-order-mark"),
        pytest.param(orjson.dumps({**BASE, "encoding_format": None}), 1024, id="encoding-null"),
    ],
)
def test_through_envoy(body: bytes, size: int, stack: tuple[Gateway, FakeUpstream]) -> None:
    gateway, upstream = stack
    upstream.reset()
    reply = gateway.embeddings(body)
    assert reply.status == 200, reply.body[:300]
    (item,) = reply.json()["data"]
    assert len(item["embedding"]) == size
    assert abs(sum(x * x for x in item["embedding"]) - 1) < 1e-4
    (received,) = upstream.received
    assert not received.body.startswith(BOM)
    assert received.json is not None
    assert received.json["input"] == "hello"
    assert "dimensions" not in received.json
    assert None not in received.json.values()
