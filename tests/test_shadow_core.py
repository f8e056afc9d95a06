"""Shadow mode's sans-I/O core, and its gRPC/HTTP shells in-process (no Envoy).

Halves from bodies, pair comparison, the bounded pair store, the tally and its
quantiles, the verdict, the tap stream state machine, the report, the rendered
Envoy configs, and one comparator fed over gRPC and read over HTTP."""

from __future__ import annotations

import asyncio
import base64
import copy
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from extproc.core.policy import GatewayPolicy, load_policy_text
from extproc.core.routes import Routes, routes_of
from extproc.core.status import status_class
from extproc.runtime.envoy_config import DEFAULT_TEMPLATE as STANDALONE_TEMPLATE
from extproc.runtime.envoy_config import Upstream, dump, load_template
from extproc.tools.parity import Thresholds
from extproc.tools.shadow import (
    Half,
    InputKind,
    PairStore,
    RawHalf,
    Role,
    ShadowTolerances,
    StoreLimits,
    Tally,
    compare_pair,
    extract_half,
    judge,
    summarize,
)
from extproc.tools.shadow.comparator_server import (
    EMBEDDINGS_ROUTES,
    CompareOptions,
    serve_compare,
)
from extproc.tools.shadow.envoy_render import (
    EMBEDDED_GATEWAY,
    REVERSE_TEMPLATE,
    SHADOW_TEMPLATE,
    TAP_FILTER,
    ShadowEnvoySettings,
    adopt_gateway,
    hcm_of,
    hcm_routes,
    render_shadow,
)
from extproc.tools.shadow.half import digest
from extproc.tools.shadow.shadow_report import render_report
from extproc.tools.shadow.tap import TapStream
from testing_support.envoy import envoy_validate
from testing_support.qwen import SHIPPED_QWEN_POLICY

RNG = np.random.default_rng(7)


# --------------------------------------------------------------------------- helpers


