"""`extproc learn` end to end: a real legacy server (tests/e2e/legacy_minilm_app.py:
FastAPI + transformers serving all-MiniLM-L6-v2 on this CPU) against a real vLLM and a
real Dynamo 1.6.1 (the `upstream` fixture runs both), in two contracts:

- ``e5``: E5-style prompts, a cut at 128 tokens keeping [SEP], `dimensions` 32..384,
  `encoding_format` ignored. The learned policy must be the one a person would write
  for that server, and the verify step (the real gateway in front of the real
  upstream, compared with the legacy server) must find it ready.
- ``plain``: `instruction` ignored (no such field), base64 honoured with pydantic's lax
  reading of a `Literal` (64.0 taken, "64" refused), `dimensions` a set without the
  native size, cuts not re-normalised,
  FastAPI's 422s. Learned READY, and then the gateway with the written policy answers
  a battery of requests as the legacy server does (tests/learning.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from extproc.commands import learn as learn_command
from extproc.commands.cli import _parser
from extproc.core.api_errors import ErrorClass
from extproc.core.policy.model import EncodingProfile, InstructionUse, Leniency, Matryoshka
from extproc.service.policy_file import load_policy_file
from testing_support.gateway import GatewaySpec
from testing_support.real_upstream import SERVED_MODEL, RealEnv, Stack
from tests.harness import Gateways
from tests.learning import assert_client_sees_the_same, battery


def run_learn(
    legacy: Stack, upstream: Stack, env: RealEnv, out: Path
) -> tuple[int, dict[str, Any]]:
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
            str(out),
        ]
    )
    code = learn_command.run(args)
    return code, json.loads((out / "report.json").read_text(encoding="utf-8"))


def test_learns_the_legacy_minilm_contract(
    legacy: Stack, upstream: Stack, env: RealEnv, tmp_path: Path
) -> None:
    code, report = run_learn(legacy, upstream, env, tmp_path)
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
    # The tier's Dynamo worker is started Matryoshka (it cuts `dimensions` itself, and
    # learn checked its cut against the gateway's); its plain vLLM is not.
    assert policy.upstream.native.dimensions == (upstream.kind == "dynamo")
    verification = report["verification"]
    assert verification["verdict"]["verdict"] == "ready", verification["verdict"]
    assert verification["parity"]["documents"]["spread"]["min"] >= 0.9995
    spent = report["requests"]
    assert spent["baseline"] <= 400 and spent["candidate"] <= 400


def test_learns_and_imitates_a_plain_contract(
    plain_legacy: Stack, upstream: Stack, env: RealEnv, gateways: Gateways, tmp_path: Path
) -> None:
    code, report = run_learn(plain_legacy, upstream, env, tmp_path)
    assert code == 0, (report["problems"], upstream.logs())
    assert report["result"]["label"] == "READY"
    written = load_policy_file(tmp_path / "policy.yaml")
    policy = written.models[SERVED_MODEL]
    assert policy.prompts.instruction is InstructionUse.IGNORED
    # `dimensions` is a Literal: lax mode takes 64.0, not "64"
    assert policy.honours_base64
    assert policy.leniency == Leniency(integers=False, bom=True, integral_floats=True)
    assert policy.matryoshka is not None
    assert policy.matryoshka.allowed == (64, 128, 256) and not policy.matryoshka.accepts_native
    assert not policy.matryoshka.renormalise and not policy.upstream.native.dimensions
    # FastAPI's bodies, learned as templates: a list `detail` for what pydantic refuses
    assert list(written.errors.template(ErrorClass.INVALID)) == ["detail"]
    assert written.errors.statuses[ErrorClass.MALFORMED] == 422
    spec = GatewaySpec(
        upstream.url, policy=tmp_path / "policy.yaml", tokenizers=f"{SERVED_MODEL}={env.model_dir}"
    )
    with gateways.own(spec) as gateway:
        bodies = battery(SERVED_MODEL, (0, 32, 64, 65, 128, 256, 383, 384, 385))
        assert_client_sees_the_same(plain_legacy.url, gateway.url, bodies)


def test_learns_and_imitates_a_server_whose_handler_checks_the_request(
    handler_legacy: Stack, upstream: Stack, env: RealEnv, gateways: Gateways, tmp_path: Path
) -> None:
    """Its request model validates types (FastAPI's list `detail`), its handler checks
    sizes with `HTTPException` (a text `detail`) and the batch and an empty input with
    an error of its own (`{detail, param}`); the role in `prompt_name`; any model name;
    an instruction with a document ignored; line breaks folded. Learned READY, and the
    gateway answers every battery row as it does: status, body keys, order and types,
    vectors, norms and token counts."""
    code, report = run_learn(handler_legacy, upstream, env, tmp_path)
    assert code == 0, (report["problems"], upstream.logs())
    assert report["result"]["label"] == "READY"
    written = load_policy_file(tmp_path / "policy.yaml")
    policy = written.models[SERVED_MODEL]
    assert policy.prompts.role_field == "prompt_name"
    assert policy.prompts.document_instruction is InstructionUse.IGNORED
    assert policy.any_name and policy.unnamed
    assert written.limits.max_inputs == 16
    # three bodies: pydantic's list, HTTPException's text, the handler's own
    assert written.errors.template(ErrorClass.DIMENSIONS) == {"detail": "{message}"}
    assert list(written.errors.template(ErrorClass.TOO_MANY_INPUTS)) == ["detail", "param"]
    spec = GatewaySpec(
        upstream.url, policy=tmp_path / "policy.yaml", tokenizers=f"{SERVED_MODEL}={env.model_dir}"
    )
    with gateways.own(spec) as gateway:
        bodies = battery(SERVED_MODEL, (0, 31, 32, 64, 384, 385), role_field="prompt_name")
        assert_client_sees_the_same(handler_legacy.url, gateway.url, bodies)
