"""Hypothesis fuzzing of the sans-I/O core: hostile input, both directions.

tests/test_properties.py checks the core on modest, mostly well-formed input. This
file throws everything at the two entry points and checks each answer against an
oracle written here, independently of the code under test:

- request side: arbitrary bytes, arbitrary JSON documents (known field names and
  random keys, every JSON type, numbers far outside 64 bits, NaN/Infinity tokens,
  arbitrary unicode with zero-width and bidi controls, nesting up to and past the
  parser's depth limit) and well-formed requests with hostile text, fed to
  ``rewrite_request`` under a three-model policy. It returns a ``Forward`` whose
  upstream body and plan agree with the request, or raises ``ApiError`` with a 4xx
  status and a valid envelope; anything else is a bug. Every valid request must be
  forwarded.
- response side: arbitrary valid ``ResponsePlan``s with arbitrary upstream statuses
  and bodies (random bytes and JSON, truncated valid answers, wrong widths, NaN and
  Infinity, wrong item counts, wrong or duplicate ``index`` values, non-numeric
  vector entries). A 2xx that is a valid answer for the plan comes back as the same
  2xx with the planned size and encoding (unit vectors when cut); any other 2xx
  becomes a 502 envelope, never a 2xx with bad vectors; a non-2xx becomes an
  envelope with a 4xx/5xx status (a 5xx never turns into a 4xx).

Falsifying examples found while writing this file are pinned with ``@example`` or as
explicit tests, each with the bug it showed.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from extproc.core.api_errors import ApiError
from extproc.core.contract import Contract
from extproc.core.dialects import OPENAI
from extproc.core.endpoint import Endpoint, Forward
from extproc.core.error_dialect import OPENAI_ERRORS
from extproc.core.plan import Encoding, ResponsePlan
from extproc.core.policy import load_policy_text
from extproc.core.policy.model import EncodingProfile, ModelPolicy
from extproc.core.prompts import DOCUMENT_TYPES, QUERY_TYPES
from extproc.core.request_headers import UPSTREAM_PATH, check_content_type, check_declared_length
from extproc.core.request_rewrite import rewrite_request
from extproc.core.upstreams import ADAPTERS
from extproc.service.tokenizer_files import load_tokenizer
from testing_support.http import envelope_error

UTF8_BOM = b"\xef\xbb\xbf"

QWEN = "Qwen/Qwen3-Embedding-0.6B"
SHORT = "fuzz/openai-short"  # OpenAI profile, 12 tokens, Matryoshka sizes 8/16/32 of 64
FRAMED = "fuzz/framed"  # a token before and after every input, 6 tokens, 8-d, Matryoshka 2..8
MODELS = (QWEN, SHORT, FRAMED)
MAX_REQUEST_BYTES = 65536
MAX_INPUTS = 8
POLICY = f"""
limits:
  max_request_bytes: {MAX_REQUEST_BYTES}
  max_inputs: {MAX_INPUTS}
models:
  - name: {QWEN}
    preset: qwen3-embedding-0.6b
    max_tokens: 1024
    encoding_profile: LEGACY
    upstream_flavour: DYNAMO
  - name: {SHORT}
    preset: qwen3-embedding-0.6b
    upstream_model: upstream/short
    max_tokens: 12
    native_dimensions: 64
    matryoshka: {{allowed: [8, 16, 32]}}
    encoding_profile: OPENAI
    upstream_flavour: VLLM
    prompts:
      extra: {{classification: "classify: {{text}}"}}
  - name: {FRAMED}
    preset: plain
    tokenizer:
      hf_id: {QWEN}
      special_tokens: {{prepend_ids: [151644], append_ids: [151643]}}
    max_tokens: 6
    native_dimensions: 8
    matryoshka: {{min_dimensions: 2}}
    prompts: {{query: "q: {{text}}", document: "d: {{text}}"}}
"""
LEGACY_ONLY = ("dimensions", "input_type", "instruction")
KNOWN_FIELDS = (
    "model",
    "input",
    "dimensions",
    "encoding_format",
    "input_type",
    "instruction",
    "user",
    "truncate_prompt_tokens",
    "object",
    "encoding",
    "normalize",
    "priority",
)
REQUEST_PARAMS = {
    None,
    "model",
    "input",
    "dimensions",
    "encoding_format",
    "input_type",
    "instruction",
    "truncate_prompt_tokens",
    "user",
}
FLOAT32_MAX = float(np.finfo(np.float32).max)

F32Row = npt.NDArray[np.float32]

# The embeddings endpoint as the stream holds it (OpenAI dialect and errors).
EMBEDDINGS = Endpoint(UPSTREAM_PATH, OPENAI, UPSTREAM_PATH, OPENAI_ERRORS)


def cfg(max_examples: int) -> settings:
    """Bounded example counts, no deadline, no example database written into the repo."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


class Core:
    """The fuzz policy's contract, with a short repr for Hypothesis' failure reports."""

    def __init__(self, contract: Contract) -> None:
        self.policy = contract.policy
        self.tokenizers = contract.tokenizers

    def __repr__(self) -> str:
        return "Core(POLICY)"


