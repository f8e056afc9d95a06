"""Fixtures of the end-to-end tier: real vLLM and real Dynamo on loopback, each
with the gateway (`extproc run`: real Envoy + ext_proc) in front. Everything is
marked `e2e`; `scripts/setup-real-upstream.sh` prepares the environments."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import Gateway, start_gateway
from tests.real_upstream import RealEnv, Stack, real_env, start_dynamo, start_vllm

REPO = Path(__file__).resolve().parents[2]
PLAIN_POLICY = REPO / "extproc" / "policies" / "all-minilm-l6-v2.yaml"
MATRYOSHKA_POLICY = REPO / "extproc" / "policies" / "all-minilm-l6-v2-matryoshka.yaml"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.path):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def env() -> RealEnv:
    return real_env()


@pytest.fixture(scope="session")
def e2e_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def vllm(env: RealEnv, e2e_dir: Path) -> Iterator[Stack]:
    stack = start_vllm(env, e2e_dir / "vllm")
    print(f"\n[e2e] vLLM ready in {stack.started_s:.0f} s")
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def vllm_matryoshka(env: RealEnv, e2e_dir: Path) -> Iterator[Stack]:
    stack = start_vllm(env, e2e_dir / "vllm-mrl", hf_overrides={"is_matryoshka": True})
    print(f"\n[e2e] vLLM (is_matryoshka) ready in {stack.started_s:.0f} s")
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def dynamo(env: RealEnv, e2e_dir: Path) -> Iterator[Stack]:
    """The tier's one Dynamo, its worker started Matryoshka as compose starts it: it
    serves the native path (the worker cuts `dimensions`) and, behind an emulating
    policy, the emulated one (the gateway strips `dimensions`, so the worker's flag
    changes nothing there). One stack for both keeps the tier at three engines."""
    stack = start_dynamo(env, e2e_dir / "dynamo", hf_overrides={"is_matryoshka": True})
    print(f"\n[e2e] Dynamo (is_matryoshka) ready in {stack.started_s:.0f} s")
    yield stack
    stack.stop()


@pytest.fixture(scope="session", params=["vllm", "dynamo"])
def upstream(request: pytest.FixtureRequest) -> Stack:
    stack: Stack = request.getfixturevalue(str(request.param))
    return stack


def _gateway(stack: Stack, policy: Path, env: RealEnv, folder: Path) -> Gateway:
    return start_gateway(
        stack.url,
        folder,
        config=policy,
        tokenizer_overrides=f"all-MiniLM-L6-v2={env.model_dir}",
    )


@pytest.fixture(scope="session")
def gateways(env: RealEnv, e2e_dir: Path) -> Iterator[dict[tuple[str, str], Gateway]]:
    """Started on demand, one per (upstream, policy); all stopped at the end."""
    started: dict[tuple[str, str], Gateway] = {}
    yield started
    for gw in started.values():
        gw.stop()


@pytest.fixture(scope="session")
def gateway(
    upstream: Stack, env: RealEnv, e2e_dir: Path, gateways: dict[tuple[str, str], Gateway]
) -> Gateway:
    """The shipped MiniLM policy in front of ``upstream``."""
    key = (upstream.kind, "plain")
    if key not in gateways:
        gateways[key] = _gateway(upstream, PLAIN_POLICY, env, e2e_dir)
    return gateways[key]


@pytest.fixture(scope="session")
def mrl_gateway(
    upstream: Stack, env: RealEnv, e2e_dir: Path, gateways: dict[tuple[str, str], Gateway]
) -> Gateway:
    """The Matryoshka-emulating MiniLM policy in front of ``upstream``."""
    key = (upstream.kind, "matryoshka")
    if key not in gateways:
        gateways[key] = _gateway(upstream, MATRYOSHKA_POLICY, env, e2e_dir)
    return gateways[key]
