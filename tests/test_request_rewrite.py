"""Table-driven tests of the request half of the sans-I/O core.

Expectations are computed independently: token counts and ids come from the real
Qwen3 ``tokenizer.json`` run directly with Hugging Face ``tokenizers`` (not through
the gateway's ModelTokenizer), and the Qwen3-Embedding prompt format is spelled out
here from the model card (docs/upstreams.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from tokenizers import Tokenizer

from extproc.core.api_errors import MAX_MESSAGE_CHARS, ApiError
from extproc.core.contract import Contract
from extproc.core.plan import Encoding
from extproc.core.policy import GatewayPolicy, load_policy_text
from extproc.core.request_rewrite import Forward, rewrite_request
from extproc.core.tokens import ModelTokenizer
from extproc.service.contract_loading import load_contract

MODEL = "Qwen/Qwen3-Embedding-0.6B"
EOS = 151643
LIMIT = 1024
VOCAB = 151669  # len(vocab) + added tokens of Qwen3's tokenizer.json
DEFAULT_TASK = "Given a web search query, retrieve relevant passages that answer the query"
FRANCE = "What is the capital city of France?"
EXPECTED_FRANCE_PROMPT = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\n"
    "Query:What is the capital city of France?"
)
QUERY_TYPES = ["query", "search_query", "retrieval.query", "question"]
DOCUMENT_TYPES = ["document", "passage", "search_document", "retrieval.passage"]
LEGACY_FIELDS = ("input_type", "instruction", "dimensions")


def qwen_prompt(text: str, task: str = DEFAULT_TASK) -> str:
    return f"Instruct: {task}\nQuery:{text}"


def policy_yaml(
    *, profile: str = "LEGACY", max_inputs: int | None = None, max_bytes: int | None = None
) -> str:
    limits = ""
    if max_inputs is not None or max_bytes is not None:
        limits = "limits:\n"
        if max_inputs is not None:
            limits += f"  max_inputs: {max_inputs}\n"
        if max_bytes is not None:
            limits += f"  max_request_bytes: {max_bytes}\n"
    return (
        limits
        + "models:\n"
        + f"  - name: {MODEL}\n"
        + "    preset: qwen3-embedding-0.6b\n"
        + "    max_tokens: 1024\n"
        + f"    encoding_profile: {profile}\n"
        + "    upstream_flavour: DYNAMO\n"
    )


# -- fixtures --------------------------------------------------------------------


@pytest.fixture(scope="module")
def raw_tok(qwen_dir: Path) -> Tokenizer:
    """The oracle: Qwen3's tokenizer.json, no post-processor, no gateway code."""
    tok = Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def token_ids(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False).ids)


@pytest.fixture(scope="module")
def small_contract(qwen_dir: Path) -> Contract:
    policy = load_policy_text(
        policy_yaml(max_inputs=2, max_bytes=1024), tokenizer_overrides={MODEL: qwen_dir}
    )
    return load_contract(policy)


@pytest.fixture(scope="module")
def openai_contract(qwen_dir: Path) -> Contract:
    policy = load_policy_text(policy_yaml(profile="OPENAI"), tokenizer_overrides={MODEL: qwen_dir})
    return load_contract(policy)


def run(body: bytes | Mapping[str, Any], contract: Contract) -> Forward:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return rewrite_request(raw, contract.policy, contract.tokenizers, clock=time.monotonic)


def upstream_doc(forward: Forward) -> dict[str, Any]:
    assert forward.upstream_body is not None, "expected a rewritten upstream body"
    doc = orjson.loads(forward.upstream_body)
    assert isinstance(doc, dict)
    return doc


def as_list(value: Any) -> list[Any]:
    """OpenAI semantics: a single string input and a one-item array are the same request."""
    return [value] if isinstance(value, str) else list(value)


def assert_clean_upstream(doc: Mapping[str, Any]) -> None:
    for name in LEGACY_FIELDS:
        assert name not in doc, f"{name} leaked into the upstream body: {doc}"
    assert doc["model"] == MODEL


