"""Each legacy behaviour a policy can say, on the core alone (sans-I/O): what the
upstream is asked and what the client gets, checked against an oracle of its own.

- truncation: transformers' fast tokenizer is the oracle for a cut from the right
  or the left (``truncation_side``), and its untruncated ids sliced for a cut that
  loses the special tokens (``ids[:max_length]``); on Qwen3's tokenizer (an end token
  only) and on a BERT-style one built here ([CLS] ... [SEP]);
- prompts: the instruction's four uses, a default input_type, an alias of its own;
- encoding and leniency apart: base64 honoured with lax integers, a BOM alone;
- Matryoshka: a set without the native size, a range below it, a cut not
  re-normalised (numpy is the oracle);
- errors: the status of each kind of mistake and the body's shape, upstream 5xx kept.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tokenizers
import transformers
from tokenizers import models, pre_tokenizers, processors

from extproc.core.api_errors import ApiError
from extproc.core.contract import Contract
from extproc.core.plan import Encoding, ResponsePlan
from extproc.core.policy import EncodingProfile, PolicyError, load_policy_text
from extproc.core.request_rewrite import Forward, rewrite_request
from extproc.core.response_rewrite import rewrite_response
from extproc.service.contract_loading import load_contract
from testing_support.qwen import QWEN_EOS, QWEN_MODEL

QWEN_QUERY = "Instruct: {instruction}\\nQuery:{text}"
TASK = "Given a web search query, retrieve relevant passages that answer the query"


def contract(text: str, tokenizer_dir: Path, model: str = QWEN_MODEL) -> Contract:
    return load_contract(load_policy_text(text, tokenizer_overrides={model: tokenizer_dir}))


def qwen_policy(entry: str = "", top: str = "", *, profile: str | None = "LEGACY") -> str:
    lines = [
        top,
        "models:",
        f"  - name: {QWEN_MODEL}",
        "    preset: qwen3-embedding-0.6b",
        "    max_tokens: 64",
        *([f"    encoding_profile: {profile}"] if profile else []),
        *(f"    {line}" for line in entry.strip().splitlines()),
    ]
    return "\n".join(lines) + "\n"


def send(c: Contract, **fields: Any) -> Forward:
    body = {"model": next(iter(c.policy.models)), **fields}
    return rewrite_request(orjson.dumps(body), c.policy, c.tokenizers, clock=time.monotonic)


def sent_input(forward: Forward) -> Any:
    assert forward.upstream_body is not None
    return orjson.loads(forward.upstream_body)["input"]


def refusal(c: Contract, **fields: Any) -> tuple[int, dict[str, Any]]:
    """What the client gets for a request the gateway refuses."""
    with pytest.raises(ApiError) as caught:
        send(c, **fields)
    status, body = c.policy.errors.answer(caught.value)
    return status, orjson.loads(body)


# --------------------------------------------------------------------- truncation


def bert_tokenizer_dir(tmp_path: Path, words: list[str]) -> Path:
    """A BERT-style tokenizer ([CLS] text [SEP], a word per token) built with the
    tokenizers library: both kinds of special token, so both sides can lose one."""
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    return tmp_path


WORDS = [f"w{i}" for i in range(300)]
LONG = " ".join(WORDS)
BERT_MODEL = "bert-style"


def bert_policy(truncation: str, *, max_tokens: int = 40, prompt: str = "") -> str:
    return f"""
models:
  - name: {BERT_MODEL}
    preset: plain
    max_tokens: {max_tokens}
    native_dimensions: 8
    encoding_profile: OPENAI
    tokenizer: {{special_tokens: {{from_tokenizer: true}}}}
    truncation: {truncation}
    prompts: {{query: "{prompt}{{text}}"}}