def unit_rows(n: int, dims: int = 16, seed: int = 0) -> np.ndarray[Any, np.dtype[np.float32]]:
    rows = np.random.default_rng(seed).standard_normal((n, dims)).astype(np.float32)
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def body(vectors: np.ndarray[Any, Any], *, tokens: int = 10, as_base64: bool = False) -> bytes:
    data = []
    for i, row in enumerate(vectors):
        embedding: Any = (
            base64.b64encode(row.astype("<f4").tobytes()).decode()
            if as_base64
            else [float(x) for x in row]
        )
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    return orjson.dumps(
        {"object": "list", "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    )


def request(inputs: Any = ("a", "b"), **extra: Any) -> bytes:
    value = list(inputs) if isinstance(inputs, tuple) else inputs
    return orjson.dumps({"model": "m", "input": value, **extra})


def half(
    role: Role,
    vectors: np.ndarray[Any, Any] | None = None,
    *,
    request_id: str = "r1",
    status: int = 200,
    request_body: bytes | None = None,
    tokens: int = 10,
    latency: float = 0.01,
    upstream: float | None = None,
) -> Half:
    vectors = unit_rows(2) if vectors is None else vectors
    raw = RawHalf(
        role=role,
        request_id=request_id,
        request_body=request_body if request_body is not None else request(),
        status=status,
        response_body=body(vectors, tokens=tokens) if 200 <= status < 300 else b'{"error":{}}',
        latency_s=latency,
        upstream_s=upstream,
    )
    return extract_half(raw, EMBEDDINGS_ROUTES, keep_text=True)


def perturbed(vectors: np.ndarray[Any, Any], cosine: float) -> np.ndarray[Any, Any]:
    """Rows at the given cosine from ``vectors`` (unit rows in, unit rows out)."""
    noise = unit_rows(vectors.shape[0], vectors.shape[1], seed=99)
    noise -= (noise * vectors).sum(axis=1, keepdims=True) * vectors  # orthogonal part
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    sine = np.sqrt(1 - cosine**2)
    return (cosine * vectors + sine * noise).astype(np.float32)


# --------------------------------------------------------------------------- halves


def test_a_half_keeps_vectors_tokens_kind_and_count() -> None:
    vectors = unit_rows(3)
    raw = RawHalf(Role.BASELINE, "id", request(("x", "y", "z")), 200, body(vectors, tokens=42), 0.5)
    h = extract_half(raw, EMBEDDINGS_ROUTES)
    assert h.answer.vectors is not None and h.answer.vectors.dtype == np.float32
    assert np.array_equal(h.answer.vectors, vectors)
    assert (h.answer.prompt_tokens, h.inputs, h.kind, h.answer.problem) == (
        42,
        3,
        InputKind.DOCUMENT,
        "",
    )
    assert h.texts == ()  # no text unless asked for
    assert h.request_digest == digest(raw.request_body)


def test_base64_vectors_and_out_of_order_data_are_read() -> None:
    vectors = unit_rows(3)
    doc = orjson.loads(body(vectors, as_base64=True))
    doc["data"].reverse()
    raw = RawHalf(Role.CANDIDATE, "id", request(("x", "y", "z")), 200, orjson.dumps(doc), 0.1)
    read = extract_half(raw, EMBEDDINGS_ROUTES).answer
    assert read.vectors is not None and np.array_equal(read.vectors, vectors)
    assert read.encoding == "base64"


@pytest.mark.parametrize(
    ("extra", "kind"),
    [
        ({}, InputKind.DOCUMENT),
        ({"input_type": "query"}, InputKind.QUERY),
        ({"input_type": "search_query"}, InputKind.QUERY),
        ({"input_type": "retrieval.query"}, InputKind.QUERY),
        ({"instruction": "Find it"}, InputKind.QUERY),
        ({"input_type": "document"}, InputKind.DOCUMENT),
        ({"input_type": "classification"}, InputKind.DOCUMENT),
    ],
)
def test_input_kind_follows_input_type_and_instruction(
    extra: dict[str, str], kind: InputKind
) -> None:
    raw = RawHalf(Role.BASELINE, "id", request(("q",), **extra), 200, body(unit_rows(1)), 0.1)
    assert extract_half(raw, EMBEDDINGS_ROUTES).kind is kind


@pytest.mark.parametrize(
    ("value", "count"),
    [("one", 1), (["a", "b"], 2), ([1, 2, 3], 1), ([[1, 2], [3]], 2), ([], 0), (5, None)],
)
def test_input_count(value: Any, count: int | None) -> None:
    raw = RawHalf(Role.BASELINE, "id", request(value), 400, b"{}", 0.1)
    assert extract_half(raw, EMBEDDINGS_ROUTES).inputs == count


def test_texts_only_with_keep_text_and_cut() -> None:
    raw = RawHalf(Role.BASELINE, "id", request(("x" * 500, [1, 2])), 200, body(unit_rows(2)), 0)
    assert extract_half(raw, EMBEDDINGS_ROUTES).texts == ()
    assert extract_half(raw, EMBEDDINGS_ROUTES, keep_text=True).texts == (
        "x" * 200,
        "<2 token ids>",
    )


@pytest.mark.parametrize(
    "response",
    [
        b"not json",
        b'{"data": [{"embedding": [1, 2]}]}',
        b'{"object": "list"}',
        b'{"data": [{"index": 0, "embedding": [1, 2]}, {"index": 1, "embedding": [1]}]}',
        b'{"data": [{"index": 0, "embedding": "%%%"}]}',
        b'{"data": [{"index": 0, "embedding": [NaN]}]}',
    ],
)
def test_unusable_2xx_bodies_are_named(response: bytes) -> None:
    answer = extract_half(
        RawHalf(Role.CANDIDATE, "id", request(), 200, response, 0.1), EMBEDDINGS_ROUTES
    ).answer
    assert answer.problem and answer.vectors is None


def test_error_responses_have_no_vectors_and_no_problem() -> None:
    raw = RawHalf(Role.CANDIDATE, "id", request(), 500, b'{"message":"x"}', 0.1)
    a = extract_half(raw, EMBEDDINGS_ROUTES).answer
    assert (a.status, a.vectors, a.problem, a.prompt_tokens) == (500, None, "", None)


# --------------------------------------------------------------------------- comparison


def test_identical_answers_are_at_parity() -> None:
    vectors = unit_rows(2)
    result = compare_pair(half(Role.BASELINE, vectors), half(Role.CANDIDATE, vectors))
    assert result.compared.same_class and not result.status_mismatch
    assert [r.cosine for r in result.inputs] == pytest.approx([1.0, 1.0])
    assert all(r.dims_match and r.norm_match and not r.mismatch for r in result.inputs)
    assert result.compared.token_diff == 0 and not result.request_mismatch
    assert not result.compared.count_mismatch


def test_a_dropped_instruction_is_a_cosine_mismatch_with_a_token_difference() -> None:
    vectors = unit_rows(2)
    result = compare_pair(
        half(Role.BASELINE, vectors, tokens=28),
        half(Role.CANDIDATE, perturbed(vectors, 0.82), tokens=9),
    )
    assert [r.cosine for r in result.inputs] == pytest.approx([0.82, 0.82], abs=1e-5)
    assert all(r.mismatch for r in result.inputs)
    assert result.compared.token_diff == -19


def test_status_class_parity() -> None:
    ok = half(Role.BASELINE)
    assert status_class(200) == "2xx" and status_class(0) == "no answer"
    assert compare_pair(
        half(Role.BASELINE, status=400), half(Role.CANDIDATE, status=422)
    ).compared.same_class
    result = compare_pair(ok, half(Role.CANDIDATE, status=500))
    assert result.status_mismatch and result.inputs == ()


def test_dimension_count_and_norm_mismatches() -> None:
    vectors = unit_rows(2, 32)
    dims = compare_pair(half(Role.BASELINE, vectors), half(Role.CANDIDATE, vectors[:, :16]))
    assert all(not r.dims_match and r.cosine is None and r.mismatch for r in dims.inputs)
    count = compare_pair(half(Role.BASELINE, vectors), half(Role.CANDIDATE, vectors[:1]))
    assert count.compared.count_mismatch and count.inputs == ()
    norms = compare_pair(half(Role.BASELINE, vectors), half(Role.CANDIDATE, vectors * 1.01))
    assert all(not r.norm_match and r.cosine == pytest.approx(1.0) for r in norms.inputs)


def test_latency_ratio_prefers_envoys_upstream_time() -> None:
    envoy = compare_pair(
        half(Role.BASELINE, latency=0.5, upstream=0.050),
        half(Role.CANDIDATE, latency=0.5, upstream=0.025),
    )
    assert (envoy.latency_source, envoy.latency_ratio) == ("envoy", pytest.approx(0.5))
    tap = compare_pair(half(Role.BASELINE, latency=0.2), half(Role.CANDIDATE, latency=0.3))
    assert (tap.latency_source, tap.latency_ratio) == ("tap", pytest.approx(1.5))
    zero = compare_pair(half(Role.BASELINE, upstream=0.0), half(Role.CANDIDATE, upstream=0.001))
    assert zero.latency_ratio is None


def test_noise_explains_differences_as_large_as_baseline_vs_baseline() -> None:
    vectors = unit_rows(2)
    tolerances = ShadowTolerances(min_cosine=0.999, noise_relative=2.0, noise_absolute=1e-5)
    baseline = half(Role.BASELINE, vectors)
    candidate = half(Role.CANDIDATE, perturbed(vectors, 0.998))
    noisy = half(Role.NOISE, perturbed(vectors, 0.9985))  # noise 0.0015, candidate 0.002
    calm = half(Role.NOISE, vectors)  # no noise at all
    explained = compare_pair(baseline, candidate, noisy, tolerances)
    assert all(r.explained_by_noise and not r.mismatch for r in explained.inputs)
    assert explained.inputs[0].noise_cosine == pytest.approx(0.9985, abs=1e-6)
    unexplained = compare_pair(baseline, candidate, calm, tolerances)
    assert all(r.mismatch and not r.explained_by_noise for r in unexplained.inputs)
    # A perfect match is never "explained": there is nothing to explain.
    perfect = compare_pair(baseline, half(Role.CANDIDATE, vectors), noisy, tolerances)
    assert not any(r.explained_by_noise or r.mismatch for r in perfect.inputs)


def test_noise_explains_a_status_difference_only_when_the_baseline_is_flaky() -> None:
    flaky = compare_pair(
        half(Role.BASELINE, status=503), half(Role.CANDIDATE), half(Role.NOISE, status=200)
    )
    assert not flaky.compared.same_class and flaky.status_explained_by_noise
    assert not flaky.status_mismatch
    real = compare_pair(
        half(Role.BASELINE), half(Role.CANDIDATE, status=500), half(Role.NOISE, status=200)
    )
    assert real.status_mismatch


def test_different_request_bytes_are_flagged() -> None:
    result = compare_pair(
        half(Role.BASELINE), half(Role.CANDIDATE, request_body=request(("a", "b"), x=1))
    )
    assert result.request_mismatch


# --------------------------------------------------------------------------- pair store


def test_store_pairs_by_request_id() -> None:
    store = PairStore(StoreLimits(ttl_s=10))
    assert store.add(half(Role.CANDIDATE, request_id="a"), 0.0) == (None, [])
    assert store.add(half(Role.BASELINE, request_id="b"), 0.1) == (None, [])
    completed, dropped = store.add(half(Role.BASELINE, request_id="a"), 0.2)
    assert completed is not None and completed.candidate.request_id == "a" and not dropped
    assert store.pending == 1


def test_unpaired_halves_expire_and_memory_returns() -> None:
    store = PairStore(StoreLimits(ttl_s=1))
    store.add(half(Role.BASELINE, request_id="a"), 0.0)
    assert store.pending_bytes > 0
    assert store.expire(0.5) == ([], [])
    completed, dropped = store.expire(1.0)
    assert completed == [] and [(d.request_id, d.role, d.reason) for d in dropped] == [
        ("a", Role.BASELINE, "expired")
    ]
    assert store.pending == 0 and store.pending_bytes == 0


def test_the_store_is_bounded_by_count_and_bytes() -> None:
    store = PairStore(StoreLimits(ttl_s=60, max_pending=3))
    for i in range(5):
        _, dropped = store.add(half(Role.BASELINE, request_id=str(i)), float(i))
    assert store.pending == 3 and dropped[0].request_id == "1" and dropped[0].reason == "evicted"
    one = half(Role.BASELINE, request_id="x").nbytes
    small = PairStore(StoreLimits(ttl_s=60, max_bytes=2 * one))
    evicted = [d for i in range(4) for d in small.add(half(Role.BASELINE, request_id=str(i)), 0)[1]]
    assert small.pending_bytes <= 2 * one and [d.request_id for d in evicted] == ["0", "1"]


def test_duplicates_and_late_halves_are_dropped() -> None:
    store = PairStore(StoreLimits(ttl_s=60))
    store.add(half(Role.BASELINE), 0)
    assert store.add(half(Role.BASELINE), 0)[1][0].reason == "duplicate"
    assert store.add(half(Role.CANDIDATE), 0)[0] is not None
    assert store.add(half(Role.NOISE), 0)[1][0].reason == "late"


def test_with_noise_expected_a_pair_waits_for_it_then_completes_without() -> None:
    store = PairStore(StoreLimits(ttl_s=1), expect_noise=True)
    store.add(half(Role.BASELINE, request_id="a"), 0)
    assert store.add(half(Role.CANDIDATE, request_id="a"), 0)[0] is None
    completed, dropped = store.expire(2)
    assert len(completed) == 1 and completed[0].noise is None and not dropped
    store.add(half(Role.BASELINE, request_id="b"), 3)
    store.add(half(Role.NOISE, request_id="b"), 3)
    completed, _ = store.add(half(Role.CANDIDATE, request_id="b"), 3)
    assert completed is not None and completed.noise is not None


# --------------------------------------------------------------------------- tally and verdict


def pair_results(n: int, *, cosine: float = 1.0, candidate_status: int = 200) -> list[Any]:
    out = []
    for i in range(n):
        vectors = unit_rows(2, seed=i)
        candidate = perturbed(vectors, cosine) if cosine < 1 else vectors
        out.append(
            compare_pair(
                half(Role.BASELINE, vectors, request_id=f"d{i}"),
                half(Role.CANDIDATE, candidate, request_id=f"d{i}", status=candidate_status),
            )
        )
    return out


def test_summary_of_parity_is_ready() -> None:
    tally = Tally()
    for result in pair_results(5):
        tally.add_pair(result)
    summary = summarize(tally)
    assert summary["pairs"] == 5 and summary["inputs"]["document"]["compared"] == 10
    assert summary["inputs"]["document"]["cosine"]["min"] == pytest.approx(1.0)
    assert summary["status"]["pairs"] == {"2xx/2xx": 5} and summary["status"]["mismatches"] == 0
    assert summary["tokens"] == {
        "requests": 5, "equal": 5, "different": 0, "baseline_total": 50,
        "candidate_total": 50, "max_abs_diff": 0,
    }  # fmt: skip
    assert summary["verdict"]["verdict"] == "ready"
    assert len(summary["worst"]) == 10 and not any(w["mismatch"] for w in summary["worst"])
    orjson.dumps(summary)  # JSON-able


def test_verdict_thresholds() -> None:
    tally = Tally()
    for result in pair_results(3, cosine=0.9995):
        tally.add_pair(result)
    summary = summarize(tally)
    assert judge(summary, Thresholds(min_cosine=0.999)).ready
    verdict = judge(summary, Thresholds(min_cosine=0.9999))
    assert not verdict.ready and verdict.label == "not ready"
    assert [c.name for c in verdict.checks if not c.ok] == ["documents"]
    assert not judge(summarize(Tally())).ready  # nothing compared yet


def test_status_mismatches_and_queries_fail_the_verdict() -> None:
    tally = Tally()
    for result in pair_results(2, candidate_status=500):
        tally.add_pair(result)
    query = compare_pair(
        half(Role.BASELINE, request_body=request(("q", "r"), input_type="query")),
        half(
            Role.CANDIDATE,
            perturbed(unit_rows(2), 0.4),
            request_body=request(("q", "r"), input_type="query"),
        ),
    )
    tally.add_pair(query)
    summary = summarize(tally)
    assert summary["status"]["mismatch_pairs"] == {"2xx/5xx": 2}
    assert summary["inputs"]["query"]["cosine"]["max"] < 0.5
    failed = {c.name for c in judge(summary).checks if not c.ok}
    assert failed == {"queries", "status classes"}
    assert judge(summary, Thresholds(min_query_cosine=0.0, max_status_mismatches=2)).ready
    assert summary["worst"][0]["kind"] == "query" and summary["worst"][0]["mismatch"]
    assert summary["status"]["examples"][0]["candidate"] == 500


def test_the_tally_stays_bounded() -> None:
    tally = Tally()
    for result in pair_results(40, cosine=0.99):
        tally.add_pair(result)
    assert len(tally.worst) == 20
    assert len(orjson.dumps(summarize(tally))) < 20_000


def test_cosine_quantiles_are_within_one_percent_of_the_distance() -> None:
    tally = Tally()
    cosines = (0.99, 0.995, 0.999, 0.9995, 0.9999)
    for cosine in cosines:
        for result in pair_results(4, cosine=cosine):
            tally.add_pair(result)
    stats = summarize(tally)["inputs"]["document"]["cosine"]
    assert stats["min"] == pytest.approx(0.99, abs=1e-6)
    assert stats["max"] == pytest.approx(0.9999, abs=1e-6)
    assert 1 - stats["p50"] == pytest.approx(1 - 0.999, rel=0.011)
    assert 1 - stats["p05"] == pytest.approx(1 - 0.99, rel=0.011)
    assert stats["min"] <= stats["p01"] <= stats["p05"] <= stats["p50"] <= stats["max"]


# --------------------------------------------------------------------------- tap stream


def headers(**values: str) -> ep.HttpHeaders:
    return ep.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[
                base_pb2.HeaderValue(key=k.replace("_", "-"), raw_value=v.encode())
                for k, v in values.items()
            ]
        )
    )