def repeat_to_tokens(tok: Tokenizer, unit: str, minimum: int) -> str:
    per_unit = max(1, len(token_ids(tok, unit * 4)) // 4)
    text = unit * (minimum // per_unit + 2)
    while len(token_ids(tok, text)) < minimum:
        text += unit * 8
    return text


def exactly_n_tokens(tok: Tokenizer, n: int) -> str:
    """'a a a ...' tokenizes one token per word; verified, not assumed."""
    text = "a" + " a" * (n - 1)
    assert len(token_ids(tok, text)) == n
    return text


# -- client mistakes -------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    body: bytes | dict[str, Any]
    status: int
    param: str | None
    says: tuple[str, ...]  # lower-case fragments the message must contain


def req(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": MODEL, "input": "hello"}
    base.update(fields)
    return {k: v for k, v in base.items() if v is not _DROP}


_DROP: Any = object()

BAD_REQUESTS: list[Any] = [
    pytest.param(Bad(b'{"model": "x", "input": ', 400, None, ("json",)), id="truncated-json"),
    pytest.param(Bad(b"{'model': 'x'}", 400, None, ("json",)), id="single-quotes-json"),
    pytest.param(Bad(b"\xff\xfe{}", 400, None, ("json",)), id="not-utf8"),
    pytest.param(Bad(b"", 400, None, ("empty",)), id="empty-body"),
    pytest.param(Bad(b"  \n ", 400, None, ("empty",)), id="whitespace-body"),
    pytest.param(Bad(b'["hello"]', 400, None, ("object", "array")), id="array-body"),
    pytest.param(Bad(b'"hello"', 400, None, ("object", "string")), id="string-body"),
    pytest.param(Bad(b"null", 400, None, ("object", "null")), id="null-body"),
    pytest.param(Bad(b"42", 400, None, ("object", "number")), id="number-body"),
    pytest.param(Bad(req(model=_DROP), 400, "model", ("model", "missing")), id="missing-model"),
    pytest.param(Bad(req(model=None), 400, "model", ("model",)), id="null-model"),
    pytest.param(Bad(req(model=3), 400, "model", ("model", "string")), id="number-model"),
    pytest.param(Bad(req(model=[MODEL]), 400, "model", ("model", "string")), id="array-model"),
    pytest.param(
        Bad(
            req(model="text-embedding-3-small"),
            404,
            "model",
            ("text-embedding-3-small", MODEL.lower()),
        ),
        id="unknown-model",
    ),
    pytest.param(
        Bad(req(model=MODEL.lower()), 404, "model", (MODEL.lower(),)), id="model-case-differs"
    ),
    pytest.param(Bad(req(input=_DROP), 400, "input", ("input", "missing")), id="missing-input"),
    pytest.param(Bad(req(input=None), 400, "input", ("input", "null")), id="null-input"),
    pytest.param(Bad(req(input=42), 400, "input", ("input", "number")), id="number-input"),
    pytest.param(Bad(req(input=True), 400, "input", ("input", "boolean")), id="bool-input"),
    pytest.param(
        Bad(req(input={"text": "x"}), 400, "input", ("input", "object")), id="object-input"
    ),
    pytest.param(Bad(req(input=["a", 1]), 400, "input", ("input[1]",)), id="mixed-str-then-int"),
    pytest.param(
        Bad(req(input=["a", None]), 400, "input", ("input[1]",)), id="mixed-str-then-null"
    ),
    pytest.param(Bad(req(input=[1, "a"]), 400, "input", ("input[1]",)), id="mixed-int-then-str"),
    pytest.param(Bad(req(input=[[1, 2], 3]), 400, "input", ("input[1]",)), id="mixed-ids-then-int"),
    pytest.param(Bad(req(input=[["a"]]), 400, "input", ("input[0][0]",)), id="strings-in-id-list"),
    pytest.param(Bad(req(input=[None]), 400, "input", ("input[0]",)), id="list-of-null"),
    pytest.param(Bad(req(input=[{"a": 1}]), 400, "input", ("input[0]",)), id="list-of-object"),
    pytest.param(Bad(req(input=[]), 400, "input", ("empty",)), id="empty-list"),
    pytest.param(Bad(req(input=[[]]), 400, "input", ("empty", "token")), id="empty-token-list"),
    pytest.param(
        Bad(req(input=[[5], []]), 400, "input", ("input[1]", "empty")), id="second-token-list-empty"
    ),
    pytest.param(Bad(req(input=[VOCAB]), 400, "input", (str(VOCAB),)), id="token-id-past-vocab"),
    pytest.param(
        Bad(req(input=[1, 10**9]), 400, "input", ("input[1]", str(10**9))), id="token-id-huge"
    ),
    pytest.param(
        Bad(req(input=[[1], [-1]]), 400, "input", ("input[1][0]", "-1")), id="token-id-negative"
    ),
    pytest.param(Bad(req(input=[1.5]), 400, "input", ("input[0]",)), id="token-id-float-first"),
    pytest.param(
        Bad(req(encoding_format="binary"), 400, "encoding_format", ("binary",)), id="enc-unknown"
    ),
    pytest.param(
        Bad(req(encoding_format="FLOAT"), 400, "encoding_format", ("float",)), id="enc-case"
    ),
    pytest.param(
        Bad(req(encoding_format=1), 400, "encoding_format", ("encoding_format",)), id="enc-number"
    ),
    pytest.param(
        Bad(req(dimensions=0), 400, "dimensions", ("dimensions", "32", "1024")), id="dims-0"
    ),
    pytest.param(Bad(req(dimensions=-1), 400, "dimensions", ("dimensions", "-1")), id="dims-neg"),
    pytest.param(Bad(req(dimensions=1025), 400, "dimensions", ("1025", "1024")), id="dims-1025"),
    pytest.param(Bad(req(dimensions=31), 400, "dimensions", ("31", "32")), id="dims-31"),
    pytest.param(
        Bad(req(dimensions=256.5), 400, "dimensions", ("dimensions", "integer")), id="dims-float"
    ),
    pytest.param(
        Bad(req(input_type="queries"), 400, "input_type", ("queries", "query")),
        id="input-type-unknown",
    ),
    pytest.param(
        Bad(req(input_type="Query"), 400, "input_type", ("'query'",)), id="input-type-case"
    ),
    pytest.param(
        Bad(req(input_type=1), 400, "input_type", ("input_type", "string")), id="input-type-number"
    ),
    pytest.param(
        Bad(req(instruction=7), 400, "instruction", ("instruction", "string")),
        id="instruction-number",
    ),
    pytest.param(
        Bad(req(instruction=["x"]), 400, "instruction", ("instruction",)), id="instruction-array"
    ),
    pytest.param(
        Bad(req(instruction=""), 400, "instruction", ("instruction", "empty")),
        id="instruction-empty",
    ),
    pytest.param(
        Bad(req(instruction=" \n\t"), 400, "instruction", ("instruction", "empty")),
        id="instruction-blank",
    ),
    pytest.param(
        Bad(
            req(input_type="document", instruction="Find it"),
            400,
            "instruction",
            ("instruction", "quer"),
        ),
        id="instruction-with-document",
    ),
    pytest.param(
        Bad(req(input_type="passage", instruction="Find it"), 400, "instruction", ("instruction",)),
        id="instruction-with-passage",
    ),
    pytest.param(
        Bad(req(truncate_prompt_tokens=0), 400, "truncate_prompt_tokens", ("1024",)), id="tpt-0"
    ),
    pytest.param(
        Bad(req(truncate_prompt_tokens=-2), 400, "truncate_prompt_tokens", ("-1",)), id="tpt-neg2"
    ),
    pytest.param(
        Bad(req(truncate_prompt_tokens=1025), 400, "truncate_prompt_tokens", ("1024",)),
        id="tpt-1025",
    ),
    pytest.param(
        Bad(req(truncate_prompt_tokens=8.5), 400, "truncate_prompt_tokens", ("truncate",)),
        id="tpt-float",
    ),
]


# Spellings only the openai profile refuses: the legacy profile reads them as the
# legacy server's lax request model did (tests/test_legacy_leniency.py).
STRICT_TYPE_ERRORS: list[Any] = [
    pytest.param(Bad(req(input=[True, 2]), 400, "input", ("input[0]",)), id="token-id-bool-first"),
    pytest.param(
        Bad(req(input=[1, False]), 400, "input", ("input[1]", "boolean")), id="token-id-bool"
    ),
    pytest.param(
        Bad(req(input=[1, 2.0]), 400, "input", ("input[1]", "integer")), id="token-id-float"
    ),
    pytest.param(
        Bad(req(dimensions=256.0), 400, "dimensions", ("dimensions", "integer")),
        id="dims-float-int",
    ),
    pytest.param(
        Bad(req(dimensions="256"), 400, "dimensions", ("dimensions", "string")), id="dims-string"
    ),
    pytest.param(
        Bad(req(dimensions=True), 400, "dimensions", ("dimensions", "boolean")), id="dims-true"
    ),
    pytest.param(
        Bad(req(truncate_prompt_tokens=True), 400, "truncate_prompt_tokens", ("truncate",)),
        id="tpt-true",
    ),
    pytest.param(
        Bad(req(truncate_prompt_tokens="8"), 400, "truncate_prompt_tokens", ("truncate",)),
        id="tpt-string",
    ),
]


def check_error(exc: ApiError, status: int, param: str | None, says: tuple[str, ...]) -> None:
    assert exc.status == status, repr(exc)
    assert exc.param == param, repr(exc)
    assert exc.type == "invalid_request_error"
    message = exc.message.lower()
    for fragment in says:
        assert fragment.lower() in message, f"{fragment!r} not in {exc.message!r}"
    envelope = orjson.loads(exc.envelope())
    assert list(envelope) == ["error"]
    assert set(envelope["error"]) == {"message", "type", "param", "code"}
    assert envelope["error"]["message"] == exc.message
    assert envelope["error"]["param"] == param
    assert envelope["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("bad", BAD_REQUESTS)
def test_client_mistake_is_a_4xx(bad: Bad, qwen_contract: Contract) -> None:
    with pytest.raises(ApiError) as caught:
        run(bad.body, qwen_contract)
    check_error(caught.value, bad.status, bad.param, bad.says)


@pytest.mark.parametrize("bad", [*BAD_REQUESTS, *STRICT_TYPE_ERRORS])
def test_openai_profile_refuses_every_lax_spelling(bad: Bad, openai_contract: Contract) -> None:
    with pytest.raises(ApiError) as caught:
        run(bad.body, openai_contract)
    check_error(caught.value, bad.status, bad.param, bad.says)


def test_openai_profile_refuses_a_byte_order_mark(openai_contract: Contract) -> None:
    with pytest.raises(ApiError) as caught:
        run(b"\xef\xbb\xbf" + orjson.dumps(req()), openai_contract)
    check_error(caught.value, 400, None, ("byte order mark",))


@pytest.mark.parametrize(
    ("body", "status", "param", "says"),
    [
        pytest.param(
            req(input=["a", "b", "c"]), 400, "input", ("3", "2"), id="three-inputs-limit-2"
        ),
        pytest.param(
            req(input=[[1], [2], [3]]), 400, "input", ("3", "2"), id="three-id-lists-limit-2"
        ),
        pytest.param(
            req(input="x" * 2000), 413, None, ("1024", "bytes"), id="body-over-1024-bytes"
        ),
    ],
)
def test_policy_limits(
    body: dict[str, Any],
    status: int,
    param: str | None,
    says: tuple[str, ...],
    small_contract: Contract,
) -> None:
    with pytest.raises(ApiError) as caught:
        run(body, small_contract)
    check_error(caught.value, status, param, says)


def test_policy_limits_allow_up_to_the_limit(small_contract: Contract) -> None:
    forward = run(req(input=["a", "b"]), small_contract)
    assert forward.plan.input_count == 2
    body = orjson.dumps(req(input="x" * 900))
    assert len(body) <= 1024
    assert run(body, small_contract).plan.input_count == 1


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(req(input=[VOCAB - 1]), id="last-token-id"),
        pytest.param(req(input=[0]), id="token-id-0"),
        pytest.param(req(input=[[0], [EOS, 1]]), id="id-lists"),
        pytest.param(req(dimensions=32), id="dims-32"),
        pytest.param(req(dimensions=1024), id="dims-1024"),
        pytest.param(req(truncate_prompt_tokens=-1), id="tpt-minus-1"),
        pytest.param(req(truncate_prompt_tokens=1), id="tpt-1"),
        pytest.param(req(truncate_prompt_tokens=1024), id="tpt-1024"),
        pytest.param(req(input_type=None, instruction=None), id="nulls-mean-unset"),
        pytest.param(req(encoding_format=None), id="enc-null"),
        pytest.param(req(input=""), id="empty-string"),
        pytest.param(req(input_type="doc"), id="input-type-doc"),
    ],
)
def test_valid_edge_values_are_accepted(body: dict[str, Any], qwen_contract: Contract) -> None:
    forward = run(body, qwen_contract)
    assert forward.plan.model == MODEL
    if forward.upstream_body is not None:
        assert_clean_upstream(upstream_doc(forward))


# -- prompts -----------------------------------------------------------------------


def test_query_gets_the_qwen3_instruction(qwen_contract: Contract, raw_tok: Tokenizer) -> None:
    forward = run(req(input=FRANCE, input_type="query"), qwen_contract)
    doc = upstream_doc(forward)
    assert_clean_upstream(doc)
    assert as_list(doc["input"]) == [EXPECTED_FRANCE_PROMPT]
    # The seed's numbers: 28 tokens with the instruction, 9 without (EOS included).
    assert len(token_ids(raw_tok, EXPECTED_FRANCE_PROMPT)) + 1 == 28
    assert len(token_ids(raw_tok, FRANCE)) + 1 == 9
    assert forward.stats.prompted
    assert forward.stats.fields_stripped == 1
    assert forward.stats.truncated_inputs == 0


@pytest.mark.parametrize("input_type", QUERY_TYPES)
def test_every_query_vocabulary(input_type: str, qwen_contract: Contract) -> None:
    texts = [FRANCE, "best pizza near me"]
    doc = upstream_doc(run(req(input=texts, input_type=input_type), qwen_contract))
    assert_clean_upstream(doc)
    assert doc["input"] == [qwen_prompt(t) for t in texts]


@pytest.mark.parametrize("input_type", [*DOCUMENT_TYPES, "doc"])
def test_every_document_vocabulary_gets_no_prefix(input_type: str, qwen_contract: Contract) -> None:
    texts = ["Paris is the capital of France.", "Berlin is in Germany."]
    forward = run(req(input=texts, input_type=input_type), qwen_contract)
    doc = upstream_doc(forward)  # rewritten only to strip input_type
    assert_clean_upstream(doc)
    assert doc["input"] == texts
    assert not forward.stats.prompted
    assert forward.stats.fields_stripped == 1


@pytest.mark.parametrize(
    ("fields", "task"),
    [
        pytest.param(
            {"instruction": "Find the country for a capital"},
            "Find the country for a capital",
            id="instruction-alone-means-query",
        ),
        pytest.param(
            {"input_type": "query", "instruction": "Retrieve math proofs"},
            "Retrieve math proofs",
            id="instruction-replaces-task",
        ),
        pytest.param(
            {"input_type": "search_query", "instruction": "Use {text} and {instruction}"},
            "Use {text} and {instruction}",
            id="braces-are-literal",
        ),
        pytest.param(
            {"input_type": "question", "instruction": None}, DEFAULT_TASK, id="null-instruction"
        ),
    ],
)
def test_instruction(fields: dict[str, Any], task: str, qwen_contract: Contract) -> None:
    forward = run(req(input=FRANCE, **fields), qwen_contract)
    doc = upstream_doc(forward)
    assert_clean_upstream(doc)
    assert as_list(doc["input"]) == [qwen_prompt(FRANCE, task)]
    assert forward.stats.fields_stripped == len(fields)


def test_query_prefix_applies_to_token_ids(qwen_contract: Contract, raw_tok: Tokenizer) -> None:
    ids = token_ids(raw_tok, FRANCE) + [EOS]
    doc = upstream_doc(run(req(input=ids, input_type="query"), qwen_contract))
    prefix = token_ids(raw_tok, qwen_prompt(""))
    assert doc["input"] == [prefix + ids]


# -- dimensions and encodings ---------------------------------------------------------


@pytest.mark.parametrize(
    ("dimensions", "emulated"),
    [
        pytest.param(256, 256, id="256"),
        pytest.param(32, 32, id="32-min"),
        pytest.param(1023, 1023, id="1023"),
        pytest.param(1024, None, id="1024-native"),
    ],
)
def test_dimensions_stripped_and_planned(
    dimensions: int, emulated: int | None, qwen_contract: Contract
) -> None:
    forward = run(req(input=["a", "b", "c"], dimensions=dimensions), qwen_contract)
    doc = upstream_doc(forward)
    assert_clean_upstream(doc)
    assert doc["input"] == ["a", "b", "c"]
    plan = forward.plan
    assert plan.dimensions == emulated
    assert plan.native_dimensions == 1024
    assert plan.input_count == 3
    assert forward.stats.dimensions_emulated == (emulated is not None)
    assert plan.client_encoding is Encoding.FLOAT
    if emulated is None:
        assert plan.upstream_encoding is Encoding.FLOAT
        assert "encoding_format" not in doc
        assert not plan.rewrites_vectors
    else:
        assert plan.upstream_encoding is Encoding.BASE64
        assert doc["encoding_format"] == "base64"
        assert plan.rewrites_vectors


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"input_type": "query", "instruction": "X", "dimensions": 64}, id="all-three"),
        pytest.param({"input_type": "document", "dimensions": 1024}, id="doc-native"),
        pytest.param({"instruction": "Y", "encoding_format": "base64"}, id="instruction-b64"),
        pytest.param({"input_type": "passage", "dimensions": 100, "user": "u1"}, id="with-user"),
    ],
)
def test_legacy_fields_never_reach_upstream(
    fields: dict[str, Any], qwen_contract: Contract
) -> None:
    forward = run(req(input=["q1", "q2"], **fields), qwen_contract)
    doc = upstream_doc(forward)
    assert_clean_upstream(doc)
    assert forward.stats.fields_stripped == len(set(fields) & set(LEGACY_FIELDS))
    for key, value in fields.items():
        if key not in LEGACY_FIELDS and key != "encoding_format":
            assert doc[key] == value  # other fields are forwarded untouched


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(req(), id="string"),
        pytest.param(req(input=["a", "b"]), id="strings"),
        pytest.param(req(input=[1, 2, 3]), id="token-ids"),
        pytest.param(req(input=[[1, 2], [3, EOS]]), id="token-id-lists"),
        pytest.param(req(encoding_format="float"), id="explicit-float"),
        pytest.param(req(user="someone", truncate_prompt_tokens=-1), id="other-fields"),
        pytest.param(req(input="가나다 " * 50), id="short-korean"),
    ],
)
def test_request_needing_no_change_is_forwarded_as_sent(
    body: dict[str, Any], qwen_contract: Contract
) -> None:
    forward = run(body, qwen_contract)
    assert forward.upstream_body is None
    assert forward.stats.fields_stripped == 0
    assert forward.stats.truncated_inputs == 0
    assert not forward.plan.rewrites_vectors