"""


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bert_tokenizer_dir(tmp_path_factory.mktemp("bert"), [*WORDS, "query:"])


def fast(tokenizer_dir: Path, side: str) -> transformers.PreTrainedTokenizerFast:
    tok = tokenizers.Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, truncation_side=side)  # type: ignore[no-untyped-call]


@pytest.mark.parametrize(
    ("truncation", "side", "keep"),
    [
        ("{}", "right", True),
        ("{side: LEFT}", "left", True),
        ("{keep_special_tokens: false}", "right", False),
        ("{side: LEFT, keep_special_tokens: false}", "left", False),
    ],
)
@pytest.mark.parametrize("query", [False, True], ids=["plain", "query"])
def test_bert_style_cuts_match_transformers(
    truncation: str, side: str, keep: bool, query: bool, bert_dir: Path
) -> None:
    c = contract(bert_policy(truncation, prompt="query: "), bert_dir, BERT_MODEL)
    oracle = fast(bert_dir, side)
    text = ("query: " if query else "") + LONG
    if keep:
        expected = oracle(text, truncation=True, max_length=40)["input_ids"]
    else:
        whole = oracle(text)["input_ids"]
        expected = whole[:40] if side == "right" else whole[-40:]
    fields = {"input_type": "query"} if query else {}
    (sent,) = sent_input(send(c, input=[LONG, "w1 w2"], **fields))[:1]
    assert sent == expected and len(sent) == 40
    assert (sent[0] == 1) == (keep or side == "right")  # [CLS] lost by a left cut only
    assert (sent[-1] == 2) == (keep or side == "left")  # [SEP] lost by a right cut only


@pytest.mark.parametrize("side", ["right", "left"])
def test_qwen3_cuts_match_transformers(side: str, qwen_dir: Path) -> None:
    c = contract(qwen_policy(f"truncation: {{side: {side.upper()}}}"), qwen_dir)
    tok = tokenizers.Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", QWEN_EOS)]
    )
    oracle = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, truncation_side=side)  # type: ignore[no-untyped-call]
    text = "The legacy server cut every input to its limit, one way or the other. " * 20
    (sent,) = sent_input(send(c, input=text))
    assert sent == oracle(text, truncation=True, max_length=64)["input_ids"]
    assert sent[-1] == QWEN_EOS


def test_token_ids_are_cut_like_texts(bert_dir: Path) -> None:
    """A client's ids: cut on the policy's side; special tokens it sent are kept."""
    left = contract(bert_policy("{side: LEFT}"), bert_dir, BERT_MODEL)
    ids = [1, *range(3, 103), 2]
    (sent,) = sent_input(send(left, input=[ids]))
    assert sent == [1, *range(65, 103), 2]
    (bare,) = sent_input(send(left, input=[list(range(3, 103))]))
    assert bare == list(range(63, 103))


def test_refusing_long_inputs(bert_dir: Path, qwen_dir: Path) -> None:
    c = contract(bert_policy("{refuse: true}"), bert_dir, BERT_MODEL)
    status, body = refusal(c, input=["w1 w2", LONG])
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["param"] == "input" and "input[1]" in body["error"]["message"]
    status, _ = refusal(c, input=[list(range(3, 45))])  # 42 ids > 40
    assert status == 400
    at_limit = " ".join(WORDS[:38])  # 38 words + [CLS] + [SEP] = 40
    assert send(c, input=at_limit).upstream_body is None
    assert send(c, input=[list(range(3, 43))]).upstream_body is None  # 40 ids
    # the legacy status, in the legacy shape
    top = "errors: {shape: FASTAPI, status: {too_long: 422}}"
    fastapi = contract(qwen_policy("truncation: {refuse: true}", top), qwen_dir)
    status, body = refusal(fastapi, input="word " * 100)
    assert status == 422  # raised by its handler, not its request model: one text
    assert isinstance(body["detail"], str) and "64 tokens" in body["detail"]


# --------------------------------------------------------------------- prompts


@pytest.mark.parametrize(
    ("use", "fields", "expected"),
    [
        ("TASK", {"instruction": "Find it"}, "Instruct: Find it\nQuery:q"),
        ("TASK", {"input_type": "query"}, f"Instruct: {TASK}\nQuery:q"),
        ("PROMPT", {"instruction": "Find it: "}, "Find it: q"),
        ("PROMPT", {"input_type": "query", "instruction": "Find: "}, "Find: q"),
        ("PROMPT", {"input_type": "query"}, f"Instruct: {TASK}\nQuery:q"),
        ("IGNORED", {"instruction": "Find it"}, None),
        ("IGNORED", {"instruction": 42}, None),  # the legacy model had no such field
        ("IGNORED", {"input_type": "query", "instruction": "x"}, f"Instruct: {TASK}\nQuery:q"),
        ("IGNORED", {"input_type": "document", "instruction": "x"}, None),
    ],
)
def test_instruction_uses(
    use: str, fields: dict[str, Any], expected: str | None, qwen_dir: Path
) -> None:
    c = contract(qwen_policy(f"prompts: {{instruction: {use}}}"), qwen_dir)
    forward = send(c, input="q", **fields)
    if expected is None:
        sent = None if forward.upstream_body is None else sent_input(forward)
        assert sent in (None, "q"), sent  # as sent: the field stripped, no prompt
        assert forward.upstream_body is None or b"instruction" not in forward.upstream_body
    else:
        assert sent_input(forward) == [expected]  # prompted texts go as a list


def test_refused_instruction(qwen_dir: Path) -> None:
    c = contract(qwen_policy("prompts: {instruction: REFUSED}"), qwen_dir)
    status, body = refusal(c, input="q", instruction="Find it")
    assert status == 400 and body["error"]["param"] == "instruction"
    legacy = contract(
        qwen_policy("prompts: {instruction: REFUSED}", "errors: {status: {instruction: 422}}"),
        qwen_dir,
    )
    assert refusal(legacy, input="q", instruction="Find it")[0] == 422
    assert refusal(legacy, input=[])[0] == 400  # other mistakes keep their status


def test_default_input_type_and_aliases(qwen_dir: Path) -> None:
    entry = """
