"""`extproc learn` imitates every legacy contract a policy can say: for a stand-in
legacy server with each behaviour alone, and with two combined, learn ends READY
(exit 0), and the real gateway (Envoy + ext_proc) running the written policy in
front of the fake upstream answers a battery of requests as the stand-in does -
compared here, independently of learn's own verification, by what a client sees:
the exact status, the error body's shape, the vectors (cosine and norm), the
encoding and ``usage.prompt_tokens``.

The stand-ins are tests/fake_legacy.py's FakeLegacy with one or two parameters off
the seed's; the upstreams are testing_support/fake_upstream.py's Dynamo and vLLM.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from extproc.core.policy.model import CutSide, InstructionUse, ModelPolicy
from extproc.service.policy_file import load_policy_file
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import GatewaySpec
from tests.fake_legacy import FakeLegacy
from tests.harness import Gateways
from tests.learning import assert_client_sees_the_same, battery, learn

SIZES = (0, 1, 32, 63, 64, 65, 128, 256, 300, 512, 767, 768, 769, 1023, 1024, 1025)
E5 = {"query_template": "query: {text}", "document_template": "passage: {text}"}


@dataclass(frozen=True)
class Case:
    """A stand-in (FakeLegacy's parameters) and what its learned policy must say."""

    legacy: dict[str, Any]
    expect: dict[str, Any] = field(default_factory=dict)  # policy_facts() that must hold
    upstream: str = "dynamo"


CASES = {
    # one behaviour alone
    "instruction ignored": Case(
        {"instruction": "ignored"}, {"instruction": InstructionUse.IGNORED}
    ),
    "instruction as the prompt": Case(
        {"instruction": "prompt"}, {"instruction": InstructionUse.PROMPT}
    ),
    "instruction refused": Case(
        {"instruction": "refused"},
        {"instruction": InstructionUse.REFUSED, "status.instruction": 422},
    ),
    "untyped inputs prompted": Case(
        {**E5, "untyped": "document"}, {"default_input_type": "document"}
    ),
    "an alias of its own": Case(
        {
            **E5,
            "query_types": frozenset({"query", "search_query"}),
            "alias_templates": {"search_query": "search_query: {text}"},
        },
        {"aliases": {"search_query": "search_query: {text}"}},
    ),
    "cut from the left": Case({"cut_side": "left", "max_tokens": 300}, {"side": CutSide.LEFT}),
    "end token dropped": Case(
        {"keep_end": False, "max_tokens": 200}, {"keep_special_tokens": False}
    ),
    "long inputs refused": Case(
        {"refuse_long": True, "max_tokens": 700}, {"refuse": True, "max_tokens": 700}
    ),
    "a set without the native size": Case(
        {
            "min_dimensions": None,
            "allowed_dimensions": (64, 128, 256, 512, 768),
            "accepts_native": False,
        },
        {"allowed": (64, 128, 256, 512, 768), "accepts_native": False},
    ),
    "a range below the native size": Case(
        {"min_dimensions": 64, "max_dimensions": 768}, {"min": 64, "max": 768}
    ),
    "cuts not re-normalised": Case({"renormalise": False}, {"renormalise": False}),
    "base64 honoured and lax integers": Case(
        {"honour_encoding": True, "lax": True}, {"base64": True, "integers": True, "bom": True}
    ),
    "a byte order mark alone": Case(
        {"bom": True}, {"base64": False, "integers": False, "bom": True}
    ),
    "OpenAI error bodies with 400s": Case(
        {
            "error_shape": "openai",
            "error_status": {k: 400 for k in ("malformed", "invalid", "dimensions")},
        },
        {"body": ["error"], "status.malformed": 400},
    ),
    "flat error bodies": Case({"error_shape": "flat"}, {"body": ["message", "type", "code"]}),
    "a handler's own error bodies": Case(
        {"error_shape": "detail_param"}, {"body": ["detail", "param"]}
    ),
    "a bare error text": Case({"error_shape": "error_string"}, {"body": ["error"]}),
    "FastAPI's split: its handler raises what the model does not validate": Case(
        {"validated": frozenset({"malformed"})}, {"body": ["detail"]}
    ),
    "an instruction with a document ignored": Case(
        {"document_instruction": "ignored"}, {"document_instruction": InstructionUse.IGNORED}
    ),
    "an instruction with a document wins": Case(
        {"document_instruction": "wins"}, {"document_instruction": InstructionUse.TASK}
    ),
    "any model name": Case({"any_model": True}, {"any_name": True, "unnamed": True}),
    "the role in prompt_name": Case({"role_field": "prompt_name"}, {"role_field": "prompt_name"}),
    "the role in task, Jina's values": Case(
        {
            "role_field": "task",
            "query_types": frozenset({"retrieval.query"}),
            "document_types": frozenset({"retrieval.passage"}),
        },
        {"role_field": "task"},
    ),
    "batches of at most 16": Case({"max_batch": 16}, {"max_inputs": 16}),
    "line breaks folded": Case(
        {"preprocess": ("fold_newlines",)}, {"preprocess": {"fold_newlines"}}
    ),
    "white space collapsed and stripped": Case(
        {"preprocess": ("collapse", "strip")}, {"preprocess": {"collapse_whitespace", "strip"}}
    ),
    # The tokenizer puts texts in NFC itself: nothing to learn, and still the same.
    "texts put in NFC": Case({"preprocess": ("nfc",)}, {"unicode_form": None}),
    "texts put in NFKC": Case({"preprocess": ("nfkc",)}, {"unicode_form": "NFKC"}),
    # two combined
    "instruction ignored, base64 and lax": Case(
        {**E5, "instruction": "ignored", "honour_encoding": True, "lax": True},
        {"instruction": InstructionUse.IGNORED, "base64": True, "integers": True},
        upstream="vllm",
    ),
    "a set without native, not re-normalised": Case(
        {
            "min_dimensions": None,
            "allowed_dimensions": (64, 256, 768),
            "accepts_native": False,
            "renormalise": False,
        },
        {"allowed": (64, 256, 768), "renormalise": False},
    ),
    "cut from the left, untyped prompted": Case(
        {**E5, "cut_side": "left", "max_tokens": 300, "untyped": "document"},
        {"side": CutSide.LEFT, "default_input_type": "document"},
    ),
    "an alias of its own, instruction as the prompt": Case(
        {
            **E5,
            "query_types": frozenset({"query", "search_query"}),
            "alias_templates": {"search_query": "search_query: {text}"},
            "instruction": "prompt",
        },
        {"aliases": {"search_query": "search_query: {text}"}, "instruction": InstructionUse.PROMPT},
        upstream="vllm",
    ),
    "long inputs refused, flat errors": Case(
        {
            "refuse_long": True,
            "max_tokens": 500,
            "error_shape": "flat",
            "error_status": {"too_long": 413},
        },
        {"refuse": True, "body": ["message", "type", "code"], "status.too_long": 413},
    ),
    "a set read as a lax Literal, base64": Case(
        {
            "lax": True,
            "min_dimensions": None,
            "allowed_dimensions": (64, 256),
            "honour_encoding": True,
        },
        {"integers": False, "integral_floats": True, "bom": True, "allowed": (64, 256)},
    ),
    "errors of its own, prompt_name, 16 inputs, line breaks folded": Case(
        {
            "error_shape": "detail_param",
            "role_field": "prompt_name",
            "max_batch": 16,
            "preprocess": ("fold_newlines",),
            "any_model": True,
        },
        {"role_field": "prompt_name", "max_inputs": 16, "any_name": True},
        upstream="vllm",
    ),
    "E5-style honouring base64": Case(
        {**E5, "honour_encoding": True, "min_dimensions": None, "max_tokens": 512},
        {"base64": True, "integers": False},
        upstream="vllm",
    ),
}


def policy_facts(model: ModelPolicy, errors: Any, max_inputs: int) -> dict[str, Any]:
    m = model.matryoshka
    return {
        "instruction": model.prompts.instruction,
        "default_input_type": model.prompts.default_input_type,
        "aliases": dict(model.prompts.aliases),
        "side": model.truncation.side,
        "keep_special_tokens": model.truncation.keep_special_tokens,
        "refuse": model.truncation.refuse,
        "max_tokens": model.max_tokens,
        "allowed": m.allowed if m else None,
        "accepts_native": m.accepts_native if m else True,
        "min": m.min_dimensions if m else None,
        "max": m.max_dimensions if m else None,
        "renormalise": m.renormalise if m else True,
        "base64": model.honours_base64,
        "integers": model.leniency.integers,
        "bom": model.leniency.bom,
        "integral_floats": model.leniency.integral_floats,
        "max_inputs": max_inputs,
        # the keys of the bodies the gateway writes for errors of no kind of its own
        "body": list(errors.template(None)),
        "document_instruction": model.prompts.document_instruction,
        "role_field": model.prompts.role_field,
        "any_name": model.any_name,
        "unnamed": model.unnamed,
        "preprocess": {
            k
            for k in ("fold_newlines", "collapse_whitespace", "strip")
            if getattr(model.preprocess, k)
        },
        "unicode_form": model.preprocess.unicode_form.name
        if model.preprocess.unicode_form
        else None,
        **{f"status.{k.value}": v for k, v in errors.statuses.items()},
    }


@pytest.fixture(scope="module")
def upstreams(qwen_dir: Path) -> Iterator[dict[str, FakeUpstream]]:
    with (
        FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir) as dynamo,
        FakeUpstream(flavour="vllm", tokenizer_dir=qwen_dir) as vllm,
    ):
        yield {"dynamo": dynamo, "vllm": vllm}