def test_base64_under_legacy_profile_answers_floats(qwen_contract: Contract) -> None:
    forward = run(req(encoding_format="base64"), qwen_contract)
    assert forward.plan.client_encoding is Encoding.FLOAT
    assert forward.plan.upstream_encoding is Encoding.FLOAT
    doc = upstream_doc(forward)
    assert doc.get("encoding_format", "float") == "float"
    assert doc["input"] == "hello"


@pytest.mark.parametrize(
    ("encoding", "client"),
    [
        pytest.param("base64", Encoding.BASE64, id="base64"),
        pytest.param("float", Encoding.FLOAT, id="float"),
        pytest.param(_DROP, Encoding.FLOAT, id="unset"),
    ],
)
def test_openai_profile_passes_encoding_through(
    encoding: Any, client: Encoding, openai_contract: Contract
) -> None:
    forward = run(req(encoding_format=encoding), openai_contract)
    assert forward.upstream_body is None
    assert forward.plan.client_encoding is client
    assert forward.plan.upstream_encoding is client
    assert not forward.plan.rewrites_vectors


@pytest.mark.parametrize("profile", ["legacy", "openai"])
@pytest.mark.parametrize("encoding", [None, "float", "base64"])
def test_upstream_asked_for_base64_when_dimensions_emulated(
    profile: str,
    encoding: str | None,
    qwen_contract: Contract,
    openai_contract: Contract,
) -> None:
    contract = qwen_contract if profile == "legacy" else openai_contract
    forward = run(req(dimensions=128, encoding_format=encoding), contract)
    doc = upstream_doc(forward)
    assert_clean_upstream(doc)
    assert doc["encoding_format"] == "base64"
    assert forward.plan.upstream_encoding is Encoding.BASE64
    assert forward.plan.dimensions == 128
    expected_client = (
        Encoding.BASE64 if (profile == "openai" and encoding == "base64") else Encoding.FLOAT
    )
    assert forward.plan.client_encoding is expected_client


