"""`extproc learn` against legacy servers of one dialect family each (TEI, Cohere,
Ollama: tests/e2e/legacy_dialects_app.py limited to that family's paths) and a real
vLLM or Dynamo: learned speaking the dialect, every path of the family found and
written as the model's `serves`, and each verified through the real gateway.

Ollama's older route answers vectors as the model pools them, which only vLLM gives:
in front of Dynamo learn names that and exits 1, never READY."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extproc.commands import learn as learn_command
from extproc.commands.cli import _parser
from extproc.core.policy import PolicyError
from extproc.service.policy_file import load_policy_file
from testing_support.real_upstream import SERVED_MODEL, RealEnv, Stack

# The dialect learn speaks to each family, and what it must find.
SPOKEN = {"tei": "tei", "cohere": "cohere-v2", "ollama": "ollama"}
FOUND = {
    "tei": {("tei", "/embed", True), ("tei", "/", True)},
    "cohere": {("cohere_v2", "/v2/embed", True), ("cohere_v1", "/v1/embed", True)},
    "ollama": {("ollama", "/api/embed", True), ("ollama_embeddings", "/api/embeddings", False)},
}


def test_each_dialect_family_is_learned_with_every_path(
    dialect_server: Stack, upstream: Stack, env: RealEnv, tmp_path: Path
) -> None:
    style = dialect_server.kind
    argv = ["learn", "--baseline", dialect_server.url, "--candidate", upstream.url]
    argv += ["--model", SERVED_MODEL, "--tokenizer", f"{SERVED_MODEL}={env.model_dir}"]
    argv += ["--dialect", SPOKEN[style], "--out", str(tmp_path)]
    code = learn_command.run(_parser().parse_args(argv))
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    if style == "ollama" and upstream.kind == "dynamo":
        # the older route's pooled vectors: written, named, and refused by the loader
        assert code == 1 and report["result"]["label"] != "READY"
        assert any("only vLLM gives" in p for p in report["problems"]), report["problems"]
        with pytest.raises(PolicyError, match="gives no vectors as the model pools them"):
            load_policy_file(tmp_path / "policy.yaml")
        return
    policy = load_policy_file(tmp_path / "policy.yaml").models[SERVED_MODEL]
    served = {(s.dialect, s.path, s.normalized) for s in policy.serves}
    assert served == FOUND[style], report["problems"]
    assert code == 0, report["problems"]
    assert report["result"]["label"] == "READY"
    rows = report["verification"]["contract"]
    dialects = {row["key"].split(":")[0] for row in rows if ":" in row["key"]}
    assert dialects == {d for d, _, _ in served}, dialects
    assert all(row["severity"] != "fail" for row in rows), rows
