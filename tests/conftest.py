"""Shared fixtures: the real Qwen3 tokenizer, the shipped policy, the session's fake
upstreams, and (for the integration tier) the session's gateways, real Envoy +
ext_proc started by `extproc run` (tests/harness.py: :class:`GatewaySpec`,
:class:`Gateways`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc.core.contract import Contract, load_contract
from extproc.core.policy import GatewayPolicy, load_policy_file
from tests.fake_upstream import FakeUpstream
from tests.harness import (
    QWEN_EOS,
    QWEN_MODEL,
    REPO,
    SHIPPED_QWEN_POLICY,
    Gateways,
    qwen_tokenizer_dir,
)
from tests.legacy_stand_in import LegacyStandIn

# Where the tests have long imported them from.
__all__ = ["QWEN_EOS", "QWEN_MODEL", "REPO", "SHIPPED_QWEN_POLICY", "qwen_tokenizer_dir"]


@pytest.fixture(scope="session")
def qwen_dir() -> Path:
    return qwen_tokenizer_dir()


@pytest.fixture(scope="session")
def qwen_policy(qwen_dir: Path) -> GatewayPolicy:
    return load_policy_file(SHIPPED_QWEN_POLICY, tokenizer_overrides={QWEN_MODEL: qwen_dir})


@pytest.fixture(scope="session")
def qwen_contract(qwen_policy: GatewayPolicy) -> Contract:
    return load_contract(qwen_policy)


@pytest.fixture(scope="session")
def fake_dynamo(qwen_dir: Path) -> Iterator[FakeUpstream]:
    """The fake Dynamo 1.6.1 frontend of the whole session: the upstream of the
    shared gateways (``gateways.shared``)."""
    with FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir) as fake:
        yield fake


@pytest.fixture(scope="session")
def fake_vllm(qwen_dir: Path) -> Iterator[FakeUpstream]:
    """The fake plain vLLM 0.32 of the whole session."""
    with FakeUpstream(flavour="vllm", tokenizer_dir=qwen_dir) as fake:
        yield fake


@pytest.fixture(scope="session")
def legacy_stand_in() -> Iterator[LegacyStandIn]:
    """The session's stand-in for the legacy server of a split migration (``--legacy``)."""
    with LegacyStandIn() as stand_in:
        yield stand_in


@pytest.fixture(scope="module")
def upstream(fake_dynamo: FakeUpstream) -> FakeUpstream:
    """The session's fake Dynamo, as a module finds it: nothing received, no fault (a
    module that needs another upstream defines its own ``upstream`` fixture, which
    takes precedence)."""
    fake_dynamo.reset()
    return fake_dynamo


@pytest.fixture(scope="session")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateways]:
    """Gateways started on demand: ``shared(spec)`` for the session, ``own(spec)``
    for one test or module (tests/harness.py)."""
    pool = Gateways(tmp_path_factory.mktemp("gateways"))
    yield pool
    pool.stop_all()