# -- truncation ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_english(raw_tok: Tokenizer) -> str:
    return repeat_to_tokens(raw_tok, "The quick brown fox jumps over the lazy dog. ", 3000)


@pytest.fixture(scope="module")
def long_korean(raw_tok: Tokenizer) -> str:
    return repeat_to_tokens(raw_tok, "대한민국의 수도는 서울이며 인구는 약 천만 명이다. ", 3000)


@pytest.mark.parametrize("which", ["english", "korean"])
def test_long_text_is_sent_as_1024_token_ids(
    which: str, long_english: str, long_korean: str, raw_tok: Tokenizer, qwen_contract: Contract
) -> None:
    text = long_english if which == "english" else long_korean
    full = token_ids(raw_tok, text)
    assert len(full) >= 3000
    forward = run(req(input=text), qwen_contract)
    doc = upstream_doc(forward)
    assert_clean_upstream(doc)
    (sent,) = doc["input"]
    assert isinstance(sent, list)
    assert len(sent) == LIMIT
    assert sent[-1] == EOS
    assert sent == full[: LIMIT - 1] + [EOS]
    assert forward.stats.truncated_inputs == 1
    # A lower bound: a long input's tail past a few thousand tokens is never tokenized.
    assert 0 < forward.stats.tokens_cut <= len(full) + 1 - LIMIT
    assert forward.plan.input_count == 1