def envoy_messages(request_body: bytes, status: int, response_body: bytes) -> list[Any]:
    """What an observability-mode tap with STREAMED bodies sends for one request."""
    half_way = len(request_body) // 2
    return [
        ep.ProcessingRequest(request_headers=headers(**{"x_request_id": "abc", ":path": "/"})),
        ep.ProcessingRequest(request_body=ep.HttpBody(body=request_body[:half_way])),
        ep.ProcessingRequest(request_body=ep.HttpBody(body=request_body[half_way:])),
        ep.ProcessingRequest(request_body=ep.HttpBody(body=b"", end_of_stream=True)),
        ep.ProcessingRequest(
            response_headers=headers(
                **{":status": str(status), "x_envoy_upstream_service_time": "12"}
            )
        ),
        ep.ProcessingRequest(response_body=ep.HttpBody(body=response_body)),
        ep.ProcessingRequest(response_body=ep.HttpBody(body=b"", end_of_stream=True)),
    ]


def test_the_tap_stream_collects_one_exchange() -> None:
    stream = TapStream(Role.BASELINE, max_body_bytes=1 << 20)
    messages = envoy_messages(request(), 200, body(unit_rows(2)))
    results = [stream.feed(m, now=float(i)) for i, m in enumerate(messages)]
    assert results[:-1] == [None] * (len(messages) - 1)
    raw = results[-1]
    assert raw is not None and stream.finished
    assert (raw.request_id, raw.status, raw.request_body) == ("abc", 200, request())
    assert raw.latency_s == len(messages) - 1 and raw.upstream_s == 0.012
    assert stream.feed(messages[0], 99.0) is None  # nothing after the end