prompts:
  query: "query: {text}"
  document: "passage: {text}"
  default_input_type: document
  aliases: {search_query: "search_query: {text}", doc: "{text}"}
"""
    c = contract(qwen_policy(entry), qwen_dir)
    assert sent_input(send(c, input="q")) == ["passage: q"]
    assert sent_input(send(c, input="q", input_type="query")) == ["query: q"]
    assert sent_input(send(c, input="q", input_type="question")) == ["query: q"]
    assert sent_input(send(c, input="q", input_type="search_query")) == ["search_query: q"]
    assert sent_input(send(c, input="q", input_type="doc")) == "q"  # its own: no prompt
    assert sent_input(send(c, input="q", input_type="passage")) == ["passage: q"]
    assert sent_input(send(c, input="q", instruction="x")) == ["query: q"]  # TASK, no slot


# --------------------------------------------------------------------- encoding


def test_base64_honoured_with_lax_integers(qwen_dir: Path) -> None:
    """Neither profile: base64 answered, and "64", 64.0 and a BOM still taken."""
    lax = "base64: HONOURED\nleniency: {integers: true, bom: true}"
    c = contract(qwen_policy(lax, profile=None), qwen_dir)
    model = c.policy.models[QWEN_MODEL]
    assert model.encoding_profile is None and model.honours_base64 and model.leniency.integers
    forward = send(c, input="q", encoding_format="base64", dimensions="64")
    assert forward.plan.client_encoding is Encoding.BASE64 and forward.plan.dimensions == 64
    assert send(c, input="q", dimensions=64.0).plan.dimensions == 64
    body = b"\xef\xbb\xbf" + orjson.dumps({"model": QWEN_MODEL, "input": "q"})
    assert rewrite_request(body, c.policy, c.tokenizers, clock=time.monotonic).plan.input_count == 1


def test_leniency_parts_apart(qwen_dir: Path) -> None:
    """A byte order mark accepted, integers strict; and the other way round."""
    strict = "base64: HONOURED\nleniency: {integers: false, bom: true}"
    bom = contract(qwen_policy(strict, profile=None), qwen_dir)
    body = b"\xef\xbb\xbf" + orjson.dumps({"model": QWEN_MODEL, "input": "q"})
    assert (
        rewrite_request(body, bom.policy, bom.tokenizers, clock=time.monotonic).plan.input_count
        == 1
    )
    assert refusal(bom, input="q", dimensions="64")[0] == 400
    lax = "base64: HONOURED\nleniency: {integers: true, bom: false}"
    ints = contract(qwen_policy(lax, profile=None), qwen_dir)
    assert send(ints, input="q", dimensions="64").plan.dimensions == 64
    with pytest.raises(ApiError):
        rewrite_request(body, ints.policy, ints.tokenizers, clock=time.monotonic)


@pytest.mark.parametrize(
    ("profile", "entry", "field", "says"),
    [
        ("LEGACY", "base64: HONOURED", "base64", "says HONOURED but encoding_profile LEGACY says IGNORED"),
        ("OPENAI", "leniency: {bom: true}", "leniency.bom", "says true but encoding_profile OPENAI says false"),
        ("OPENAI", "leniency: {integers: true}", "leniency.integers", "says true but encoding_profile OPENAI says false"),
        ("LEGACY", "leniency: {integral_floats: true}", "leniency.integral_floats", "says true but encoding_profile LEGACY says false"),
    ],
)  # fmt: skip
def test_a_field_beside_a_profile_may_not_contradict_its_bundle(
    profile: str, entry: str, field: str, says: str, qwen_dir: Path
) -> None:
    """One way to say each thing: a profile is its bundle; a field beside it that says
    otherwise is refused, as upstream_flavour against upstream.kind is."""
    with pytest.raises(PolicyError) as info:
        load_policy_text(qwen_policy(entry, profile=profile), source="p.yaml")
    assert (info.value.source, info.value.field) == ("p.yaml", f"models[0].{field}")
    assert info.value.reason == (
        f"{says}; keep encoding_profile only, or drop it and set base64, leniency.integers "
        "and leniency.bom"
    )


def test_a_field_beside_a_profile_may_repeat_its_bundle(qwen_dir: Path) -> None:
    agree = "base64: IGNORED\nleniency: {integers: true, bom: true, integral_floats: false}"
    model = contract(qwen_policy(agree, profile="LEGACY"), qwen_dir).policy.models[QWEN_MODEL]
    assert model.encoding_profile is EncodingProfile.LEGACY


def test_an_entrys_encoding_replaces_its_presets_as_a_whole(qwen_dir: Path) -> None:
    """The preset says OPENAI; an entry's own fields replace it, never mix with it."""
    legacy = "base64: IGNORED\nleniency: {integers: true, bom: true}"
    model = contract(qwen_policy(legacy, profile=None), qwen_dir).policy.models[QWEN_MODEL]
    assert model.encoding_profile is EncodingProfile.LEGACY
    with pytest.raises(PolicyError) as info:
        load_policy_text(qwen_policy("leniency: {bom: true}", profile=None), source="p.yaml")
    assert info.value.field == "models[0].encoding_profile"
    assert info.value.reason == (
        "required: LEGACY or OPENAI (or base64, leniency.integers and leniency.bom, all "
        "three); the entry's own base64 or leniency replaces its preset's encoding_profile OPENAI"
    )
    # An entry's profile replaces the preset's too, and its fields are read against it.
    assert contract(qwen_policy(), qwen_dir).policy.models[QWEN_MODEL].encoding_profile is (
        EncodingProfile.LEGACY
    )