def test_mixed_batch_sends_every_input_as_ids(
    long_english: str, long_korean: str, raw_tok: Tokenizer, qwen_contract: Contract
) -> None:
    texts = ["short one", long_english, "안녕하세요", long_korean, "🙂 emoji"]
    forward = run(req(input=texts), qwen_contract)
    doc = upstream_doc(forward)
    sent = doc["input"]
    assert len(sent) == len(texts)
    fulls = [token_ids(raw_tok, t) for t in texts]
    for text, full, ids in zip(texts, fulls, sent, strict=True):
        assert isinstance(ids, list), text[:20]
        if len(full) + 1 <= LIMIT:
            assert ids == full + [EOS]
        else:
            assert ids == full[: LIMIT - 1] + [EOS]
    assert forward.stats.truncated_inputs == 2
    assert (
        0 < forward.stats.tokens_cut <= sum(len(f) + 1 - LIMIT for f in fulls if len(f) + 1 > LIMIT)
    )
    assert forward.plan.input_count == 5


def test_long_query_keeps_the_instruction_at_the_head(
    long_english: str, raw_tok: Tokenizer, qwen_contract: Contract
) -> None:
    forward = run(req(input=[long_english, FRANCE], input_type="query"), qwen_contract)
    long_ids, short_ids = upstream_doc(forward)["input"]
    full = token_ids(raw_tok, qwen_prompt(long_english))
    assert long_ids == full[: LIMIT - 1] + [EOS]
    assert short_ids == token_ids(raw_tok, EXPECTED_FRANCE_PROMPT) + [EOS]
    assert len(short_ids) == 28
    # A lower bound: a long input's tail past a few thousand tokens is never tokenized.
    assert 0 < forward.stats.tokens_cut <= len(full) + 1 - LIMIT