def test_the_tap_stream_ends_at_bodyless_response_headers() -> None:
    stream = TapStream(Role.CANDIDATE, max_body_bytes=1 << 20)
    stream.feed(ep.ProcessingRequest(request_headers=headers(x_request_id="r")), 0)
    end = ep.ProcessingRequest(response_headers=headers(**{":status": "404"}))
    end.response_headers.end_of_stream = True
    raw = stream.feed(end, 1)
    assert raw is not None and raw.status == 404 and raw.response_body == b""


def test_the_tap_stream_gives_up_on_oversized_bodies_and_missing_ids() -> None:
    stream = TapStream(Role.BASELINE, max_body_bytes=10)
    outcomes = [stream.feed(m, 0) for m in envoy_messages(b"x" * 40, 200, b"{}")]
    assert outcomes == [None] * 7 and stream.problem == "too_large"
    anonymous = TapStream(Role.BASELINE, max_body_bytes=100)
    anonymous.feed(ep.ProcessingRequest(request_headers=headers(**{":path": "/"})), 0)
    assert anonymous.finished and anonymous.problem == "no_request_id"


# --------------------------------------------------------------------------- report


def test_the_report_has_the_seed_tables_and_the_verdict() -> None:
    tally = Tally()
    for result in pair_results(4, cosine=0.9997) + pair_results(1, candidate_status=500):
        tally.add_pair(result)
    text = render_report(summarize(tally))
    assert "| Dimension (documents) | 16 | 16 |" in text
    assert "| Sum of prompt tokens, documents (4 requests) | 40 | 40 |" in text
    assert "| Cosine similarity per document (8 inputs) | Min 0.9997" in text
    assert "| 2xx | 5xx | 1 (mismatch) |" in text
    assert "Verdict: not ready" in text and "[FAIL] status classes" in text
    assert "Verdict: ready" in render_report(summarize(tally), Thresholds(max_status_mismatches=1))


# --------------------------------------------------------------------------- Envoy configs


def without_rewrite(config: dict[str, Any]) -> dict[str, Any]:
    """The same config with the contract gateway's filters removed (all but the tap
    and the router): the candidate answers raw, as a plain address swap would."""
    config = copy.deepcopy(config)
    for listener in config["static_resources"]["listeners"]:
        hcm = hcm_of(listener)
        kept = {TAP_FILTER, "envoy.filters.http.router"}
        removed = {f["name"] for f in hcm["http_filters"]} - kept
        hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] in kept]
        for route in hcm_routes(hcm):
            for name in removed:
                route.get("typed_per_filter_config", {}).pop(name, None)
            if not route.get("typed_per_filter_config", True):
                del route["typed_per_filter_config"]
    return config


