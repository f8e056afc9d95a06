"""`extproc learn` end to end: a real legacy server (tests/e2e/legacy_minilm_app.py:
FastAPI + transformers serving all-MiniLM-L6-v2 on this CPU, E5-style prompts, a cut
at 128 tokens keeping [SEP], `dimensions` 32..384, `encoding_format` ignored) against
a real vLLM and a real Dynamo 1.6.1 (the `upstream` fixture runs both). The learned
policy must be the one a person would write for that server, and the verify step
(the real gateway in front of the real upstream, compared with the legacy server)
must find it ready.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from extproc.commands import learn as learn_command
from extproc.commands.cli import _parser
from extproc.core.policy import load_policy_file
from extproc.core.policy.model import EncodingProfile, Matryoshka
from tests.harness import free_port, http
from tests.real_upstream import SERVED_MODEL, RealEnv, Stack, _server_env, _spawn, _wait

APP = Path(__file__).with_name("legacy_minilm_app.py")


@pytest.fixture(scope="session")
def legacy(env: RealEnv, e2e_dir: Path) -> Iterator[Stack]:
    workdir = e2e_dir / "legacy"
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [str(env.vllm_python), str(APP), "--model-dir", str(env.model_dir), "--port", str(port)]
    stack = Stack("legacy", f"http://127.0.0.1:{port}")
    stack.processes.append(_spawn("legacy", argv, _server_env(workdir), workdir))
    _wait(stack, lambda: http("GET", f"{stack.url}/health", timeout=2).status == 200)
    yield stack
    stack.stop()


def test_learns_the_legacy_minilm_contract(
    legacy: Stack, upstream: Stack, env: RealEnv, tmp_path: Path
) -> None:
    args = _parser().parse_args(
        [
            "learn",
            "--baseline",
            legacy.url,
            "--candidate",
            upstream.url,
            "--model",
            SERVED_MODEL,
            "--tokenizer",
            f"{SERVED_MODEL}={env.model_dir}",
            "--out",
            str(tmp_path),
        ]
    )
    code = learn_command.run(args)
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert code == 0, (report["problems"], upstream.logs())
    assert report["result"]["label"] == "READY"
    policy = load_policy_file(tmp_path / "policy.yaml").models[SERVED_MODEL]
    # what a person reading the app would write
    assert policy.prompts.query == "query: {text}"
    assert policy.prompts.document == "passage: {text}"
    assert policy.prompts.default_instruction == "" and not policy.prompts.extra
    assert policy.max_tokens == 128
    assert policy.native_dimensions == 384
    assert policy.matryoshka == Matryoshka(min_dimensions=32)
    assert policy.encoding_profile is EncodingProfile.LEGACY
    assert policy.special_tokens.from_tokenizer
    assert policy.upstream.kind == upstream.kind
    # The tier's Dynamo worker is started Matryoshka (tests/e2e/conftest.py): it cuts
    # `dimensions` itself, which learn finds; the plain vLLM does not.
    assert policy.upstream.native.dimensions == (upstream.kind == "dynamo")
    verification = report["verification"]
    assert verification["verdict"]["verdict"] == "ready", verification["verdict"]
    assert verification["parity"]["documents"]["spread"]["min"] >= 0.9995
    spent = report["requests"]
    assert spent["baseline"] <= 400 and spent["candidate"] <= 400