@pytest.mark.parametrize(
    ("ids_len", "ends_with_eos"),
    [
        pytest.param(1500, False, id="1500-no-eos"),
        pytest.param(1500, True, id="1500-eos"),
        pytest.param(1025, False, id="1025-no-eos"),
        pytest.param(1025, True, id="1025-eos"),
    ],
)
def test_long_token_ids_are_cut(ids_len: int, ends_with_eos: bool, qwen_contract: Contract) -> None:
    ids = [(i * 7919) % 150000 for i in range(ids_len)]
    if ends_with_eos:
        ids[-1] = EOS
    forward = run(req(input=[ids, [1, 2, 3]]), qwen_contract)
    long_sent, short_sent = upstream_doc(forward)["input"]
    assert len(long_sent) == LIMIT
    if ends_with_eos:
        assert long_sent == ids[: LIMIT - 1] + [EOS]
    else:
        assert long_sent == ids[:LIMIT]
    assert short_sent == [1, 2, 3]
    assert forward.stats.truncated_inputs == 1
    assert forward.stats.tokens_cut == ids_len - LIMIT


def test_single_flat_token_list_is_cut(qwen_contract: Contract) -> None:
    ids = [11] * 2000 + [EOS]
    sent = upstream_doc(run(req(input=ids), qwen_contract))["input"]
    assert sent == [[11] * (LIMIT - 1) + [EOS]]


def test_token_ids_at_the_limit_untouched(qwen_contract: Contract) -> None:
    forward = run(req(input=[[7] * (LIMIT - 1) + [EOS], [7] * LIMIT]), qwen_contract)
    assert forward.upstream_body is None
    assert forward.stats.truncated_inputs == 0


