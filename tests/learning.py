"""Running `extproc learn` in a test: the command as a user runs it, and what it
wrote (exit code, policy, report.json, report.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from extproc.commands import learn as learn_command
from extproc.commands.cli import _parser
from extproc.core.policy import ModelPolicy, load_policy_file
from tests.fake_legacy import FakeLegacy
from tests.fake_upstream import FakeUpstream


def learn(
    legacy: FakeLegacy, upstream: FakeUpstream, out: Path, *extra: str
) -> tuple[int, ModelPolicy | None, dict[str, Any], str]:
    """Run `extproc learn`; (exit code, the policy written, report.json, report.md)."""
    model = legacy.served_model
    args = _parser().parse_args(
        [
            "learn",
            "--baseline",
            legacy.url,
            "--candidate",
            upstream.url,
            "--model",
            model,
            "--tokenizer",
            f"{model}={upstream.tokenizer_dir}",
            "--out",
            str(out),
            *extra,
        ]
    )
    code = learn_command.run(args)
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    md = (out / "report.md").read_text(encoding="utf-8")
    assert report["result"]["exit_code"] == code
    policy_file = out / "policy.yaml"
    policy = load_policy_file(policy_file).models[model] if policy_file.exists() else None
    return code, policy, report, md


def findings(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["field"]: f for f in report["findings"]}


def assert_gateway_like_baseline(report: dict[str, Any]) -> None:
    """The verify step's verdict: READY, every contract row the same (or a request the
    gateway accepts and the baseline refuses: a warning), vectors at cosine 1."""
    verification = report["verification"]
    assert verification["verdict"]["verdict"] == "ready", verification["verdict"]
    assert verification["parity"]["documents"]["spread"]["min"] == pytest.approx(1.0, abs=1e-6)
    for row in verification["contract"]:
        assert row["severity"] != "fail", row
        if row["valid"] and row["baseline"]["status"] == 200:
            assert row["cosine_min"] == pytest.approx(1.0, abs=1e-6), row["title"]
            assert row["baseline"]["kind"] == row["candidate"]["kind"], row["title"]
