"""What a reload changed (extproc/core/policy/changes.py): per model, per limit, models
added and removed, in the policy file's terms; nothing when nothing changed."""

from __future__ import annotations

from pathlib import Path

from extproc.core.policy import GatewayPolicy, load_policy_text
from extproc.core.policy.changes import SHOWN_PROMPT_CHARS, policy_changes
from testing_support.qwen import QWEN_MODEL

LEGACY = f"""
models:
  - name: {QWEN_MODEL}
    preset: qwen3-embedding-0.6b
    max_tokens: 1024
    encoding_profile: LEGACY
    upstream_flavour: DYNAMO
"""


def load(text: str, qwen_dir: Path) -> GatewayPolicy:
    return load_policy_text(text, tokenizer_overrides={QWEN_MODEL: qwen_dir})


def test_the_half_written_file_of_the_attack_reads_as_what_it_changed(qwen_dir: Path) -> None:
    """The file cut after its `preset` line: the preset's defaults replace the file's."""
    cut = LEGACY.split("    max_tokens", maxsplit=1)[0]
    changes = policy_changes(load(LEGACY, qwen_dir), load(cut, qwen_dir))
    assert changes.lines() == (
        f"{QWEN_MODEL}: encoding_profile LEGACY -> OPENAI, max_tokens 1024 -> 32768",
    )


def test_nothing_changed_in_effect_says_so(qwen_dir: Path) -> None:
    # Spelled otherwise (the older upstream_flavour, a comment), the same settings.
    same = LEGACY.replace("upstream_flavour: DYNAMO", "upstream: {kind: dynamo}  # moved")
    changes = policy_changes(load(LEGACY, qwen_dir), load(same, qwen_dir))
    assert changes.empty and changes.lines() == ()


def test_every_effective_setting_is_named(qwen_dir: Path) -> None:
    other = f"""
limits: {{max_inflight_bytes: 16777216, admission_wait_ms: 100}}
models:
  - name: {QWEN_MODEL}
    preset: qwen3-embedding-0.6b
    upstream_model: served-qwen
    max_tokens: 512
    encoding_profile: LEGACY
    native_dimensions: 768
    matryoshka: {{allowed: [128, 256]}}
    upstream: {{kind: vllm, native: {{dimensions: true, truncate_prompt_tokens: false}}}}
    check_responses: true
    tokenizer: {{special_tokens: {{append_ids: [151643, 151643]}}}}
    prompts:
      query: "Q: {{instruction}} | {{text}}"
      document: "passage: {{text}}"
      default_instruction: {"x" * (SHOWN_PROMPT_CHARS + 1)}
      extra: {{classification: "classify: {{text}}"}}
  - name: added-model
    preset: qwen3-embedding-0.6b
"""
    changes = policy_changes(load(LEGACY, qwen_dir), load(other, qwen_dir))
    (model_line, added, limits) = changes.lines()
    assert model_line == (
        f"{QWEN_MODEL}: upstream_model {QWEN_MODEL} -> served-qwen, "
        "max_tokens 1024 -> 512, native_dimensions 1024 -> 768, "
        "matryoshka min_dimensions 32 -> allowed 128,256, upstream.kind dynamo -> vllm, "
        "upstream.native.dimensions false -> true, "
        "upstream.native.truncate_prompt_tokens true -> false, check_responses false -> true, "
        "tokenizer.special_tokens prepend [] append [151643] -> prepend [] append [151643, 151643], "
        "prompts.query 'Instruct: {instruction}\\nQuery:{text}' -> 'Q: {instruction} | {text}', "
        "prompts.document '{text}' -> 'passage: {text}', "
        f"prompts.default_instruction 74 characters -> {SHOWN_PROMPT_CHARS + 1} characters, "
        "prompts.extra.classification added ('classify: {text}')"
    )
    assert added == "models added: added-model"
    assert limits == (
        "limits: max_inflight_bytes 50331648 -> 16777216, admission_wait_ms 250 -> 100"
    )
    back = policy_changes(load(other, qwen_dir), load(LEGACY, qwen_dir))
    assert back.removed == ("added-model",)
    assert "prompts.extra.classification removed" in back.lines()[0]


def test_a_long_prompt_is_never_shown_whole(qwen_dir: Path) -> None:
    secretish = "an instruction long enough to be summarised rather than shown " * 3
    text = LEGACY + f"    prompts: {{default_instruction: {secretish!r}}}\n"
    (line,) = policy_changes(load(LEGACY, qwen_dir), load(text, qwen_dir)).lines()
    assert "summarised" not in line
    assert f"-> {len(secretish):,} characters" in line, line


def test_a_tokenizer_source_change_is_named(qwen_dir: Path, tmp_path: Path) -> None:
    text = LEGACY + f"    tokenizer: {{path: {tmp_path}}}\n"
    (tmp_path / "tokenizer.json").write_text("{}")
    old = load_policy_text(LEGACY)  # the preset's hf_id
    new = load_policy_text(text)
    (line,) = policy_changes(old, new).lines()
    assert line == f"{QWEN_MODEL}: tokenizer hf:{QWEN_MODEL} -> {tmp_path}"