@pytest.fixture(scope="module")
def core(qwen_dir: Path) -> Core:
    policy = load_policy_text(POLICY, source="fuzz", tokenizer_overrides={QWEN: qwen_dir})
    model = policy.models[QWEN]
    qwen = load_tokenizer(model.tokenizer, model.special_tokens)
    # The same vocabulary with FRAMED's specials, without a second ~4 s load.
    framed = copy.copy(qwen)
    framed.prepend_ids = policy.models[FRAMED].special_tokens.prepend_ids
    framed.append_ids = policy.models[FRAMED].special_tokens.append_ids
    return Core(Contract(policy, {QWEN: qwen, SHORT: qwen, FRAMED: framed}))


# -- strategies: JSON made of everything -------------------------------------------------

# Zero-width, bidi controls, combining marks, NUL, BOM, quotes and escapes.
ODD_CHARS = (
    "\u200b\u200c\u200d\u2060\ufeff\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
    '\u2066\u2067\u2068\u2069\u061c\u0301\u0000\u00a0\u3000\u2028\u2029\n\t"\\/'
)
WORDS = (
    *MODELS,
    *sorted(QUERY_TYPES | DOCUMENT_TYPES),
    "classification",
    "float",
    "base64",
    "",
    " ",
    "upstream/short",
)
texts = st.one_of(
    st.text(max_size=30),  # any unicode scalar value (Hypothesis never draws surrogates)
    st.text(st.sampled_from(ODD_CHARS) | st.characters(codec="utf-8"), max_size=30),
    st.text(st.characters(min_codepoint=0x0590, max_codepoint=0x08FF), max_size=30),  # RTL
    st.sampled_from(WORDS),
    st.builds(  # long: truncation for every model, 413 for the biggest
        lambda unit, n: unit * n,
        st.text(min_size=1, max_size=6),
        st.sampled_from([300, 2000, 12000]),
    ),
)
numbers = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.integers(-(10**40), 10**40),  # past 64 bits: orjson reads these as floats
    st.sampled_from([0, -1, 1, 2, 8, 16, 31, 32, 64, 1024, 1025, 2**63, 2**64, -(2**63) - 1]),
    st.floats(),  # NaN and +-Infinity come out as bare tokens: not JSON
    st.sampled_from([256.0, 1e308, -0.0, 5e-324, 1e-7]),
)
scalars = st.none() | st.booleans() | numbers | texts
keys = st.sampled_from(KNOWN_FIELDS) | st.text(max_size=12)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(keys, children, max_size=6),
    max_leaves=30,
)
# What a valid request may carry in fields the gateway does not interpret.
safe_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
token_ids = st.integers(-3, 152_000) | st.sampled_from([0, 151643, 151644, 151668, 151669])
input_values = st.one_of(
    texts,
    st.lists(texts, max_size=MAX_INPUTS + 2),
    st.lists(token_ids, max_size=20),
    st.lists(st.lists(token_ids, max_size=12), max_size=MAX_INPUTS + 2),
    st.lists(texts | token_ids | st.lists(token_ids, max_size=3), max_size=4),  # mixed
    json_values,
)
field_values: dict[str, st.SearchStrategy[Any]] = {
    "dimensions": st.sampled_from([2, 8, 16, 31, 32, 64, 256, 1024, 0, -1]) | numbers | scalars,
    "encoding_format": st.sampled_from(["float", "base64", None, "FLOAT", "binary"]) | scalars,
    "input_type": st.sampled_from([*WORDS, None]) | scalars,
    "instruction": texts | scalars,
    "truncate_prompt_tokens": st.sampled_from([-1, 0, 1, 6, 12, 1024, 1025]) | numbers | scalars,
    "user": json_values,
}
near_valid = st.fixed_dictionaries(
    {"model": st.sampled_from(MODELS) | scalars, "input": input_values},
    optional={**field_values, "extra": json_values, "": json_values},
)
documents = st.one_of(
    json_values,
    st.dictionaries(keys, json_values, max_size=9),
    near_valid,
)


@st.composite
def json_bytes(draw: st.DrawFn, values: st.SearchStrategy[Any]) -> bytes:
    """Serialised by the stdlib (big ints, NaN) in one of several layouts."""
    doc = draw(values)
    text = json.dumps(
        doc,
        ensure_ascii=draw(st.booleans()),
        indent=draw(st.sampled_from([None, None, 2])),
        separators=draw(st.sampled_from([None, (",", ":")])),
    )
    raw = text.encode("utf-8")
    mangle = draw(st.sampled_from(["none"] * 6 + ["bom", "pad", "truncate", "garbage", "byte"]))
    if mangle == "bom":
        return b"\xef\xbb\xbf" + raw
    if mangle == "pad":
        return b" \r\n\t" + raw + b"\n  "
    if mangle == "truncate":
        return raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    if mangle == "garbage":
        return raw + draw(st.binary(min_size=1, max_size=8))
    if mangle == "byte" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        return raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
    return raw