# --------------------------------------------------------------------- Matryoshka


def matryoshka_policy(rule: str, top: str = "") -> str:
    return qwen_policy(f"matryoshka: {rule}", top)


@pytest.mark.parametrize(
    ("rule", "accepted", "refused"),
    [
        ("{allowed: [64, 128, 768], accepts_native: false}", [64, 128, 768], [1024, 32, 65]),
        ("{allowed: [64, 128]}", [64, 128, 1024], [32, 768]),
        ("{min_dimensions: 64, max_dimensions: 768}", [64, 500, 768, 1024], [63, 769, 1023]),
        (
            "{min_dimensions: 64, max_dimensions: 768, accepts_native: false}",
            [64, 768],
            [1024, 769],
        ),
    ],
)
def test_sizes_with_the_native_one_inside_or_out(
    rule: str, accepted: list[int], refused: list[int], qwen_dir: Path
) -> None:
    c = contract(matryoshka_policy(rule), qwen_dir)
    for size in accepted:
        send(c, input="q", dimensions=size)
    for size in refused:
        status, body = refusal(c, input="q", dimensions=size)
        assert status == 400 and body["error"]["param"] == "dimensions", size
        rule_text = body["error"]["message"].split(";")[0]
        assert ("1024" in rule_text) == ("accepts_native" not in rule), size