@pytest.mark.parametrize(
    ("content_tokens", "truncated"),
    [
        pytest.param(LIMIT - 2, False, id="1022+eos"),
        pytest.param(LIMIT - 1, False, id="1023+eos-at-limit"),
        pytest.param(LIMIT, True, id="1024+eos-one-over"),
        pytest.param(LIMIT + 1, True, id="1025+eos"),
    ],
)
def test_text_limit_boundary(
    content_tokens: int, truncated: bool, raw_tok: Tokenizer, qwen_contract: Contract
) -> None:
    text = exactly_n_tokens(raw_tok, content_tokens)
    forward = run(req(input=text), qwen_contract)
    if not truncated:
        assert forward.upstream_body is None
        assert forward.stats.truncated_inputs == 0
        assert forward.stats.tokens_cut == 0
        return
    sent = upstream_doc(forward)["input"]
    full = token_ids(raw_tok, text)
    assert sent == [full[: LIMIT - 1] + [EOS]]
    assert forward.stats.truncated_inputs == 1
    assert forward.stats.tokens_cut == content_tokens + 1 - LIMIT


def test_gateway_tokenizer_matches_the_oracle(qwen_contract: Contract, raw_tok: Tokenizer) -> None:
    tok: ModelTokenizer = qwen_contract.tokenizers[MODEL]
    assert tok.append_ids == (EOS,)
    assert tok.prepend_ids == ()
    assert tok.vocab_size == raw_tok.get_vocab_size(with_added_tokens=True) == VOCAB


def test_shipped_policy_facts(qwen_policy: GatewayPolicy) -> None:
    model = qwen_policy.models[MODEL]
    assert model.max_tokens == LIMIT
    assert model.native_dimensions == 1024
    assert model.accepts_dimensions(32) and not model.accepts_dimensions(31)


# -- hostile input (the corpus in tests/hostile_corpus.py) ------------------


def nested_arrays(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def with_nvext(levels: int, **fields: Any) -> bytes:
    """A request with an unknown field ``levels`` arrays deep (written by the stdlib:
    orjson itself refuses to write it, which is the point)."""
    return json.dumps({**req(**fields), "nvext": nested_arrays(levels)}).encode()


@pytest.mark.parametrize("rewritten", [False, True], ids=["forwarded-as-sent", "rewritten"])
def test_too_deep_unknown_field_is_400_not_500(rewritten: bool, qwen_contract: Contract) -> None:
    """Was: forwarded as sent, but a TypeError from orjson.dumps (a 500) as soon as the
    body had to be rewritten (orjson writes at most 254 nested levels)."""
    extra = {"input_type": "query"} if rewritten else {}
    with pytest.raises(ApiError) as caught:
        run(with_nvext(254, **extra), qwen_contract)
    check_error(caught.value, 400, None, ("nvext", "deep"))
    assert caught.value.code == "invalid_json"


@pytest.mark.parametrize("rewritten", [False, True], ids=["forwarded-as-sent", "rewritten"])
def test_unknown_field_at_the_depth_limit_is_forwarded(
    rewritten: bool, qwen_contract: Contract
) -> None:
    extra = {"input_type": "query"} if rewritten else {}
    forward = run(with_nvext(253, **extra), qwen_contract)
    if rewritten:
        assert upstream_doc(forward)["nvext"] == nested_arrays(253)
    else:
        assert forward.upstream_body is None


def test_nesting_past_the_stdlib_parser_is_400(qwen_contract: Contract) -> None:
    # orjson reads up to 1,024 levels; the duplicate-key check's stdlib parser ~1,000.
    body = b'{"model":"%s","input":"a:b","x":%s}' % (MODEL.encode(), b"[" * 1020 + b"]" * 1020)
    with pytest.raises(ApiError) as caught:
        run(body, qwen_contract)
    check_error(caught.value, 400, None, ("deep",))


@pytest.mark.parametrize(
    "user", [5, 1.5, True, ["u"], {"id": "u"}], ids=["int", "float", "bool", "array", "object"]
)
def test_user_must_be_a_string(user: Any, qwen_contract: Contract) -> None:
    """Was: forwarded, to be refused by Dynamo's and vLLM's own 400 (async-openai and
    vLLM's request model both declare `user` a string)."""
    with pytest.raises(ApiError) as caught:
        run(req(user=user), qwen_contract)
    check_error(caught.value, 400, "user", ("user", "string"))


@pytest.mark.parametrize("user", ["someone", ""], ids=["string", "empty"])
def test_user_string_is_forwarded_as_sent(user: Any, qwen_contract: Contract) -> None:
    assert run(req(user=user), qwen_contract).upstream_body is None


@pytest.mark.parametrize("profile", ["legacy", "openai"])
@pytest.mark.parametrize(
    "field",
    [
        "encoding_format",
        "user",
        "dimensions",
        "input_type",
        "instruction",
        "truncate_prompt_tokens",
        "priority",
    ],
)
def test_null_means_absent_and_is_never_forwarded(
    field: str, profile: str, qwen_contract: Contract, openai_contract: Contract
) -> None:
    """Was: `"encoding_format": null` went upstream as sent, where vLLM refuses it (400)."""
    contract = qwen_contract if profile == "legacy" else openai_contract
    forward = run(req(**{field: None}), contract)
    assert upstream_doc(forward) == {"model": MODEL, "input": "hello"}
    assert forward.plan == run(req(), contract).plan


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        pytest.param(
            b'{"model":"%s","input":"a","input":"b"}' % MODEL.encode(),
            "input",
            ("input", "more than once"),
            id="input-twice",
        ),
        pytest.param(
            # The copies are equal after unescaping: still the same key.
            b'{"model":"%s","input":"a","\\u0069nput":[1]}' % MODEL.encode(),
            "input",
            ("input",),
            id="input-twice-escaped",
        ),
        pytest.param(
            b'{"model":"other","input":"a","model":"%s"}' % MODEL.encode(),
            "model",
            ("model",),
            id="model-twice",
        ),
        pytest.param(
            b'{"model":"%s","input":"a","dimensions":64,"dimensions":2}' % MODEL.encode(),
            "dimensions",
            ("dimensions",),
            id="dimensions-twice",
        ),
        pytest.param(
            b'{"model":"%s","input":"a","extra":1,"extra":2}' % MODEL.encode(),
            None,
            ("extra", "more than once"),
            id="unknown-field-twice",
        ),
        pytest.param(
            b'{"model":"%s","input":"a","nvext":{"k":1,"k":2}}' % MODEL.encode(),
            None,
            ("'k'",),
            id="nested-key-twice",
        ),
        pytest.param(
            # Colons in the text: the check cannot stop at counting ':' bytes.
            b'{"model":"%s","input":"at 10:30: go","extra":1,"extra":2}' % MODEL.encode(),
            None,
            ("extra", "more than once"),
            id="repeat-with-colons-in-text",
        ),
        pytest.param(
            # An escaped colon makes up, in the count, for the ':' of the dropped copy.
            b'{"model":"%s","input":"a","extra":1,"extra":"\\u003a"}' % MODEL.encode(),
            None,
            ("extra", "more than once"),
            id="repeat-hidden-by-an-escaped-colon",
        ),
    ],
)
def test_repeated_keys_are_400(
    body: bytes, param: str | None, says: tuple[str, ...], qwen_contract: Contract
) -> None:
    """Was: the last copy silently won (orjson), and an unchanged body went upstream
    with both copies, where Dynamo's serde structs refuse a duplicate field."""
    with pytest.raises(ApiError) as caught:
        run(body, qwen_contract)
    check_error(caught.value, 400, param, says)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(req(input="time: 10:30, url: http://x"), id="colons-in-text"),
        pytest.param(req(input=["input", "model"], user="input:model"), id="key-names-in-text"),
        pytest.param(req(nvext={"a": {"a": 1}, "b": [{"a": 2}]}), id="same-key-other-objects"),
        pytest.param(req(input="a\u003ab", **{"k:": "v:"}), id="colons-in-keys"),
        pytest.param(
            b'{"model":"%s","input":"\\u003a:","x":"\\u003A"}' % MODEL.encode(),
            id="escaped-colons",
        ),
    ],
)
def test_no_false_repeated_keys(body: dict[str, Any] | bytes, qwen_contract: Contract) -> None:
    assert run(body, qwen_contract).plan.model == MODEL