def deep_body(depth: int, *, rewritten: bool) -> bytes:
    """A valid request with an extra field nested ``depth`` arrays deep."""
    head = {"model": QWEN, "input": "x"}
    if rewritten:
        head["input_type"] = "query"
    return orjson.dumps(head)[:-1] + b',"extra":' + b"[" * depth + b"]" * depth + b"}"


deep_bodies = st.builds(
    deep_body,
    st.sampled_from([1, 200, 253, 254, 255, 256, 400, 1022, 1023, 1024, 1025, 3000]),
    rewritten=st.booleans(),
)


# -- the request oracle ---------------------------------------------------------------------


def check_envelope(raw: bytes) -> dict[str, Any]:
    """A complete OpenAI error envelope, valid JSON to any parser."""
    doc = json.loads(raw.decode("utf-8"))
    assert orjson.loads(raw) == doc
    error = envelope_error(raw)
    return dict(error)


def _count(raw_input: Any) -> int:
    if isinstance(raw_input, str):
        return 1
    assert isinstance(raw_input, list) and raw_input
    return 1 if isinstance(raw_input[0], int) else len(raw_input)


def _texts(raw_input: Any) -> list[str] | None:
    if isinstance(raw_input, str):
        return [raw_input]
    if all(isinstance(item, str) for item in raw_input):
        return list(raw_input)
    return None


def check_request(body: bytes, core: Core) -> Forward | ApiError:
    """Forward (checked against the request) or a 4xx ApiError; anything else propagates."""
    try:
        forward = rewrite_request(body, core.policy, core.tokenizers, clock=time.monotonic)
    except ApiError as error:
        assert 400 <= error.status < 500, repr(error)
        envelope = check_envelope(error.envelope())
        assert envelope["message"] == error.message
        assert envelope["param"] in REQUEST_PARAMS, envelope
        assert envelope["type"] == "invalid_request_error", envelope
        return error
    assert isinstance(forward, Forward)
    assert len(body) <= MAX_REQUEST_BYTES
    # A leading byte order mark is accepted only where the policy is lenient (the
    # legacy profile); the document after it is what the core read.
    if body.startswith(UTF8_BOM):
        assert (
            core.policy.models[orjson.loads(body[3:])["model"]].encoding_profile
            is EncodingProfile.LEGACY
        )
    request = orjson.loads(body.removeprefix(UTF8_BOM))
    assert isinstance(request, dict)
    model = core.policy.models[request["model"]]
    tokenizer = core.tokenizers[model.name]
    plan = forward.plan
    count = _count(request["input"])
    assert 1 <= count <= MAX_INPUTS
    assert (plan.model, plan.input_count) == (model.name, count)
    assert (plan.native_dimensions, plan.upstream_kind) == (
        model.native_dimensions,
        model.upstream.kind,
    )

    asked = request.get("dimensions")
    if asked is None or asked == model.native_dimensions:
        assert plan.dimensions is None
        assert plan.upstream_encoding is plan.client_encoding
    else:
        assert model.accepts_dimensions(asked) and plan.dimensions == asked
        assert plan.upstream_encoding is Encoding.BASE64
    sent_encoding = request.get("encoding_format") or "float"
    assert sent_encoding in ("float", "base64")
    if model.encoding_profile is EncodingProfile.LEGACY:
        assert plan.client_encoding is Encoding.FLOAT
    else:
        assert plan.client_encoding is Encoding(sent_encoding)
    prompted = request.get("input_type") is not None or request.get("instruction") is not None

    if forward.upstream_body is None:
        assert model.upstream_model == model.name
        assert not set(LEGACY_ONLY) & set(request)
        assert sent_encoding == plan.upstream_encoding.value
        return forward

    upstream = orjson.loads(forward.upstream_body)
    assert isinstance(upstream, dict)
    assert not set(LEGACY_ONLY) & set(upstream)
    assert upstream["model"] == model.upstream_model
    if plan.upstream_encoding is Encoding.FLOAT:
        assert "encoding_format" not in upstream
    else:
        assert upstream["encoding_format"] == "base64"
    # A top-level null means absent: never forwarded. Every other field goes as sent.
    assert None not in upstream.values()
    nulls = {k for k, v in request.items() if v is None}
    untouched = set(request) - nulls - {"model", "input", "encoding_format", *LEGACY_ONLY}
    assert {k: upstream[k] for k in untouched} == {k: request[k] for k in untouched}
    assert set(upstream) - untouched <= {"model", "input", "encoding_format"}

    sent = upstream["input"]
    sent_list = [sent] if isinstance(sent, str) else sent
    if isinstance(sent, list) and sent and isinstance(sent[0], int):
        sent_list = [sent]
    assert len(sent_list) == count
    originals = _texts(request["input"])
    for index, item in enumerate(sent_list):
        if isinstance(item, str):
            assert originals is not None
            assert item.endswith(originals[index])
            assert prompted or item == originals[index]
        else:
            assert isinstance(item, list) and item
            assert all(isinstance(t, int) and 0 <= t < tokenizer.vocab_size for t in item)
            assert len(item) <= model.max_tokens
            if originals is not None:  # text sent as ids: framed like the model frames text
                head, tail = tokenizer.prepend_ids, tokenizer.append_ids
                assert tuple(item[: len(head)]) == head
                assert tuple(item[len(item) - len(tail) :]) == tail
    return forward