def without_shadow(config: dict[str, Any]) -> dict[str, Any]:
    """The same config with no tap and no mirror: the primary path alone (the
    reference for the latency shadowing adds)."""
    config = copy.deepcopy(config)
    for listener in config["static_resources"]["listeners"]:
        hcm = hcm_of(listener)
        hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != TAP_FILTER]
        for route in hcm_routes(hcm):
            route.get("route", {}).pop("request_mirror_policies", None)
            route.get("typed_per_filter_config", {}).pop(TAP_FILTER, None)
            if not route.get("typed_per_filter_config", True):
                del route["typed_per_filter_config"]
    return config


def validate(config: dict[str, Any], path: Path) -> None:
    path.write_text(dump(config))
    result = envoy_validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


def shadow_settings(**overrides: Any) -> ShadowEnvoySettings:
    values: dict[str, Any] = {
        "listen_host": "0.0.0.0",
        "listen_port": 18080,
        "admin_port": 19901,
        "shadow_port": 18081,
        "noise_port": 18082,
        "extproc_port": 15051,
        "compare": (("10.0.0.7", 50061), ("10.0.0.8", 50061)),
        "baseline": Upstream.from_url("http://legacy.example:8000"),
        "candidate": Upstream.from_url("https://dynamo.example:8443"),
        "percent": 12.5,
        "candidate_gateway_port": 18083,
    }
    values.update(overrides)
    return ShadowEnvoySettings(**values)


@pytest.mark.parametrize("template", [SHADOW_TEMPLATE, REVERSE_TEMPLATE], ids=["A", "B"])
def test_shadow_legacy_takes_every_other_path(
    template: Path, qwen_policy: GatewayPolicy, tmp_path: Path
) -> None:
    """`extproc shadow --legacy URL`: the clients' pass-through route goes to the legacy
    server (as `extproc run --legacy` does); the embeddings routes do not move."""
    plain = render_shadow(load_template(template), shadow_settings(), qwen_policy)
    legacy = Upstream.from_url("http://legacy.example:9000")
    config = render_shadow(load_template(template), shadow_settings(legacy=legacy), qwen_policy)
    validate(config, tmp_path / "legacy.yaml")

    def primary_routes(rendered: dict[str, Any]) -> dict[str, str]:
        (primary,) = [
            item for item in rendered["static_resources"]["listeners"] if item["name"] == "primary"
        ]
        return {
            r["name"]: r["route"]["cluster"] for r in hcm_routes(hcm_of(primary)) if "route" in r
        }

    before, after = primary_routes(plain), primary_routes(config)
    assert after["passthrough"] == "legacy" != before["passthrough"]
    assert {k: v for k, v in after.items() if k != "passthrough"} == {
        k: v for k, v in before.items() if k != "passthrough"
    }
    (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "legacy"]
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {
        "address": "legacy.example",
        "port_value": 9000,
    }