@pytest.mark.parametrize(
    ("field", "param"),
    [("input_type", "input_type"), ("model", "model")],
    ids=["input-type", "model"],
)
def test_error_messages_never_echo_a_huge_field(
    field: str, param: str, qwen_contract: Contract
) -> None:
    """Was: an unknown 1 MB input_type came back whole in the 400's message
    (prompts._unknown_input_type quotes it); errors.ApiError now bounds every message."""
    with pytest.raises(ApiError) as caught:
        run(req(**{field: "q" * 1_000_000}), qwen_contract)
    assert caught.value.param == param
    assert 100 < len(caught.value.message) <= MAX_MESSAGE_CHARS
    assert len(caught.value.envelope()) < MAX_MESSAGE_CHARS + 200


@pytest.mark.parametrize("profile", ["legacy", "openai"])
@pytest.mark.parametrize("rewritten", [False, True], ids=["as-sent", "rewritten"])
def test_unknown_fields_are_forwarded_as_sent(
    profile: str, rewritten: bool, qwen_contract: Contract, openai_contract: Contract
) -> None:
    """docs/errors.md, "The request contract": fields the gateway does not interpret (``foo``,
    vLLM's ``priority``, Dynamo's ``nvext``) reach the upstream unchanged, in an
    unchanged body or in a rewritten one; ``user`` is checked to be a string and
    forwarded; the legacy fields never are."""
    contract = qwen_contract if profile == "legacy" else openai_contract
    unknown = {"foo": {"a": [1, "x", None]}, "priority": 3, "nvext": [{"k": True}], "user": "u"}
    extra = {"input_type": "query", "dimensions": 256} if rewritten else {}
    body = orjson.dumps(req(**unknown, **extra))
    forward = run(body, contract)
    if not rewritten:
        assert forward.upstream_body is None  # the client's bytes, unknown fields included
        return
    doc = upstream_doc(forward)
    assert {k: doc[k] for k in unknown} == unknown
    assert_clean_upstream(doc)