# -- request fuzzing ---------------------------------------------------------------------


@cfg(300)
@given(body=st.binary(max_size=400))
@example(body=b'\xef\xbb\xbf{"model": "Qwen/Qwen3-Embedding-0.6B", "input": ""}')
@example(body=b"\xef\xbb\xbf{}")
@example(body=b'{"model":"Qwen/Qwen3-Embedding-0.6B","input":"\\ud800\\u0000"}')
@example(body=b'{"model":"Qwen/Qwen3-Embedding-0.6B","input":"\\ud83d\\ude00\\u202e"}')
@example(body=b'{"model":"Qwen/Qwen3-Embedding-0.6B","input":"x","dimensions":1e999}')
@example(body=b'{"model":"Qwen/Qwen3-Embedding-0.6B","input":[1,2],"dimensions":NaN}')
def test_any_bytes(body: bytes, core: Core) -> None:
    check_request(body, core)


@cfg(400)
@given(body=json_bytes(documents))
@example(body=deep_body(300, rewritten=True))  # was TypeError (orjson's dump depth limit)
@example(body=deep_body(1024, rewritten=False))
@example(
    body=b'{"model":"fuzz/openai-short","input":[[1],[2]],"x":' + b"[" * 255 + b"]" * 255 + b"}"
)
def test_any_json_document(body: bytes, core: Core) -> None:
    check_request(body, core)


@cfg(100)
@given(body=deep_bodies)
def test_deeply_nested_extra_fields(body: bytes, core: Core) -> None:
    """orjson reads 1,024 levels but writes only 254: past that a rewritten request
    must be a 400, not an encoder crash."""
    check_request(body, core)


# Keys and texts rich in what the repeated-key check counts: ':' bytes, the escape that
# hides one (\u003a), other escapes, and the names of the interpreted fields.
_colon_texts = st.lists(
    st.sampled_from(["a", ":", "\\u003a", "\\u003A", "\\u0030", "\\n", "\\\\", "input", " "]),
    max_size=6,
).map("".join)


@st.composite
def raw_objects(draw: st.DrawFn, depth: int = 0) -> str:
    """A JSON object as text, written member by member, so a key may repeat."""
    members = []
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from(["k", "k:", "\\u006b", "input", "model"]) | _colon_texts)
        if depth < 2 and draw(st.booleans()):
            value = draw(raw_objects(depth + 1))
        else:
            value = f'"{draw(_colon_texts)}"'
        members.append(f'"{key}":{value}')
    return "{" + ",".join(members) + "}"


def _stdlib_repeats(body: bytes) -> bool:
    """The oracle: does any object of ``body`` name a key twice (after unescaping)?"""
    found = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        found.append(len(set(keys)) != len(keys))
        return dict(pairs)

    json.loads(body, object_pairs_hook=hook)
    return any(found)


@cfg(400)
@given(text=_colon_texts, extra=raw_objects(), repeat_extra=st.booleans())
@example(text="a", extra='{"k":1,"k":"\\u003a"}', repeat_extra=False)  # ':' counts equal
def test_a_repeated_key_is_found_whatever_the_text_holds(
    text: str, extra: str, repeat_extra: bool, core: Core
) -> None:
    """A repeated key is a 400 exactly when the stdlib parser sees one, whether or not
    colons in the texts (or escaped colons) make the check parse the body again."""
    copies = f',"nvext":{extra}' * (2 if repeat_extra else 1)
    body = f'{{"model":"{QWEN}","input":["{text}","x: y"]{copies}}}'.encode()
    outcome = check_request(body, core)
    repeated = isinstance(outcome, ApiError) and "more than once" in outcome.message
    assert repeated == _stdlib_repeats(body), outcome


@st.composite
def valid_requests(draw: st.DrawFn, core: Core) -> dict[str, Any]:
    """Requests the contract accepts, with hostile text and harmless extra fields."""
    name = draw(st.sampled_from(MODELS))
    model: ModelPolicy = core.policy.models[name]
    vocab = core.tokenizers[name].vocab_size
    ids = st.lists(st.integers(0, vocab - 1), min_size=1, max_size=20)
    request: dict[str, Any] = {
        "model": name,
        "input": draw(
            st.one_of(
                texts,
                st.lists(texts, min_size=1, max_size=MAX_INPUTS),
                ids,
                st.lists(ids, min_size=1, max_size=MAX_INPUTS),
            )
        ),
    }
    roles = [None, *sorted(QUERY_TYPES), *sorted(DOCUMENT_TYPES), *model.prompts.extra]
    input_type = draw(st.sampled_from(roles))
    if input_type is not None:
        request["input_type"] = input_type
    if input_type is None or input_type in QUERY_TYPES:
        instruction = draw(st.none() | texts.filter(lambda t: bool(t.strip())))
        if instruction is not None:
            request["instruction"] = instruction
    m = model.matryoshka
    sizes = [model.native_dimensions]
    if m is not None:
        sizes += list(m.allowed) or [
            m.min_dimensions,
            (m.min_dimensions + model.native_dimensions) // 2,
        ]
    dimensions = draw(st.none() | st.sampled_from(sizes))
    if dimensions is not None:
        request["dimensions"] = dimensions
    encoding = draw(st.sampled_from([None, "float", "base64"]))
    if encoding is not None or draw(st.booleans()):
        request["encoding_format"] = encoding
    if draw(st.booleans()):
        request["user"] = draw(texts)
    if draw(st.booleans()):
        request["truncate_prompt_tokens"] = draw(st.sampled_from([-1, 1, model.max_tokens]))
    extras = draw(
        st.dictionaries(
            st.text(max_size=8).filter(lambda k: k not in KNOWN_FIELDS), safe_values, max_size=3
        )
    )
    return {**request, **extras}