@pytest.mark.parametrize("template", [SHADOW_TEMPLATE, REVERSE_TEMPLATE], ids=["A", "B"])
def test_rendered_shadow_configs_validate(
    template: Path, qwen_policy: GatewayPolicy, tmp_path: Path
) -> None:
    config = render_shadow(load_template(template), shadow_settings(), qwen_policy)
    validate(config, tmp_path / "rendered.yaml")
    validate(without_rewrite(config), tmp_path / "no-rewrite.yaml")
    validate(without_shadow(config), tmp_path / "no-shadow.yaml")

    listeners = {item["name"]: item for item in config["static_resources"]["listeners"]}
    clusters = {item["name"]: item for item in config["static_resources"]["clusters"]}
    for name in ("shadow", "noise", *(["candidate"] if "candidate" in listeners else [])):
        assert listeners[name]["address"]["socket_address"]["address"] == "127.0.0.1"
    hcm = listeners["primary"]["filter_chains"][0]["filters"][0]["typed_config"]
    shadowed, plain = hcm["route_config"]["virtual_hosts"][0]["routes"][:2]
    assert (shadowed["name"], plain["name"]) == ("embeddings-shadowed", "embeddings")
    share = shadowed["match"]["runtime_fraction"]
    assert share == {
        "default_value": {"numerator": 125_000, "denominator": "MILLION"},
        "runtime_key": "shadow.percent",
    }
    mirrors = {m["cluster"]: m for m in shadowed["route"]["request_mirror_policies"]}
    assert "runtime_fraction" not in mirrors["shadow_listener"]  # decided by the route
    assert mirrors["noise_listener"]["runtime_fraction"]["default_value"]["numerator"] == 0
    assert "request_mirror_policies" not in plain["route"]
    assert plain["typed_per_filter_config"]["shadow.tap"]["disabled"] is True
    taps = [f for f in hcm["http_filters"] if f["name"] == "shadow.tap"]
    assert taps[0]["typed_config"]["observability_mode"] is True
    assert taps[0]["typed_config"]["failure_mode_allow"] is True
    endpoints = clusters["shadow_compare"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert len(endpoints) == 2
    assert "transport_socket" in clusters["candidate"]  # https
    assert "transport_socket" not in clusters["baseline"]
    role = taps[0]["typed_config"]["grpc_service"]["initial_metadata"][0]["value"]
    assert role == ("candidate" if template == REVERSE_TEMPLATE else "baseline")


@pytest.mark.parametrize("template", [SHADOW_TEMPLATE, REVERSE_TEMPLATE], ids=["A", "B"])
def test_the_shadow_files_embed_the_shipped_single_filter_gateway(template: Path) -> None:
    config = load_template(template)
    assert adopt_gateway(config, load_template(EMBEDDED_GATEWAY)) == config, (
        f"the gateway parts of envoy/{template.name} (candidate listener routes, local "
        f"replies, filters after the tap; the extproc cluster) differ from "
        f"envoy/{EMBEDDED_GATEWAY.name}'s: copy them over (cluster upstream -> candidate)"
    )


@pytest.mark.parametrize("template", [SHADOW_TEMPLATE, REVERSE_TEMPLATE], ids=["A", "B"])
def test_another_gateway_config_can_run_on_the_candidate_side(
    template: Path, qwen_policy: GatewayPolicy, tmp_path: Path
) -> None:
    standalone = load_template(STANDALONE_TEMPLATE)
    config = render_shadow(
        load_template(template), shadow_settings(), qwen_policy, gateway=standalone
    )
    validate(config, tmp_path / "standalone-gateway.yaml")
    validate(without_rewrite(config), tmp_path / "standalone-gateway-raw.yaml")
    gateway_filters = [
        f["name"] for f in standalone["static_resources"]["listeners"][0]["filter_chains"][0][
            "filters"
        ][0]["typed_config"]["http_filters"]
    ]  # fmt: skip
    listener = "shadow" if template == SHADOW_TEMPLATE else "candidate"
    (chosen,) = [x for x in config["static_resources"]["listeners"] if x["name"] == listener]
    names = [
        f["name"] for f in chosen["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    ]
    assert names == (["shadow.tap"] if template == SHADOW_TEMPLATE else []) + gateway_filters


def test_the_rewrite_sits_after_the_tap_on_the_candidate_side(qwen_policy: GatewayPolicy) -> None:
    for template, listener in ((SHADOW_TEMPLATE, "shadow"), (REVERSE_TEMPLATE, "candidate")):
        config = render_shadow(load_template(template), shadow_settings(), qwen_policy)
        (chosen,) = [x for x in config["static_resources"]["listeners"] if x["name"] == listener]
        names = [
            f["name"]
            for f in chosen["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
        ]
        # single-filter.yaml's one gateway filter: the server sets the canonical path.
        expected = ["shadow.tap", "envoy.filters.http.ext_proc", "envoy.filters.http.router"]
        assert names == (expected if template == SHADOW_TEMPLATE else expected[1:])


def test_the_noise_replica_gets_every_shadowed_request_when_given(
    qwen_policy: GatewayPolicy,
) -> None:
    settings = shadow_settings(percent=30, noise=Upstream.from_url("http://legacy-2:8000"))
    config = render_shadow(load_template(SHADOW_TEMPLATE), settings, qwen_policy)
    route = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]["route_config"]["virtual_hosts"][0]["routes"][0]
    assert route["match"]["runtime_fraction"]["default_value"]["numerator"] == 30
    noise = route["route"]["request_mirror_policies"][1]
    assert noise["runtime_fraction"]["default_value"]["numerator"] == 100  # all shadowed ones
    with pytest.raises(ValueError):
        render_shadow(load_template(SHADOW_TEMPLATE), shadow_settings(percent=101), qwen_policy)


# --------------------------------------------------------------------------- services, in-process


async def _tap(port: int, role: str, messages: list[Any]) -> None:
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(
            "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
            request_serializer=ep.ProcessingRequest.SerializeToString,
            response_deserializer=ep.ProcessingResponse.FromString,
        )(metadata=(("x-shadow-role", role),))
        try:
            for message in messages:
                await call.write(message)
            await call.done_writing()
            async for _ in call:  # observability mode: the comparator never answers
                raise AssertionError("the tap answered")
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            # The comparator may end a stream early (as Envoy allows it to): a write
            # after its OK finds the RPC finished.
            pass


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


async def test_one_comparator_pairs_tap_streams_and_serves_summary_and_metrics() -> None:
    """Baseline and candidate halves over gRPC tap streams; /summary, /metrics and
    /healthz over HTTP (prometheus_client's WSGI app and the summary next to it)."""
    stop = asyncio.Event()
    ready: asyncio.Future[tuple[int, int | None]] = asyncio.get_running_loop().create_future()
    options = CompareOptions(listen="127.0.0.1:0", http="127.0.0.1:0", grace_seconds=0.1)
    server = asyncio.create_task(
        serve_compare(options, stop=stop, on_ready=lambda g, h: ready.set_result((g, h)))
    )
    try:
        grpc_port, http_port = await asyncio.wait_for(ready, 10)
        vectors = unit_rows(2)
        n = 12
        for i in range(n):
            messages = envoy_messages(request(), 200, body(vectors))
            messages[0] = ep.ProcessingRequest(request_headers=headers(x_request_id=f"id-{i}"))
            await _tap(grpc_port, "baseline", messages)
            await _tap(grpc_port, "candidate", messages)
        await _tap(grpc_port, "nobody", envoy_messages(request(), 200, b"{}"))
        base = f"http://127.0.0.1:{http_port}"
        summary: dict[str, Any] = {}
        for _ in range(100):
            status, raw = await asyncio.to_thread(_get, f"{base}/summary")
            assert status == 200
            summary = orjson.loads(raw)
            if summary["pairs"] == n:
                break
            await asyncio.sleep(0.05)
        assert summary["pairs"] == n and summary["pending_halves"] == 0
        assert summary["tap_problems"] == {"no_role": 1}
        assert summary["verdict"]["verdict"] == "ready"
        status, metrics = await asyncio.to_thread(_get, f"{base}/metrics")
        assert status == 200 and b'extproc_shadow_pairs_total{baseline_class="2xx"' in metrics
        assert b'extproc_shadow_halves_total{role="candidate"} 12.0' in metrics
        assert await asyncio.to_thread(_get, f"{base}/healthz") == (200, b"ok\n")
        assert (await asyncio.to_thread(_get, f"{base}/nope"))[0] == 404
    finally:
        stop.set()
        await asyncio.wait_for(server, 20)


# --------------------------------------------------------------------------- rerank pairs

TEI_ANSWER = b'[{"index": 1, "score": 0.9}, {"index": 0, "score": 0.2}]'


def tei_routes() -> Routes:
    """The routes of a policy with a TEI reranker (at TEI's ``/rerank``)."""
    text = SHIPPED_QWEN_POLICY.read_text(encoding="utf-8")
    text += "rerankers:\n  - {name: r, dialect: TEI, upstream: {kind: vllm}}\n"
    return routes_of(load_policy_text(text, source="policy.yaml"))


TEI_ROUTES = tei_routes()


def rerank_half(answer: bytes, *, role: Role, status: int = 200, path: str = "/rerank") -> Half:
    raw = RawHalf(role, "r1", b'{"query": "q", "texts": ["a", "b"]}', status, answer, 0.01)
    return extract_half(RawHalf(**{**vars(raw), "path": path}), TEI_ROUTES)


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/rerank", InputKind.RERANK),  # the policy's TEI route
        ("//rerank?x=1", InputKind.RERANK),  # as Envoy's routes compare it
        ("/v2/rerank", InputKind.RERANK),  # a mesh's rerank path no entry covers
        ("/scores", InputKind.DOCUMENT),  # no route, no mesh's rerank path
        ("/v1/embeddings", InputKind.DOCUMENT),
        ("/embeddings?api-version=1", InputKind.DOCUMENT),
        ("", InputKind.DOCUMENT),  # a tap that sent no path: the embeddings endpoint's
    ],
)
def test_a_tapped_path_the_policy_routes_to_a_rerank_dialect_is_a_rerank_half(
    path: str, kind: InputKind
) -> None:
    made = rerank_half(TEI_ANSWER, role=Role.BASELINE, path=path)
    assert made.kind is kind
    if kind is InputKind.RERANK:
        assert made.rerank is not None and made.rerank.answer is not None
        assert made.rerank.dialect == "tei"
        assert made.rerank.answer.order == (1, 0) and not made.answer.problem


def test_a_rerank_half_is_read_in_its_routes_dialect_only() -> None:
    """A Cohere answer on the TEI route is no TEI answer; on a mesh path no entry
    covers, it is read in whichever dialect answers."""
    cohere = b'{"meta": {}, "results": [{"index": 0, "relevance_score": 0.5}]}'
    routed = rerank_half(cohere, role=Role.CANDIDATE).rerank
    assert routed is not None and routed.answer is None and routed.dialect == "tei"
    assert routed.said == "200, no tei answer"
    unrouted = rerank_half(cohere, role=Role.CANDIDATE, path="/v1/rerank").rerank
    assert unrouted is not None and unrouted.answer is not None
    assert unrouted.dialect == "cohere_v1"


def test_the_tap_stream_keeps_the_path() -> None:
    stream = TapStream(Role.BASELINE, max_body_bytes=1 << 20)
    raws = [stream.feed(m, 0) for m in envoy_messages(request(), 200, body(unit_rows(1)))]
    assert raws[-1] is not None and raws[-1].path == "/"


@pytest.mark.parametrize(
    ("candidate", "status", "difference"),
    [
        (TEI_ANSWER, 200, None),
        (b'[{"index": 0, "score": 0.95}, {"index": 1, "score": 0.2}]', 200, "another order"),
        (b'[{"index": 1, "score": 0.7}, {"index": 0, "score": 0.2}]', 200, "scores differ"),
        (b'{"results": [{"index": 1, "relevance_score": 0.9}]}', 200, "results"),
        (b'{"error": {"message": "no", "type": "x", "param": null, "code": 404}}', 404, "status"),
    ],
)
def test_rerank_pairs_are_compared_whole_tallied_and_judged(
    candidate: bytes, status: int, difference: str | None
) -> None:
    pair = compare_pair(
        rerank_half(TEI_ANSWER, role=Role.BASELINE),
        rerank_half(candidate, role=Role.CANDIDATE, status=status),
    )
    assert pair.rerank is not None and pair.rerank_mismatch == (difference is not None)
    tally = Tally()
    tally.add_pair(pair)
    summary = summarize(tally)
    rerank = summary["rerank"]
    assert rerank["pairs"] == 1 and rerank["same"] == (difference is None)
    assert rerank["differences"] == ({difference: 1} if difference else {})
    assert summary["inputs"]["document"]["requests"] == 0  # not counted as embeddings
    (check,) = [c for c in judge(summary).checks if c.name == "rerank answers"]
    assert check.ok == (difference is None), check
    if difference:
        assert rerank["examples"][0]["request_id"] == "r1"
        assert "## Reranking" in render_report(summary)


def test_without_rerank_pairs_the_verdict_has_no_rerank_check() -> None:
    summary = summarize(Tally())
    assert all(c.name != "rerank answers" for c in judge(summary).checks)


@pytest.mark.parametrize("template", [SHADOW_TEMPLATE, REVERSE_TEMPLATE], ids=["A", "B"])
@pytest.mark.parametrize("legacy", [None, "http://legacy.example:9000"], ids=["", "legacy"])
def test_a_rerank_candidate_shadows_the_policys_rerank_paths(
    template: Path, legacy: str | None, qwen_policy: GatewayPolicy, tmp_path: Path
) -> None:
    """The clients' listener taps and mirrors the policy's rerank paths (the same share);
    the gateway's listener sends them to the candidate's reranker; the legacy side is the
    legacy server given, else the baseline."""
    text = SHIPPED_QWEN_POLICY.read_text(encoding="utf-8")
    text += "rerankers:\n  - {name: r, dialect: TEI, upstream: {kind: vllm}}\n"
    policy = load_policy_text(text, source="policy.yaml")
    settings = shadow_settings(
        rerank_candidate=Upstream.from_url("http://reranker.example:8002"),
        legacy=Upstream.from_url(legacy) if legacy else None,
    )
    config = render_shadow(load_template(template), settings, policy)
    validate(config, tmp_path / "rerank.yaml")
    listeners = {item["name"]: item for item in config["static_resources"]["listeners"]}
    routes = {r["name"]: r for r in hcm_routes(hcm_of(listeners["primary"]))}
    shadowed = routes["rerank-shadowed"]
    reverse = template == REVERSE_TEMPLATE
    legacy_side = "legacy" if legacy else "baseline"
    assert shadowed["route"]["cluster"] == ("candidate_gateway" if reverse else legacy_side)
    assert shadowed["route"]["request_mirror_policies"] == [{"cluster": "shadow_listener"}]
    assert shadowed["match"]["runtime_fraction"]["runtime_key"] == "shadow.percent"
    assert "typed_per_filter_config" not in shadowed  # tapped
    names = list(routes)
    assert names.index("rerank-shadowed") == names.index("passthrough") - 1
    gateway = listeners["candidate" if reverse else "shadow"]
    (rerank,) = [r for r in hcm_routes(hcm_of(gateway)) if r["name"] == "rerank"]
    assert rerank["route"]["cluster"] == "rerank_upstream"
    if reverse:
        (back,) = [r for r in hcm_routes(hcm_of(listeners["shadow"])) if r["name"] == "rerank"]
        assert back["route"]["cluster"] == legacy_side
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    endpoint = clusters["rerank_upstream"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert endpoint["endpoint"]["address"]["socket_address"]["address"] == "reranker.example"


# --------------------------------------------------------------------------- dialect pairs

DIALECTS_POLICY = """
models:
  - name: Qwen/Qwen3-Embedding-0.6B
    preset: qwen3-embedding-0.6b
    upstream: {kind: vllm}
    serves:
      - {dialect: TEI}
      - {dialect: TEI, path: /}
      - {dialect: COHERE_V2}
      - {dialect: OLLAMA_EMBEDDINGS}
"""
DIALECT_ROUTES = routes_of(load_policy_text(DIALECTS_POLICY, source="policy.yaml"))


def dialect_half(path: str, request: bytes, answer: bytes, *, status: int = 200) -> Half:
    raw = RawHalf(Role.BASELINE, "d1", request, status, answer, 0.01, path=path)
    return extract_half(raw, DIALECT_ROUTES, keep_text=True)


@pytest.mark.parametrize(
    ("path", "request_body", "answer", "kind", "inputs"),
    [
        ("/embed", b'{"inputs": ["a", "b"]}', b"[[0.6, 0.8], [1.0, 0.0]]", InputKind.DOCUMENT, 2),
        ("/", b'{"inputs": "a", "prompt_name": "query"}', b"[[0.6, 0.8]]", InputKind.QUERY, 1),
        (
            "/v2/embed",
            b'{"model": "m", "texts": ["a"], "input_type": "search_query"}',
            b'{"id": "x", "response_type": "embeddings_by_type",'
            b' "embeddings": {"float": [[0.6, 0.8]]}, "texts": ["a"],'
            b' "meta": {"billed_units": {"input_tokens": 3}}}',
            InputKind.QUERY,
            1,
        ),
        (
            "/api/embeddings",
            b'{"model": "m", "prompt": "a"}',
            b'{"embedding": [0.6, 0.8]}',
            InputKind.DOCUMENT,
            1,
        ),
    ],
)
def test_a_dialect_half_is_read_in_its_routes_dialect(
    path: str, request_body: bytes, answer: bytes, kind: InputKind, inputs: int
) -> None:
    """A tapped path the policy routes to a dialect of its own shape: the request's
    input and role fields and the answer's vectors read in that dialect."""
    half = dialect_half(path, request_body, answer)
    assert half.kind is kind and half.inputs == inputs and half.texts == ("a", "b")[:inputs]
    assert half.answer.vectors is not None and not half.answer.problem
    assert half.answer.vectors.shape == (inputs, 2)
    if path == "/v2/embed":
        assert half.answer.prompt_tokens == 3


def test_a_dialect_half_in_another_shape_is_unusable() -> None:
    openai = body(unit_rows(1))
    made = dialect_half("/embed", b'{"inputs": "a"}', openai)
    assert made.answer.vectors is None and made.answer.problem == "not a tei answer"
    refused = dialect_half("/embed", b'{"inputs": "a"}', b'{"error": "x"}', status=413)
    assert refused.answer.status == 413 and not refused.answer.problem
    # OpenAI's endpoint is read as before, on a policy with dialects too.
    assert dialect_half("/v1/embeddings", b'{"input": "a"}', openai).answer.vectors is not None


@pytest.mark.parametrize("template", [SHADOW_TEMPLATE, REVERSE_TEMPLATE], ids=["A", "B"])
@pytest.mark.parametrize("legacy", [None, "http://legacy.example:9000"], ids=["", "legacy"])
def test_a_policy_serving_dialects_shadows_their_paths(
    template: Path, legacy: str | None, tmp_path: Path
) -> None:
    """The clients' listener taps and mirrors the paths the models' `serves` add (the
    same share); the gateway's listener sends them through ext_proc to the candidate;
    the legacy side is the legacy server given, else the baseline."""
    policy = load_policy_text(DIALECTS_POLICY, source="policy.yaml")
    settings = shadow_settings(legacy=Upstream.from_url(legacy) if legacy else None)
    config = render_shadow(load_template(template), settings, policy)
    validate(config, tmp_path / "dialects.yaml")
    listeners = {item["name"]: item for item in config["static_resources"]["listeners"]}
    routes = {r["name"]: r for r in hcm_routes(hcm_of(listeners["primary"]))}
    shadowed = routes["dialects-shadowed"]
    pattern = re.compile(shadowed["match"]["safe_regex"]["regex"])
    for path in ("/embed", "/", "/v2/embed", "/api/embeddings"):
        assert pattern.fullmatch(path), path
    for path in ("/v1/embeddings", "/v1/embed", "/api/embed", "/health"):
        assert not pattern.fullmatch(path), path
    reverse = template == REVERSE_TEMPLATE
    legacy_side = "legacy" if legacy else "baseline"
    assert shadowed["route"]["cluster"] == ("candidate_gateway" if reverse else legacy_side)
    assert shadowed["route"]["request_mirror_policies"] == [{"cluster": "shadow_listener"}]
    assert shadowed["match"]["runtime_fraction"]["runtime_key"] == "shadow.percent"
    assert "typed_per_filter_config" not in shadowed  # tapped
    names = list(routes)
    assert names.index("dialects-shadowed") == names.index("passthrough") - 1
    gateway = listeners["candidate" if reverse else "shadow"]
    (dialects,) = [r for r in hcm_routes(hcm_of(gateway)) if r["name"] == "dialects"]
    assert dialects["route"]["cluster"] == "candidate"
    assert dialects["match"]["safe_regex"] == shadowed["match"]["safe_regex"]
    tap = dialects["typed_per_filter_config"].get("shadow.tap", {})
    assert not tap.get("disabled"), tap  # the candidate's half is tapped
    if reverse:
        (back,) = [r for r in hcm_routes(hcm_of(listeners["shadow"])) if r["name"] == "dialects"]
        assert back["route"]["cluster"] == legacy_side


def test_a_policy_without_dialects_shadows_no_dialect_path(qwen_policy: GatewayPolicy) -> None:
    for template in (SHADOW_TEMPLATE, REVERSE_TEMPLATE):
        config = render_shadow(load_template(template), shadow_settings(), qwen_policy)
        for listener in config["static_resources"]["listeners"]:
            names = {r["name"] for r in hcm_routes(hcm_of(listener))}
            assert not names & {"dialects-shadowed", "dialects"}, names