def test_a_cut_without_renormalising(qwen_dir: Path) -> None:
    c = contract(matryoshka_policy("{min_dimensions: 32, renormalise: false}"), qwen_dir)
    forward = send(c, input=["a", "b"], dimensions=100)
    plan = forward.plan
    assert plan.dimensions == 100 and not plan.renormalise
    assert ResponsePlan.from_json(plan.to_json()) == plan
    rng = np.random.default_rng(7)
    native = rng.standard_normal((2, 1024)).astype(np.float32)
    native /= np.linalg.norm(native, axis=1, keepdims=True)
    upstream = {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": v.tolist()}
            for i, v in enumerate(native)
        ],
        "model": QWEN_MODEL,
        "usage": {"prompt_tokens": 2, "total_tokens": 2},
    }
    answer = rewrite_response(plan, 200, orjson.dumps(upstream))
    assert answer is not None
    got = np.array([d["embedding"] for d in orjson.loads(answer.body)["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, native[:, :100], rtol=0, atol=1e-7)
    norms = np.linalg.norm(got, axis=1)
    assert (norms < 0.6).all()  # ~sqrt(100/1024): not scaled back


def test_renormalise_false_cannot_be_left_to_the_upstream(qwen_dir: Path) -> None:
    text = matryoshka_policy("{min_dimensions: 32, renormalise: false}").replace(
        "    encoding_profile",
        "    upstream: {kind: dynamo, native: {dimensions: true}}\n    encoding_profile",
    )
    with pytest.raises(PolicyError, match=r"native\.dimensions"):
        contract(text, qwen_dir)


def test_an_old_plan_still_reads() -> None:
    """Eight items (a plan written before renormalise existed) mean a re-normalised cut."""
    plan = ResponsePlan.from_json('["m",1,1024,"dynamo","float","base64",64,false]')
    assert plan is not None and plan.renormalise
    for bad in ('["m",1,1024,"dynamo","float","base64",64,false,0]',
                '["m",1,1024,"dynamo","float","base64",64,false,true]'):  # fmt: skip
        assert ResponsePlan.from_json(bad) is None


# --------------------------------------------------------------------- errors


FASTAPI = "errors: {shape: FASTAPI, status: {malformed: 422, invalid: 422, dimensions: 422}}"


def raw_refusal(c: Contract, body: bytes) -> tuple[int, Any]:
    with pytest.raises(ApiError) as caught:
        rewrite_request(body, c.policy, c.tokenizers, clock=time.monotonic)
    status, out = c.policy.errors.answer(caught.value)
    return status, orjson.loads(out)


def test_fastapi_dialect(qwen_dir: Path) -> None:
    c = contract(qwen_policy("matryoshka: {min_dimensions: 32}", FASTAPI), qwen_dir)
    status, body = raw_refusal(c, b'{"model": "x", "input": ')
    assert status == 422 and body["detail"][0]["type"] == "json_invalid"
    status, body = refusal(c, input=[])
    assert status == 422 and body["detail"][0]["loc"] == ["body", "input"]
    status, body = refusal(c, input="q", dimensions=8)
    assert status == 422 and body["detail"][0]["loc"] == ["body", "dimensions"]
    status, body = raw_refusal(c, orjson.dumps({"model": "nope", "input": "q"}))
    assert status == 404 and isinstance(body["detail"], str) and "nope" in body["detail"]


def test_flat_dialect_and_openai_default(qwen_dir: Path) -> None:
    flat = contract(
        qwen_policy("", "errors: {shape: FLAT, status: {unknown_model: 400}}"), qwen_dir
    )
    status, body = raw_refusal(flat, orjson.dumps({"model": "nope", "input": "q"}))
    assert status == 400 and body["code"] == "model_not_found" and "nope" in body["message"]
    plain = contract(qwen_policy(""), qwen_dir)
    status, body = raw_refusal(plain, orjson.dumps({"model": "nope", "input": "q"}))
    assert status == 404 and body["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("upstream_status", [500, 503, 400])
def test_upstream_errors_keep_their_status_in_every_dialect(
    upstream_status: int, qwen_dir: Path
) -> None:
    c = contract(qwen_policy("", FASTAPI), qwen_dir)
    plan = send(c, input="q").plan
    answer = rewrite_response(plan, upstream_status, b'{"message": "boom"}', c.policy.errors)
    assert answer is not None and answer.status == upstream_status
    assert "boom" in orjson.loads(answer.body)["detail"]


@pytest.mark.parametrize(
    ("top", "field"),
    [
        ("errors: {status: {malformed: 500}}", "errors.status.malformed"),
        ("errors: {status: {invalid: 200}}", "errors.status.invalid"),
        ("errors: {shape: XML}", "errors"),
    ],
)
def test_bad_error_dialects_are_refused(top: str, field: str, qwen_dir: Path) -> None:
    with pytest.raises(PolicyError, match=field.replace(".", r"\.")):
        contract(qwen_policy("", top), qwen_dir)


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ("prompts: {aliases: {searchquery: 'x {text}'}}", "prompts.aliases.searchquery"),
        ("prompts: {aliases: {passage: '{instruction} {text}'}}", "prompts.aliases.passage"),
        ("prompts: {default_input_type: nope}", "prompts.default_input_type"),
        ("matryoshka: {min_dimensions: 64, max_dimensions: 32}", "matryoshka.max_dimensions"),
        ("truncation: {side: MIDDLE}", "models[0]"),
    ],
)
def test_bad_fields_are_named(entry: str, field: str, qwen_dir: Path) -> None:
    with pytest.raises(PolicyError, match=field.replace(".", r"\.").replace("[", r"\[")):
        contract(qwen_policy(entry), qwen_dir)


def test_encoding_without_a_profile_needs_every_part(bert_dir: Path) -> None:
    def entry(encoding: str) -> str:
        return f"""
models:
  - name: {BERT_MODEL}
    tokenizer: {{special_tokens: {{from_tokenizer: true}}}}
    max_tokens: 40
    native_dimensions: 8
    upstream: {{kind: vllm}}
    {encoding}
"""

    both = "base64: IGNORED\n    leniency: {integers: true, bom: false}"
    model = contract(entry(both), bert_dir, BERT_MODEL).policy.models[BERT_MODEL]
    assert not model.honours_base64 and model.leniency.integers and not model.leniency.bom
    assert model.encoding_profile is None
    with pytest.raises(PolicyError, match="encoding_profile"):
        contract(entry("base64: IGNORED"), bert_dir, BERT_MODEL)