@cfg(300)
@given(data=st.data())
def test_valid_requests_are_forwarded(data: st.DataObject, core: Core) -> None:
    request = data.draw(valid_requests(core))
    body = json.dumps(request, ensure_ascii=data.draw(st.booleans()), allow_nan=False).encode()
    if len(body) > MAX_REQUEST_BYTES:
        with pytest.raises(ApiError) as caught:
            rewrite_request(body, core.policy, core.tokenizers, clock=time.monotonic)
        assert caught.value.status == 413
        return
    result = check_request(body, core)
    if isinstance(result, ApiError):
        # The tokenizer's wall-clock budget (2 s) may run out on a loaded machine: the
        # one 413 a valid body under the byte limits can get. Any other error is a bug.
        assert (result.status, result.param, result.code) == (413, "input", "request_too_large"), (
            result,
            request,
        )


@pytest.mark.parametrize("count", [MAX_INPUTS + 1, 1500])
def test_one_long_token_id_sequence_is_one_input(count: int, core: Core) -> None:
    """Found by test_valid_requests_are_forwarded: the ids of one sequence were counted
    as inputs, so [0] * 9 was "9 items; at most 8" (with the default policy, any single
    sequence of more than 2,048 ids, which should have been cut to max_tokens)."""
    forward = check_request(orjson.dumps({"model": QWEN, "input": [7] * count}), core)
    assert isinstance(forward, Forward) and forward.plan.input_count == 1


@cfg(300)
@given(value=st.text(max_size=30) | st.text(st.characters(codec="latin-1"), max_size=30))
@example(value="\xb2")  # '²'.isdigit() but int('²') raises: was a ValueError
@example(value="9" * 5000)  # int() refuses more than 4,300 digits: was a ValueError
@example(value="\u0663\u0660\u0660")  # Arabic-Indic 300
@example(value="0" * 40 + "100")
@example(value=str(MAX_REQUEST_BYTES + 1))
def test_request_header_checks_raise_only_api_errors(value: str, core: Core) -> None:
    """Header values (latin-1 decoded by the stream) never crash the checks."""
    try:
        check_declared_length(value, core.policy.limits)
    except ApiError as error:
        assert error.status == 413, repr(error)
        check_envelope(error.envelope())
    try:
        check_content_type(value)
    except ApiError as error:
        assert error.status == 415, repr(error)
        check_envelope(error.envelope())
    small = value.isascii() and value.isdigit() and len(value.lstrip("0")) < 10
    if small and int(value) <= MAX_REQUEST_BYTES:
        check_declared_length(value, core.policy.limits)  # within the limit: accepted


# -- the response oracle ------------------------------------------------------------------


@st.composite
def plans(draw: st.DrawFn) -> ResponsePlan:
    native = draw(st.integers(1, 16) | st.sampled_from([17, 64, 1024]))
    return ResponsePlan(
        model=draw(st.sampled_from(MODELS) | st.text(max_size=12)),
        input_count=draw(st.integers(1, 4)),
        native_dimensions=native,
        upstream_kind=draw(st.sampled_from(sorted(ADAPTERS))),
        client_encoding=draw(st.sampled_from(Encoding)),
        upstream_encoding=draw(st.sampled_from(Encoding)),
        dimensions=draw(st.none() | st.integers(1, native)),
    )


# float32 values of every magnitude, subnormals and zeros included
float32s = st.floats(width=32, allow_nan=False, allow_infinity=False) | st.sampled_from(
    [0.0, -0.0, 1.0, 1e-45, 1e-30, 1e30, FLOAT32_MAX, -FLOAT32_MAX]
)


def _b64(values: list[float]) -> str:
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode("ascii")


