"""Fixtures of the end-to-end tier: real vLLM and real Dynamo on loopback, each
with the gateway (`extproc run`: real Envoy + ext_proc) in front, from the session's
shared gateways (tests/harness.py); vLLM serving the MiniLM cross-encoder and the
legacy rerank servers over the same weights; the legacy embedding servers (one
contract each, and one speaking TEI's, Cohere's and Ollama's dialects). Everything
is marked `e2e`; `scripts/setup-real-upstream.sh` prepares the environments."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testing_support.gateway import Gateway, GatewaySpec
from testing_support.http import http
from testing_support.processes import free_port
from testing_support.real_upstream import (
    SERVED_MODEL,
    RealEnv,
    Stack,
    _server_env,
    _spawn,
    _wait,
    real_env,
    start_dynamo,
    start_vllm,
    start_vllm_reranker,
)
from tests.harness import Gateways

REPO = Path(__file__).resolve().parents[2]
PLAIN_POLICY = REPO / "extproc" / "policies" / "all-minilm-l6-v2.yaml"
LEGACY_APP = Path(__file__).with_name("legacy_minilm_app.py")
LEGACY_RERANK_APP = Path(__file__).with_name("legacy_rerank_app.py")
LEGACY_DIALECTS_APP = Path(__file__).with_name("legacy_dialects_app.py")
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
def vllm_reranker(env: RealEnv, e2e_dir: Path) -> Iterator[Stack]:
    """vLLM serving the MiniLM cross-encoder as ``minilm-reranker``."""
    stack = start_vllm_reranker(env, e2e_dir / "vllm-reranker")
    print(f"\n[e2e] vLLM reranker ready in {stack.started_s:.0f} s")
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


def start_legacy(env: RealEnv, workdir: Path, contract: str) -> Stack:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [str(env.vllm_python), str(LEGACY_APP), "--model-dir", str(env.model_dir)]
    argv += ["--port", str(port), "--contract", contract]
    stack = Stack(f"legacy-{contract}", f"http://127.0.0.1:{port}")
    stack.processes.append(_spawn(stack.kind, argv, _server_env(workdir), workdir))
    _wait(stack, lambda: http("GET", f"{stack.url}/health", timeout=2).status == 200)
    return stack


@pytest.fixture(scope="session")
def legacy(env: RealEnv, e2e_dir: Path) -> Iterator[Stack]:
    stack = start_legacy(env, e2e_dir / "legacy", "e5")
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def plain_legacy(env: RealEnv, e2e_dir: Path) -> Iterator[Stack]:
    stack = start_legacy(env, e2e_dir / "legacy-plain", "plain")
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def handler_legacy(env: RealEnv, e2e_dir: Path) -> Iterator[Stack]:
    stack = start_legacy(env, e2e_dir / "legacy-handler", "handler")
    yield stack
    stack.stop()


def minilm(stack: Stack, policy: Path | str, env: RealEnv) -> GatewaySpec:
    """The gateway of a MiniLM ``policy`` (a file or its text) in front of ``stack``."""
    return GatewaySpec(stack.url, policy=policy, tokenizers=f"{SERVED_MODEL}={env.model_dir}")


@pytest.fixture(scope="session")
def gateway(upstream: Stack, env: RealEnv, gateways: Gateways) -> Gateway:
    """The shipped MiniLM policy in front of ``upstream``."""
    return gateways.shared(minilm(upstream, PLAIN_POLICY, env))


@pytest.fixture(scope="session")
def mrl_gateway(upstream: Stack, env: RealEnv, gateways: Gateways) -> Gateway:
    """The Matryoshka-emulating MiniLM policy in front of ``upstream``."""
    return gateways.shared(minilm(upstream, MATRYOSHKA_POLICY, env))


def start_legacy_rerank(env: RealEnv, workdir: Path, dialect: str) -> Stack:
    """tests/e2e/legacy_rerank_app.py in ``dialect`` (``tei`` or ``cohere``) over the
    cross-encoder vLLM serves."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [str(env.vllm_python), str(LEGACY_RERANK_APP), "--model-dir", str(env.reranker_dir)]
    argv += ["--port", str(port), "--dialect", dialect]
    stack = Stack(f"legacy-rerank-{dialect}", f"http://127.0.0.1:{port}")
    stack.processes.append(_spawn(stack.kind, argv, _server_env(workdir), workdir))
    _wait(stack, lambda: http("GET", f"{stack.url}/health", timeout=2).status == 200)
    return stack


@pytest.fixture(scope="session")
def legacy_tei_rerank(env: RealEnv, e2e_dir: Path) -> Iterator[Stack]:
    stack = start_legacy_rerank(env, e2e_dir / "legacy-rerank-tei", "tei")
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def legacy_cohere_rerank(env: RealEnv, e2e_dir: Path) -> Iterator[Stack]:
    stack = start_legacy_rerank(env, e2e_dir / "legacy-rerank-cohere", "cohere")
    yield stack
    stack.stop()


def start_legacy_dialects(
    env: RealEnv, workdir: Path, paths: str = "", kind: str = "legacy-dialects"
) -> Stack:
    """tests/e2e/legacy_dialects_app.py: MiniLM in TEI's, Cohere's and Ollama's
    embeddings dialects (or only at ``paths``, comma-separated), over the weights vLLM
    and Dynamo serve."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [str(env.vllm_python), str(LEGACY_DIALECTS_APP), "--model-dir", str(env.model_dir)]
    argv += ["--port", str(port), "--paths", paths]
    stack = Stack(kind, f"http://127.0.0.1:{port}")
    stack.processes.append(_spawn(stack.kind, argv, _server_env(workdir), workdir))
    _wait(stack, lambda: http("GET", f"{stack.url}/health", timeout=2).status == 200)
    return stack


@pytest.fixture(scope="session")
def legacy_dialects(env: RealEnv, e2e_dir: Path) -> Iterator[Stack]:
    stack = start_legacy_dialects(env, e2e_dir / "legacy-dialects")
    yield stack
    stack.stop()


# One server a dialect family, as a fleet has them: what learn must find, and no more.
DIALECT_SERVERS = {
    "tei": "/embed,/",
    "cohere": "/v1/embed,/v2/embed",
    "ollama": "/api/embed,/api/embeddings",
}


@pytest.fixture(scope="session", params=sorted(DIALECT_SERVERS))
def dialect_server(request: pytest.FixtureRequest, env: RealEnv, e2e_dir: Path) -> Iterator[Stack]:
    style = str(request.param)
    stack = start_legacy_dialects(env, e2e_dir / f"legacy-{style}", DIALECT_SERVERS[style], style)
    yield stack
    stack.stop()
