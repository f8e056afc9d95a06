"""Model-family presets as data: each family file, loaded through the policy loader,
gives exactly the prompts and sizes its model card documents."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from extproc.core.policy import ModelPolicy, PolicyError, load_policy_text
from extproc.core.policy.presets import load_presets, presets
from extproc.core.prompts import prompt_prefix
from testing_support.qwen import REPO

PRESETS_DIR = REPO / "extproc" / "core" / "policy" / "presets"
QWEN3_TASK = "Given a web search query, retrieve relevant passages that answer the query"

# preset -> (query prefix, document prefix, extra prefixes, native dimensions), where a
# prefix is the exact text put before the input (with the default instruction filled in).
DOCUMENTED: dict[str, tuple[str, str, dict[str, str], int]] = {
    # Qwen3-Embedding: no space after "Query:".
    "qwen3-embedding-0.6b": (f"Instruct: {QWEN3_TASK}\nQuery:", "", {}, 1024),
    "qwen3-embedding-4b": (f"Instruct: {QWEN3_TASK}\nQuery:", "", {}, 2560),
    "qwen3-embedding-8b": (f"Instruct: {QWEN3_TASK}\nQuery:", "", {}, 4096),
    "e5": ("query: ", "passage: ", {}, 1024),
    "bge": ("Represent this sentence for searching relevant passages: ", "", {}, 1024),
    "nomic": (
        "search_query: ",
        "search_document: ",
        {"classification": "classification: ", "clustering": "clustering: "},
        768,
    ),
    "embeddinggemma": ("task: search result | query: ", "title: none | text: ", {}, 768),
    "all-minilm-l6-v2": ("", "", {}, 384),
}


def load_preset(name: str, qwen_dir: Path, extra: str = "") -> ModelPolicy:
    policy = load_policy_text(
        f"models:\n  - name: m\n    preset: {name}\n{extra}", tokenizer_overrides={"m": qwen_dir}
    )
    return policy.models["m"]


def test_every_shipped_preset_is_documented() -> None:
    assert sorted(presets()) == sorted([*DOCUMENTED, "plain"])


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_prompts_are_the_documented_strings(name: str, qwen_dir: Path) -> None:
    query, document, extra, native = DOCUMENTED[name]
    model = load_preset(name, qwen_dir)
    assert prompt_prefix(model.prompts, "query", None) == query
    assert prompt_prefix(model.prompts, "document", None) == document
    assert {t: prompt_prefix(model.prompts, t, None) for t in model.prompts.extra} == extra
    assert model.native_dimensions == native


def test_qwen3_templates_exactly(qwen_dir: Path) -> None:
    for size in ("0.6b", "4b", "8b"):
        model = load_preset(f"qwen3-embedding-{size}", qwen_dir)
        assert model.prompts.query == "Instruct: {instruction}\nQuery:{text}"
        assert model.prompts.document == "{text}"
        assert model.prompts.default_instruction == QWEN3_TASK
        assert model.special_tokens.append_ids == (151643,)  # <|endoftext|>: last-token pooling
        assert [d for d in (31, 32, model.native_dimensions) if model.accepts_dimensions(d)] == [
            32,
            model.native_dimensions,
        ]
        assert model.tokenizer.hf_id is None  # the override replaced it
        assert model.upstream.kind == "dynamo"


def test_qwen3_instruction_replaces_the_default(qwen_dir: Path) -> None:
    model = load_preset("qwen3-embedding-0.6b", qwen_dir)
    assert prompt_prefix(model.prompts, None, "Find code") == "Instruct: Find code\nQuery:"


def test_embeddinggemma_sizes_and_plain(qwen_dir: Path) -> None:
    gemma = load_preset("embeddinggemma", qwen_dir)
    assert gemma.matryoshka is not None and gemma.matryoshka.allowed == (128, 256, 512, 768)
    plain = load_preset("plain", qwen_dir, "    native_dimensions: 8\n    max_tokens: 16\n")
    assert (plain.prompts.query, plain.prompts.document) == ("{text}", "{text}")


def test_family_files_are_package_data() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["extproc"]
    for family in PRESETS_DIR.glob("*.yaml"):
        relative = family.relative_to(REPO / "extproc").as_posix()
        assert any(fnmatch.fnmatch(relative, g) for g in globs), relative


def test_adding_a_family_is_adding_a_file(tmp_path: Path) -> None:
    for family in PRESETS_DIR.glob("*.yaml"):
        (tmp_path / family.name).write_text(family.read_text())
    (tmp_path / "gte.yaml").write_text(
        "# gte-base-en-v1.5: no prompts\n"
        "common: {max_tokens: 8192, encoding_profile: OPENAI, upstream: {kind: vllm}}\n"
        "presets:\n  gte-base: {native_dimensions: 768}\n  gte-large: {native_dimensions: 1024}\n"
    )
    found = load_presets(tmp_path)
    assert sorted(found) == sorted([*presets(), "gte-base", "gte-large"])
    assert (found["gte-large"].native_dimensions, found["gte-large"].max_tokens) == (1024, 8192)


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("presets: [", "<yaml>", ""),
        ("models: []", "<root>", "`presets`"),
        ("presets: {}", "presets", "non-empty"),
        ("presets: {x: 3}", "presets.x", "mapping"),
        ("presets: {x: {max_tokens: lots}}", "presets.x", "max_tokens"),
        ("presets: {x: {colour: red}}", "presets.x", "colour"),
        ("presets: {x: {name: m}}", "presets.x.name", "policy entry"),
        ("common: {prompts: {query: 3}}\npresets: {x: {}}", "common", "query"),
    ],
)
def test_bad_family_files_name_file_field_and_reason(
    tmp_path: Path, text: str, field: str, reason: str
) -> None:
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(PolicyError) as info:
        load_presets(tmp_path)
    assert (info.value.source, info.value.field) == ("bad.yaml", field)
    assert reason in info.value.reason


def test_a_preset_name_in_two_files_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("presets: {x: {max_tokens: 8}}\n")
    (tmp_path / "b.yaml").write_text("presets: {x: {max_tokens: 9}}\n")
    with pytest.raises(PolicyError, match=r"b.yaml: presets.x: already defined in a.yaml"):
        load_presets(tmp_path)


def test_presets_command_lists_every_preset() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "extproc", "presets"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == sorted(presets())