@st.composite
def embedding(draw: st.DrawFn, width: int, encoding: Encoding) -> Any:
    """One row as the upstream might send it: usually valid, sometimes broken."""
    if width <= 16:
        values = draw(st.lists(float32s, min_size=width, max_size=width))
    else:  # wide rows: seeded noise at a drawn scale, a few drawn values on top (fast)
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        scale = draw(st.sampled_from([1.0, 1.0, 1e-30, 1e-20, 1e18, 1e30, 0.0]))
        values = (rng.standard_normal(width) * scale).astype(np.float32).tolist()
        for at in draw(st.lists(st.integers(0, width - 1), max_size=3)):
            values[at] = draw(float32s)
    mutation = draw(st.sampled_from(["none"] * 10 + BROKEN_ROWS))
    if mutation == "width":
        values = values + [0.5] if draw(st.booleans()) or not values else values[:-1]
    elif mutation in ("nan", "inf"):
        values[draw(st.integers(0, width - 1))] = math.nan if mutation == "nan" else -math.inf
    elif mutation == "encoding":
        encoding = Encoding.FLOAT if encoding is Encoding.BASE64 else Encoding.BASE64
    if mutation == "beyond_float32" and encoding is Encoding.FLOAT:
        values[draw(st.integers(0, width - 1))] = draw(st.sampled_from([1e39, -3.5e38, 1e308]))
    if encoding is Encoding.BASE64:
        text = _b64(values)
        if mutation == "b64_garbage":
            at = draw(st.integers(0, len(text)))
            text = (
                text[:at] + draw(st.sampled_from(["\n", " ", "*", "-", "_", "=", "é"])) + text[at:]
            )
        elif mutation == "b64_cut":
            text = text[: draw(st.integers(0, max(0, len(text) - 1)))]
        return text
    row: list[Any] = [float(v) for v in values]
    if mutation == "types" and row:
        at = draw(st.integers(0, len(row) - 1))
        row[at] = draw(st.sampled_from([True, False, None, "0.5", "1", [0.5], {"v": 1}]))
    elif mutation == "ints":
        row = [int(v) if abs(v) < 1e18 else v for v in row]
    elif mutation == "shape":
        return draw(st.sampled_from([None, {}, 7, "", [row], True]))
    return row


BROKEN_ROWS = [
    "width",
    "nan",
    "inf",
    "encoding",
    "beyond_float32",
    "b64_garbage",
    "b64_cut",
    "types",
    "ints",
    "shape",
]


@st.composite
def upstream_answers(draw: st.DrawFn, plan: ResponsePlan) -> bytes:
    """An embeddings answer for ``plan``, valid or broken in one or more ways."""
    count = plan.input_count
    if draw(st.integers(0, 9)) == 0:
        count = draw(st.integers(0, plan.input_count + 2))  # wrong item count
    width = plan.native_dimensions
    order = draw(st.permutations(range(count)))
    items: list[Any] = []
    for index in order:
        item: dict[str, Any] = {
            "object": "embedding",
            "index": index,
            "embedding": draw(embedding(width, plan.upstream_encoding)),
        }
        if draw(st.integers(0, 7)) == 0:
            item.update(draw(st.dictionaries(st.text(max_size=6), json_values, max_size=2)))
        items.append(item)
    index_mode = draw(st.sampled_from(["keep"] * 8 + ["absent", "duplicate", "shift", "odd"]))
    if index_mode == "absent":
        for item in items:
            item.pop("index", None)
    elif index_mode == "duplicate" and len(items) >= 2:
        items[0]["index"] = items[1]["index"]
    elif index_mode == "shift":
        for item in items:
            item["index"] += draw(st.sampled_from([1, -1, 100]))
    elif index_mode == "odd" and items:
        items[draw(st.integers(0, len(items) - 1))]["index"] = draw(
            st.sampled_from([None, True, "0", 0.0, -1, 2**64 - 1, [0]])
        )
    doc: dict[str, Any] = {"object": "list", "data": items, "model": "upstream-name"}
    if draw(st.booleans()):
        doc["usage"] = {"prompt_tokens": draw(st.integers(0, 10**6)), "total_tokens": 3}
    if draw(st.integers(0, 7)) == 0:
        doc.update(draw(st.dictionaries(keys, json_values, max_size=3)))
    shape = draw(st.sampled_from(["doc"] * 12 + ["not_object", "no_data", "data_object", "items"]))
    value: Any = doc
    if shape == "not_object":
        value = items
    elif shape == "no_data":
        del doc["data"]
    elif shape == "data_object":
        doc["data"] = {"0": items}
    elif shape == "items" and items:
        items[0] = draw(scalars)
    raw = json.dumps(value).encode()  # NaN/Infinity become bare (invalid JSON) tokens
    cut = draw(st.sampled_from(["none"] * 12 + ["truncate", "deep", "empty"]))
    if cut == "truncate":
        raw = raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
    elif cut == "deep":
        depth = draw(st.sampled_from([100, 254, 255, 300, 1022]))
        raw = raw[:-1] + b', "extra": ' + b"[" * depth + b"]" * depth + b"}"
    elif cut == "empty":
        raw = b""
    return raw


