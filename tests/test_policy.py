"""The policy file: presets, overrides, and errors that name file, field and reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from extproc.core.policy import (
    EncodingProfile,
    GatewayPolicy,
    PolicyError,
    UpstreamPolicy,
    load_policy_text,
)
from extproc.core.policy.presets import presets
from extproc.core.upstreams import Capabilities
from extproc.service.contract_loading import load_contract
from extproc.service.tokenizer_files import check_tokenizer_dirs, load_tokenizer
from extproc.service.tokenizer_overrides import TOKENIZER_OVERRIDES_ENV, tokenizer_overrides
from testing_support.qwen import QWEN_EOS, QWEN_MODEL, REPO, SHIPPED_QWEN_POLICY


def load(text: str, qwen_dir: Path) -> GatewayPolicy:
    return load_policy_text(
        text, source="p.yaml", tokenizer_overrides={"m": qwen_dir, QWEN_MODEL: qwen_dir}
    )


def test_shipped_policy_is_the_seed_server(qwen_dir: Path) -> None:
    policy = load_policy_text(
        SHIPPED_QWEN_POLICY.read_text(), tokenizer_overrides={QWEN_MODEL: qwen_dir}
    )
    model = policy.models[QWEN_MODEL]
    assert model.max_tokens == 1024
    assert model.encoding_profile is EncodingProfile.LEGACY
    assert model.upstream.kind == "dynamo"
    assert model.native_dimensions == 1024
    assert model.special_tokens.append_ids == (QWEN_EOS,)
    assert model.prompts.query == "Instruct: {instruction}\nQuery:{text}"
    assert [d for d in (31, 32, 256, 1024, 1025) if model.accepts_dimensions(d)] == [32, 256, 1024]


@pytest.mark.parametrize("preset", sorted(presets()))
def test_every_preset_loads(preset: str, qwen_dir: Path) -> None:
    extra = "    native_dimensions: 8\n    max_tokens: 16\n" if preset == "plain" else ""
    policy = load_policy_text(
        f"models:\n  - name: m\n    preset: {preset}\n{extra}",
        tokenizer_overrides={"m": qwen_dir},
    )
    model = policy.models["m"]
    assert model.prompts.query.endswith("{text}")
    assert model.max_tokens >= 16


def test_fields_override_the_preset_and_lists_replace(qwen_dir: Path) -> None:
    policy = load_policy_text(
        "models:\n"
        "  - name: m\n    preset: embeddinggemma\n"
        "    matryoshka: {allowed: [256]}\n"
        "    prompts: {query: 'q: {text}'}\n",
        tokenizer_overrides={"m": qwen_dir},
    )
    model = policy.models["m"]
    assert model.matryoshka is not None and model.matryoshka.allowed == (256,)
    assert model.prompts.query == "q: {text}"
    assert model.prompts.document == "title: none | text: {text}"  # kept from the preset


BAD_POLICIES = [
    ("not-yaml", "models: [", "<yaml>", ""),
    ("no-models", "limits: {}", "models", "non-empty"),
    (
        "unknown-key",
        "models:\n  - name: m\n    preset: plain\n    colour: red\n",
        "models[0]",
        "colour",
    ),
    (
        "unknown-preset",
        "models:\n  - name: m\n    preset: gpt\n",
        "models[0].preset",
        "unknown preset",
    ),
    ("no-name", "models:\n  - preset: qwen3-embedding-0.6b\n", "models[0].name", "required"),
    (
        "no-dims",
        "models:\n  - name: m\n    preset: plain\n    max_tokens: 8\n",
        "models[0].native_dimensions",
        "required",
    ),
    (
        "bad-template",
        "models:\n  - name: m\n    preset: e5\n    prompts: {query: 'no text here'}\n",
        "models[0].prompts.query",
        "{text}",
    ),
    (
        "suffix-template",
        "models:\n  - name: m\n    preset: e5\n    prompts: {query: '{text} END'}\n",
        "models[0].prompts.query",
        "end with",
    ),
    (
        "matryoshka-range",
        "models:\n  - name: m\n    preset: e5\n    matryoshka: {min_dimensions: 4000}\n",
        "models[0].matryoshka.min_dimensions",
        "between",
    ),
    (
        "bad-enum",
        "models:\n  - name: m\n    preset: e5\n    encoding_profile: FAST\n",
        "models[0]",
        "FAST",
    ),
    (
        "wrong-type",
        "models:\n  - name: m\n    preset: e5\n    max_tokens: lots\n",
        "models[0]",
        "max_tokens",
    ),
    (
        "dup",
        "models:\n  - {name: m, preset: e5}\n  - {name: m, preset: e5}\n",
        "models[1].name",
        "duplicate",
    ),
    (
        "limits",
        "limits: {max_inputs: 100000}\nmodels:\n  - {name: m, preset: e5}\n",
        "limits.max_inputs",
        "between",
    ),
    (
        "no-upstream",
        "models:\n  - {name: m, native_dimensions: 8, max_tokens: 8, encoding_profile: OPENAI,"
        " tokenizer: {hf_id: x}}\n",
        "models[0].upstream.kind",
        "required: one of dynamo, vllm",
    ),
    (
        "unknown-upstream",
        "models:\n  - {name: m, preset: e5, upstream: {kind: tei}}\n",
        "models[0].upstream.kind",
        "unknown upstream kind 'tei' (known: dynamo, vllm)",
    ),
    (
        "flavour-contradicts-kind",
        "models:\n  - {name: m, preset: e5, upstream_flavour: DYNAMO, upstream: {kind: vllm}}\n",
        "models[0].upstream_flavour",
        "keep upstream.kind only",
    ),
    (
        "native-dimensions-without-matryoshka",
        "models:\n  - {name: m, preset: e5, upstream: {kind: vllm, native: {dimensions: true}}}\n",
        "models[0].upstream.native.dimensions",
        "no `matryoshka` section",
    ),
    (
        "unknown-capability",
        "models:\n  - {name: m, preset: e5, upstream: {kind: vllm, native: {base64: true}}}\n",
        "models[0]",
        "base64",
    ),
]


@pytest.mark.parametrize(
    ("text", "field", "reason"), [b[1:] for b in BAD_POLICIES], ids=[b[0] for b in BAD_POLICIES]
)
def test_bad_policies_name_field_and_reason(
    text: str, field: str, reason: str, qwen_dir: Path
) -> None:
    with pytest.raises(PolicyError) as info:
        load(text, qwen_dir)
    assert info.value.source == "p.yaml"
    assert info.value.field == field
    assert reason in info.value.reason


UPSTREAMS = [
    pytest.param(
        "", UpstreamPolicy("dynamo", Capabilities(truncate_prompt_tokens=True)), id="preset"
    ),
    pytest.param(
        "upstream_flavour: VLLM",
        UpstreamPolicy("vllm", Capabilities(truncate_prompt_tokens=True)),
        id="older-spelling-over-preset",
    ),
    pytest.param(
        "upstream: {kind: vllm, native: {dimensions: true}}",
        UpstreamPolicy("vllm", Capabilities(dimensions=True, truncate_prompt_tokens=True)),
        id="vllm-matryoshka",
    ),
    pytest.param(
        "upstream: {native: {dimensions: true}}",
        UpstreamPolicy("dynamo", Capabilities(dimensions=True, truncate_prompt_tokens=True)),
        id="native-over-the-presets-kind",
    ),
    pytest.param(
        "upstream: {kind: dynamo, native: {truncate_prompt_tokens: false}}",
        UpstreamPolicy("dynamo", Capabilities()),
        id="declared-off",
    ),
    pytest.param(
        "upstream_flavour: DYNAMO\n    upstream: {kind: dynamo}",
        UpstreamPolicy("dynamo", Capabilities(truncate_prompt_tokens=True)),
        id="both-spellings-agree",
    ),
]


@pytest.mark.parametrize(("lines", "want"), UPSTREAMS)
def test_upstream_kind_and_native_capabilities(
    lines: str, want: UpstreamPolicy, qwen_dir: Path
) -> None:
    text = f"models:\n  - name: m\n    preset: nomic\n    {lines}\n"
    model = load(text, qwen_dir).models["m"]
    assert model.upstream == want


MISSING_TOKENIZERS = (
    "models:\n"
    "  - {name: a, preset: e5}\n"
    "  - {name: m, preset: e5, tokenizer: {path: /nonexistent}}\n"
    "rerankers:\n"
    "  - {name: r, dialect: TEI, tokenizer: {path: /nowhere}}\n"
)


def test_a_tokenizer_directory_without_tokenizer_json_is_reported_where_tokenizers_load(
    qwen_dir: Path,
) -> None:
    """The loader only reads text; loading the contract looks at the directories first,
    and names the field of the first one without a tokenizer.json."""
    policy = load_policy_text(MISSING_TOKENIZERS, source="p.yaml", tokenizer_overrides={})
    with pytest.raises(PolicyError) as info:
        load_contract(policy)
    assert (info.value.source, info.value.field) == ("p.yaml", "models[1].tokenizer.path")
    assert info.value.reason == "/nonexistent has no tokenizer.json"
    # An override's directory is the one looked at, under the entry's own field.
    overridden = load_policy_text(
        MISSING_TOKENIZERS, source="p.yaml", tokenizer_overrides={"m": qwen_dir}
    )
    with pytest.raises(PolicyError) as info:
        check_tokenizer_dirs(overridden)
    assert (info.value.field, info.value.reason) == (
        "rerankers[0].tokenizer.path",
        "/nowhere has no tokenizer.json",
    )


def test_check_config_without_tokenizers_still_checks_their_directories(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(MISSING_TOKENIZERS)
    result = run_cli("check-config", str(policy), "--no-tokenizers")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: {policy}: models[1].tokenizer.path: /nonexistent has no tokenizer.json"
    )


def test_specials_from_a_bert_style_post_processor(tmp_path: Path, qwen_dir: Path) -> None:
    # Derive [CLS]/[SEP]-style specials from a tokenizer.json post-processor.
    import tokenizers
    from tokenizers.processors import TemplateProcessing

    tok = tokenizers.Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))
    tok.post_processor = TemplateProcessing(
        single="<|im_start|> $A <|im_end|>",
        special_tokens=[("<|im_start|>", 151644), ("<|im_end|>", 151645)],
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    policy = load_policy_text(
        f"models:\n  - name: m\n    preset: plain\n    native_dimensions: 8\n    max_tokens: 16\n"
        f"    tokenizer: {{path: '{tmp_path}', special_tokens: {{from_tokenizer: true}}}}\n"
    )
    model = policy.models["m"]
    loaded = load_tokenizer(model.tokenizer, model.special_tokens)
    assert (loaded.prepend_ids, loaded.append_ids) == ((151644,), (151645,))


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "extproc", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
        env=None if env is None else {**os.environ, **env},
    )


def test_check_config_cli(tmp_path: Path, qwen_dir: Path) -> None:
    ok = run_cli(
        "check-config", str(SHIPPED_QWEN_POLICY), "--tokenizer", f"{QWEN_MODEL}={qwen_dir}"
    )
    assert ok.returncode == 0, ok.stderr
    assert "1 model(s)" in ok.stdout and "32 to 1024" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - name: m\n    preset: e5\n    max_tokens: 1\n")
    result = run_cli("check-config", str(bad), "--no-tokenizers")
    assert result.returncode == 1
    assert f"{bad}: models[0].max_tokens:" in result.stderr
    assert "Traceback" not in result.stderr


def test_tokenizer_overrides_come_from_the_environment_and_a_flag_wins(tmp_path: Path) -> None:
    environ = {TOKENIZER_OVERRIDES_ENV: f"a={tmp_path}/env-a, b={tmp_path}/env-b"}
    got = tokenizer_overrides([f"a={tmp_path}/flag-a"], environ)
    assert got == {"a": tmp_path / "flag-a", "b": tmp_path / "env-b"}
    assert tokenizer_overrides([], {}) == {}
    with pytest.raises(ValueError, match="'a' is not NAME=DIRECTORY"):
        tokenizer_overrides(["a"], {})
    with pytest.raises(PolicyError) as info:
        tokenizer_overrides([], {TOKENIZER_OVERRIDES_ENV: "b"})
    assert (info.value.source, info.value.field) == (TOKENIZER_OVERRIDES_ENV, "<env>")
    assert info.value.reason == "tokenizer override 'b' is not NAME=DIRECTORY"


def test_check_config_reads_tokenizer_overrides_from_the_environment(
    tmp_path: Path, qwen_dir: Path
) -> None:
    """The loader reads no environment: the command does, and hands it the overrides."""
    policy = tmp_path / "p.yaml"
    policy.write_text("models:\n  - name: m\n    preset: qwen3-embedding-0.6b\n")
    ok = run_cli("check-config", str(policy), env={TOKENIZER_OVERRIDES_ENV: f"m={qwen_dir}"})
    assert ok.returncode == 0, ok.stderr
    assert f"tokenizer {qwen_dir}" in ok.stdout
    bad = run_cli("check-config", str(policy), env={TOKENIZER_OVERRIDES_ENV: "m"})
    assert bad.returncode == 1
    assert bad.stderr.strip() == (
        f"error: {TOKENIZER_OVERRIDES_ENV}: <env>: tokenizer override 'm' is not NAME=DIRECTORY"
    )


def test_check_config_warns_of_the_older_upstream_spelling(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "models:\n"
        "  - {name: a, preset: e5, upstream_flavour: VLLM}\n"
        "  - {name: b, preset: e5, upstream_flavour: DYNAMO, upstream: {kind: dynamo}}\n"
    )
    result = run_cli("check-config", str(policy), "--no-tokenizers")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"warning: {policy}: models[0].upstream_flavour: the older spelling of "
        "upstream.kind; write `upstream: {kind: vllm}` instead",
        f"warning: {policy}: models[1].upstream_flavour: the older spelling of "
        "upstream.kind; drop it: upstream.kind says 'dynamo' already",
    ]


@pytest.mark.parametrize("path", sorted((REPO / "extproc" / "policies").glob("*.yaml")))
def test_shipped_policies_use_no_older_spelling(path: Path) -> None:
    assert load_policy_text(path.read_text(), source=path.name).older_spellings == ()
