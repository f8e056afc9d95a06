"""Running `extproc learn` in a test, the command as a user runs it, and what it
wrote (exit code, policy, report.json, report.md); and comparing a gateway with a
legacy server as a client sees them."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from extproc.commands import learn as learn_command
from extproc.commands.cli import _parser
from extproc.core.policy import ModelPolicy
from extproc.service.policy_file import load_policy_file
from extproc.tools.learn import battery as verification_battery
from extproc.tools.parity import Answer
from extproc.tools.parity.json_shape import shape_difference
from testing_support.fake_upstream import FakeUpstream
from testing_support.http import http
from tests.fake_legacy import FakeLegacy


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
        if row["valid"] and row["baseline"]["status"] == 200 and row["baseline"]["count"]:
            assert row["cosine_min"] == pytest.approx(1.0, abs=1e-6), row["title"]
            assert row["baseline"]["kind"] == row["candidate"]["kind"], row["title"]


TEXT = "Where can I change the email address of my account?"
# Texts whose handling nobody names until a server differs on them: the ones learn's
# verification sends.
BATTERY_TEXTS = verification_battery.TEXTS
LONG = "the river runs past old stone houses where people keep small gardens " * 200


def battery(
    model: str, sizes: Iterable[int], *, role_field: str = "input_type"
) -> dict[str, bytes]:
    """The requests a client of a legacy server may send, valid or not (``sizes``: the
    ``dimensions`` to ask for; ``role_field``: the field the legacy server takes an
    input's role from)."""
    plain: dict[str, Any] = {"model": model, "input": [TEXT, "second input"]}
    bodies: dict[str, Any] = {
        "plain": plain,
        "one string": {"model": model, "input": TEXT},
        "long": {"model": model, "input": [LONG, TEXT]},
        "instruction": {**plain, "instruction": "Find the settings page"},
        "query + instruction": {**plain, role_field: "query", "instruction": "Find it"},
        "document + instruction": {**plain, role_field: "document", "instruction": "x"},
        "base64": {**plain, "encoding_format": "base64"},
        "malformed": b'{"model": "' + model.encode() + b'", "input": ',
        "empty input": {"model": model, "input": []},
        "no input": {"model": model},
        "unknown model": {"model": "no-such-model", "input": [TEXT]},
        "unknown input_type": {**plain, role_field: "no-such-type"},
        "BOM": b"\xef\xbb\xbf" + orjson.dumps(plain),
    }
    for input_type in ("query", "search_query", "question", "document", "passage", "doc"):
        bodies[f"input_type {input_type}"] = {**plain, role_field: input_type}
    for label, text in BATTERY_TEXTS.items():
        bodies[label] = {"model": model, "input": [text]}
    for size in verification_battery.BATCHES:
        bodies[f"{size} inputs"] = {"model": model, "input": [f"text {i}" for i in range(size)]}
    bodies["the same input twice"] = {"model": model, "input": [TEXT, TEXT]}
    size = 64
    for d in sorted(sizes):
        bodies[f"dimensions {d}"] = {**plain, "dimensions": d}
    bodies["dimensions as a string"] = {**plain, "dimensions": str(size)}
    bodies["dimensions as a float"] = {**plain, "dimensions": float(size)}
    bodies["dimensions 64 base64"] = {**plain, "dimensions": size, "encoding_format": "base64"}
    return {k: v if isinstance(v, bytes) else orjson.dumps(v) for k, v in bodies.items()}


def assert_client_sees_the_same(
    legacy_url: str, gateway_url: str, bodies: dict[str, bytes], *, min_cosine: float = 0.9995
) -> None:
    """Each body to both: the same status and error body shape; for a 2xx the same
    number, size and encoding of vectors, each at ``min_cosine`` or more with norms
    within 1e-3, and the same ``usage.prompt_tokens``."""
    differences = []
    for label, body in bodies.items():
        old = http("POST", f"{legacy_url}/v1/embeddings", body)
        new = http("POST", f"{gateway_url}/v1/embeddings", body)
        if old.status != new.status:
            differences.append(f"{label}: status {old.status} vs {new.status}: {new.body[:200]!r}")
            continue
        shape = body_shape_difference(old.body, new.body)
        if shape is not None:
            differences.append(f"{label}: the body differs at {shape}")
            continue
        if old.status != 200:
            continue
        a, b = Answer.read(old.status, old.body), Answer.read(new.status, new.body)
        assert a.vectors is not None and b.vectors is not None, label
        if a.vectors.shape != b.vectors.shape or a.encoding != b.encoding:
            differences.append(
                f"{label}: {a.vectors.shape} {a.encoding} vs {b.vectors.shape} {b.encoding}"
            )
            continue
        cosines = np.sum(a.vectors * b.vectors, 1) / (
            np.linalg.norm(a.vectors, axis=1) * np.linalg.norm(b.vectors, axis=1)
        )
        norms = np.abs(np.linalg.norm(a.vectors, axis=1) - np.linalg.norm(b.vectors, axis=1))
        if cosines.min() < min_cosine or norms.max() > 1e-3:
            differences.append(
                f"{label}: cosine {cosines.min():.6f}, norm difference {norms.max():.2e}"
            )
        if a.prompt_tokens != b.prompt_tokens:
            differences.append(f"{label}: {a.prompt_tokens} vs {b.prompt_tokens} tokens")
    assert not differences, "\n".join(differences)


def rerank_scores(doc: Any) -> list[tuple[int, float]]:
    items = doc if isinstance(doc, list) else doc["results"]
    return [(r["index"], r.get("score", r.get("relevance_score"))) for r in items]


def body_shape_difference(old: bytes, new: bytes) -> str | None:
    """Where two bodies differ as a client's code reads them (keys, order, value types
    at every level), or None; a body that is not JSON compared as text."""
    try:
        a, b = orjson.loads(old), orjson.loads(new)
    except orjson.JSONDecodeError:
        return None if old == new else "$: not JSON"
    return shape_difference(a, b)


def assert_same_rerank_answer(old: Any, new: Any, label: str) -> None:
    """A rerank client sees the same: status, the body's keys, order and value types,
    order of results, scores within 1e-4, the same fields."""
    assert old.status == new.status, (label, old.body[:300], new.body[:300])
    shape = body_shape_difference(old.body, new.body)
    assert shape is None, (label, shape, old.body[:300], new.body[:300])
    if old.status != 200:
        return
    a, b = orjson.loads(old.body), orjson.loads(new.body)
    assert type(a) is type(b), label
    assert [i for i, _ in rerank_scores(a)] == [i for i, _ in rerank_scores(b)], (label, a, b)
    for (_, x), (_, y) in zip(rerank_scores(a), rerank_scores(b), strict=True):
        assert abs(x - y) <= 1e-4, (label, x, y)
    items = a if isinstance(a, list) else a["results"]
    others = b if isinstance(b, list) else b["results"]
    assert [sorted(r) for r in items] == [sorted(r) for r in others], (label, a, b)
    scores = ("score", "relevance_score")
    for x, y in zip(items, others, strict=True):  # documents' texts, exactly
        assert {k: v for k, v in x.items() if k not in scores} == {
            k: v for k, v in y.items() if k not in scores
        }, label
    if isinstance(a, dict):
        assert sorted(a) == sorted(b), label
        assert a.get("meta") == b.get("meta"), label