def reference_rows(plan: ResponsePlan, body: bytes) -> list[F32Row] | None:
    """The upstream's vectors in input order, or None when the answer is not a valid
    embeddings response for ``plan`` (written independently of extproc.core.vectors)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    data = doc.get("data")
    if not isinstance(data, list) or len(data) != plan.input_count:
        return None
    if not all(isinstance(item, dict) for item in data):
        return None
    # Every item names its input, each input once (OpenAI and both upstreams always
    # send 'index'; without it a reordered answer cannot be told from a correct one).
    indexes = [item.get("index") for item in data]
    if sorted(i if type(i) is int else -1 for i in indexes) != list(range(len(data))):
        return None
    data = sorted(data, key=lambda item: int(item["index"]))
    rows: list[F32Row] = []
    for item in data:
        value = item.get("embedding")
        if isinstance(value, str):
            try:
                raw = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                return None
            if len(raw) != plan.native_dimensions * 4:
                return None
            row = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        elif isinstance(value, list):
            if len(value) != plan.native_dimensions:
                return None
            if not all(type(v) in (int, float) for v in value):
                return None  # JSON numbers only: no booleans, strings or nulls
            if not all(abs(v) <= FLOAT32_MAX for v in value):  # also false for NaN
                return None
            row = np.asarray(value, dtype=np.float64).astype(np.float32)
        else:
            return None
        if not np.isfinite(row).all():
            return None
        rows.append(row)
    try:
        orjson.dumps(doc)
    except orjson.JSONEncodeError:
        return None  # nested deeper than any JSON writer here can re-encode: a 502
    return rows


def decode_answer_row(value: Any, encoding: Encoding) -> F32Row:
    if encoding is Encoding.BASE64:
        assert isinstance(value, str)
        return np.frombuffer(base64.b64decode(value, validate=True), dtype="<f4").astype(np.float32)
    assert isinstance(value, list) and all(type(v) is float for v in value), value
    return np.asarray(value, dtype=np.float64).astype(np.float32)


def check_success(
    plan: ResponsePlan, status: int, body: bytes, answer_body: bytes, rows: list[F32Row]
) -> None:
    upstream = orjson.loads(body)
    doc = orjson.loads(answer_body)
    assert doc["model"] == plan.model
    for key in set(upstream) - {"data", "model"}:
        assert doc[key] == upstream[key], key
    assert len(doc["data"]) == plan.input_count
    width = plan.dimensions or plan.native_dimensions
    for position, (item, row) in enumerate(zip(doc["data"], rows, strict=True)):
        assert item["index"] == position
        got = decode_answer_row(item["embedding"], plan.client_encoding)
        assert got.shape == (width,)
        if plan.dimensions is None:  # re-encoded only: bit for bit
            np.testing.assert_array_equal(got.view(np.uint32), row.view(np.uint32))
            continue
        head = row[: plan.dimensions].astype(np.float64)
        norm = float(np.sqrt(np.sum(head * head)))
        if norm == 0.0:
            assert not got.any(), got
            continue
        np.testing.assert_allclose(got.astype(np.float64), head / norm, rtol=1e-6, atol=1e-7)
        assert abs(float(np.linalg.norm(got.astype(np.float64))) - 1.0) <= 1e-5


# -- response fuzzing ----------------------------------------------------------------------


_P2 = ResponsePlan(QWEN, 2, 4, "dynamo", Encoding.FLOAT, Encoding.BASE64, dimensions=2)
_P1 = ResponsePlan(QWEN, 1, 4, "dynamo", Encoding.FLOAT, Encoding.BASE64, dimensions=2)


def _answer(*rows: Any, extra: bytes = b"") -> bytes:
    items = [{"index": i, "embedding": r} for i, r in enumerate(rows)]
    return orjson.dumps({"data": items})[:-1] + extra + b"}"


@cfg(400)
@given(data=st.data())
def test_any_2xx_answer(data: st.DataObject) -> None:
    plan = data.draw(plans(), label="plan")
    status = data.draw(st.sampled_from([200, 200, 200, 201, 204, 299]), label="status")
    body = data.draw(
        upstream_answers(plan) | json_bytes(json_values) | st.binary(max_size=64), label="body"
    )
    check_2xx(plan, status, body)


def check_2xx(plan: ResponsePlan, status: int, body: bytes) -> None:
    answer = EMBEDDINGS.answer(plan, status, body)
    if not plan.rewrites_vectors:
        assert answer is None
        return
    assert answer is not None
    rows = reference_rows(plan, body)
    if rows is None:
        assert answer.status == 502, (answer, body[:300])
        error = check_envelope(answer.body)
        assert (error["type"], error["code"]) == ("server_error", "bad_upstream_response")
        return
    assert answer.status == status, answer
    check_success(plan, status, body, answer.body, rows)


@pytest.mark.parametrize(
    ("plan", "body"),
    [
        pytest.param(_P1, _answer(_b64([1e30, 1e30, 3, 4])), id="float32-norm-overflow"),
        pytest.param(_P1, _answer(_b64([1e-30, 1e-30, 3, 4])), id="float32-norm-underflow"),
        pytest.param(_P1, _answer(_b64([1e-45, 0, 3, 4])), id="subnormal"),
        pytest.param(
            _P2,
            _answer([1, 2, 3, 4], [1, 2, 3, 4]).replace(b'"index":1', b'"index":0'),
            id="duplicate-index",
        ),
        pytest.param(
            _P2,
            _answer([1, 2, 3, 4], [1, 2, 3, 4]).replace(b'"index":1', b'"index":5'),
            id="index-out-of-range",
        ),
        pytest.param(
            _P2,
            _answer([1, 2, 3, 4], [1, 2, 3, 4]).replace(b'"index":1', b'"index":true'),
            id="boolean-index",
        ),
        pytest.param(_P1, _answer(["1", "2", 3, 4]), id="string-numbers"),
        pytest.param(_P1, _answer([True, False, True, True]), id="booleans"),
        pytest.param(_P1, _answer([True, 2.0, 3, 4]), id="boolean-among-numbers"),
        pytest.param(_P1, _answer([1e39, 0, 0, 1]), id="beyond-float32"),
        pytest.param(
            _P1,
            _answer(_b64([1, 2, 3, 4]), extra=b',"usage":' + b"[" * 300 + b"]" * 300),
            id="deep-extra-field",
        ),
        pytest.param(_P1, b'{"data":[{"index":0,"embedding":[NaN,1,2,3]}]}', id="nan-token"),
        pytest.param(_P1, _answer(_b64([math.nan, 1, 2, 3])), id="nan-base64"),
    ],
)
def test_pinned_2xx_answers(plan: ResponsePlan, body: bytes) -> None:
    """Falsifying examples of test_any_2xx_answer, kept explicit."""
    check_2xx(plan, 200, body)


STATUSES = st.one_of(
    st.integers(-5, 1200),
    st.sampled_from(
        [
            0,
            100,
            199,
            300,
            304,
            399,
            400,
            401,
            403,
            404,
            413,
            429,
            499,
            500,
            502,
            503,
            504,
            599,
            600,
            999,
            10**6,
            2**31 - 1,
        ]
    ),
)
error_bodies = st.one_of(
    st.binary(max_size=200),
    json_bytes(json_values),
    st.builds(
        lambda m, t, c: json.dumps({"message": m, "type": t, "code": c}).encode(),
        texts | st.none(),
        texts,
        scalars,
    ),
    st.builds(
        lambda m, p: json.dumps({"error": {"message": m, "param": p, "code": 400}}).encode(),
        json_values,
        json_values,
    ),
    st.builds(lambda d: json.dumps({"detail": d}).encode(), json_values),
    st.sampled_from(
        [
            b"",
            b"   ",
            b"<html><body>502 Bad Gateway</body></html>",
            b"\x00\x01\x02",
            b"upstream connect error or disconnect/reset before headers",
        ]
    ),
)


@cfg(300)
@given(
    plan=st.none() | plans(),
    status=STATUSES.filter(lambda s: not 200 <= s < 300),
    body=error_bodies,
)
@example(plan=_P1, status=600, body=b"{}")  # was answered with status 600
@example(plan=None, status=999, body=b'{"message":"x"}')  # was answered with status 999
@example(plan=_P1, status=10**6, body=b"")  # was answered with status 1000000
@example(plan=None, status=400, body=b'{"error":{"message":" "}}')  # message was " "
def test_any_error_answer(plan: ResponsePlan | None, status: int, body: bytes) -> None:
    answer = EMBEDDINGS.answer(plan, status, body)
    assert answer is not None
    assert 400 <= answer.status < 600, answer
    error = check_envelope(answer.body)
    if status >= 500 or answer.status >= 500:
        assert error["type"] == "server_error"
    if 500 <= status < 600:
        assert answer.status == status  # a fault stays the same fault
    elif status == 404 and plan is not None:
        assert answer.status == 503  # the gateway knows the model: the upstream lost it
    elif 400 <= status < 500:
        assert answer.status == status
    else:  # 1xx, 3xx and statuses HTTP does not have
        assert (answer.status, error["code"]) == (502, "bad_upstream_response")


# -- the plan carried between filters ----------------------------------------------------------


@cfg(200)
@given(plan=plans())
def test_plan_survives_its_metadata_form(plan: ResponsePlan) -> None:
    assert ResponsePlan.from_json(plan.to_json()) == plan


@cfg(300)
@given(
    text=st.one_of(
        st.text(max_size=60),
        json_bytes(json_values).map(lambda b: b.decode("utf-8", "replace")),
        st.lists(scalars, min_size=7, max_size=7).map(json.dumps),
    )
)
@example(text='["m",1,4,"dynamo","float","base64",0]')  # dimensions 0 was accepted
@example(text='["m",1,4,"dynamo","float","base64",-3]')  # negative: cut from the end
@example(text='["m",1,4,"dynamo","float","base64",99]')  # wider than native
@example(text='["m",1,1000000000000,"dynamo","float","base64",2]')  # numpy MemoryError
@example(text='["m",true,4.7,"dynamo","float","base64","2"]')  # bool/float/str coerced
@example(text='["m",1,4,"dynamo","float","base64",1e400]')
def test_plan_from_metadata_is_a_valid_plan_or_none(text: str) -> None:
    """The response filter trusts this plan to size numpy arrays and cut vectors."""
    plan = ResponsePlan.from_json(text)
    if plan is None:
        return
    fields = orjson.loads(text)
    assert [type(v) for v in fields[1:3]] == [int, int], fields
    assert plan.input_count >= 1 and 1 <= plan.native_dimensions <= 1 << 20
    assert plan.dimensions is None or (
        type(fields[6]) is int and 1 <= plan.dimensions <= plan.native_dimensions
    )
    assert ResponsePlan.from_json(plan.to_json()) == plan