@pytest.mark.parametrize("name", list(CASES))
def test_learned_and_imitated(
    name: str,
    qwen_dir: Path,
    upstreams: dict[str, FakeUpstream],
    gateways: Gateways,
    tmp_path: Path,
) -> None:
    case = CASES[name]
    upstream = upstreams[case.upstream]
    with FakeLegacy(tokenizer_dir=qwen_dir, **case.legacy) as legacy:
        code, policy, report, _ = learn(legacy, upstream, tmp_path / "learn")
        assert code == 0, report["problems"]
        assert report["result"]["label"] == "READY"
        assert policy is not None
        written = load_policy_file(tmp_path / "learn" / "policy.yaml")
        facts = policy_facts(policy, written.errors, written.limits.max_inputs)
        for key, value in case.expect.items():
            assert facts[key] == value, (
                key,
                facts[key],
                (tmp_path / "learn" / "policy.yaml").read_text(),
            )
        spec = GatewaySpec(
            upstream.url,
            policy=tmp_path / "learn" / "policy.yaml",
            tokenizers=f"{legacy.served_model}={qwen_dir}",
        )
        with gateways.own(spec) as gateway:
            assert_client_sees_the_same(
                legacy.url, gateway.url, battery(legacy.served_model, SIZES)
            )


# Stand-ins whose behaviour no policy says: learn names what differs and is never READY.
NEVER_READY = {
    "another model": ({"other_model": True}, "model"),
    "an unknown query prompt": ({"query_template": "Represent this question: {text}"}, "prompts"),
    "texts lower-cased": ({"preprocess": ("lower",)}, "preprocess"),
}


@pytest.mark.parametrize("name", list(NEVER_READY))
def test_never_ready(
    name: str, qwen_dir: Path, upstreams: dict[str, FakeUpstream], tmp_path: Path
) -> None:
    legacy_args, names = NEVER_READY[name]
    with FakeLegacy(tokenizer_dir=qwen_dir, **legacy_args) as legacy:
        code, _, report, _ = learn(legacy, upstreams["dynamo"], tmp_path / "learn")
    assert code != 0 and report["result"]["label"] != "READY", report["problems"]
    assert any(problem.startswith(names) for problem in report["problems"]), report["problems"]
