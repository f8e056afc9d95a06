"""A model whose upstream cuts Matryoshka vectors itself (``upstream.native.dimensions``).

The request side validates ``dimensions`` exactly as for an emulating policy and then
forwards it, so the plan has no response work: one ext_proc message per valid request.
The unit half compares the two policies on the same bodies; the gateway half runs a real
Envoy and the real ext_proc server in front of the fake upstream in vLLM mode started
Matryoshka, and counts Envoy's ext_proc messages.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from extproc.core.api_errors import ApiError
from extproc.core.contract import Contract
from extproc.core.plan import Encoding, ResponsePlan
from extproc.core.policy import load_policy_text
from extproc.core.request_rewrite import Forward, rewrite_request
from extproc.core.response_rewrite import rewrite_response
from extproc.service.contract_loading import load_contract
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import Gateway, GatewaySpec
from testing_support.http import http, metric_value
from testing_support.qwen import SHIPPED_QWEN_POLICY
from tests.harness import Gateways

MODEL = "Qwen/Qwen3-Embedding-0.6B"
SHIPPED_DYNAMO_MATRYOSHKA_POLICY = SHIPPED_QWEN_POLICY.with_name(
    "qwen3-embedding-0.6b-dynamo-matryoshka.yaml"
)
NATIVE = 1024
DOCS = ["The harbour lights flickered.", "A ferry crossed the bay at dusk."]


def policy_yaml(
    *, native: bool, profile: str = "LEGACY", check: bool = False, truncate: bool = True
) -> str:
    declared = ", native: {dimensions: true}" if native else ""
    if not truncate:
        declared = ", native: {truncate_prompt_tokens: false}"
    return (
        "models:\n"
        f"  - name: {MODEL}\n"
        "    preset: qwen3-embedding-0.6b\n"
        "    max_tokens: 1024\n"
        f"    encoding_profile: {profile}\n"
        f"    check_responses: {str(check).lower()}\n"
        f"    upstream: {{kind: vllm{declared}}}\n"
    )


def contract(
    qwen_dir: Path, *, native: bool, profile: str = "LEGACY", check: bool = False
) -> Contract:
    text = policy_yaml(native=native, profile=profile, check=check)
    return load_contract(load_policy_text(text, tokenizer_overrides={MODEL: qwen_dir}))


@pytest.fixture(scope="module")
def native(qwen_dir: Path) -> Contract:
    return contract(qwen_dir, native=True)


@pytest.fixture(scope="module")
def emulated(qwen_dir: Path) -> Contract:
    return contract(qwen_dir, native=False)


@pytest.fixture(scope="module")
def native_openai(qwen_dir: Path) -> Contract:
    return contract(qwen_dir, native=True, profile="OPENAI")


def run(body: Mapping[str, Any], on: Contract) -> Forward:
    return rewrite_request(orjson.dumps(body), on.policy, on.tokenizers, clock=time.monotonic)


def sent(forward: Forward, body: Mapping[str, Any]) -> dict[str, Any]:
    """What the upstream receives: the rewritten body, or the client's as sent."""
    if forward.upstream_body is None:
        return dict(body)
    doc = orjson.loads(forward.upstream_body)
    assert isinstance(doc, dict)
    return doc


# -- the plan --------------------------------------------------------------------


def test_declared_capability_reaches_the_model(native: Contract, emulated: Contract) -> None:
    assert native.policy.models[MODEL].upstream.native.dimensions
    assert not emulated.policy.models[MODEL].upstream.native.dimensions


def test_shipped_dynamo_matryoshka_policy_is_the_legacy_contract_plus_the_declaration(
    qwen_dir: Path,
) -> None:
    """The compose and Kubernetes policy differs from `extproc run`'s default (which
    emulates the cut) only in what its Dynamo worker does: same model, prompts,
    limits, Matryoshka range and encoding profile."""
    shipped = {
        path.name: load_contract(
            load_policy_text(path.read_text(), tokenizer_overrides={MODEL: qwen_dir})
        )
        for path in (SHIPPED_QWEN_POLICY, SHIPPED_DYNAMO_MATRYOSHKA_POLICY)
    }
    emulating = shipped[SHIPPED_QWEN_POLICY.name].policy.models[MODEL]
    matryoshka = shipped[SHIPPED_DYNAMO_MATRYOSHKA_POLICY.name].policy.models[MODEL]
    assert (emulating.upstream.kind, matryoshka.upstream.kind) == ("dynamo", "dynamo")
    assert not emulating.upstream.native.dimensions
    assert matryoshka.upstream.native.dimensions
    assert dataclasses.replace(matryoshka, upstream=emulating.upstream) == emulating
    body = {"model": MODEL, "input": DOCS, "input_type": "query", "dimensions": 256}
    forward = run(body, shipped[SHIPPED_DYNAMO_MATRYOSHKA_POLICY.name])
    assert sent(forward, body)["dimensions"] == 256 and not forward.plan.needs_response
    cut = run(body, shipped[SHIPPED_QWEN_POLICY.name])
    assert "dimensions" not in sent(cut, body) and cut.plan.needs_response
    # The same prompt reaches the model either way.
    assert sent(forward, body)["input"] == sent(cut, body)["input"]


@pytest.mark.parametrize("dimensions", [32, 256, 1023])
def test_dimensions_forwarded_and_no_response_work(
    native: Contract, emulated: Contract, dimensions: int
) -> None:
    body = {"model": MODEL, "input": DOCS, "dimensions": dimensions}
    forward = run(body, native)
    # Nothing else to change: the client's bytes go upstream as sent.
    assert forward.upstream_body is None
    assert sent(forward, body)["dimensions"] == dimensions
    assert forward.plan.dimensions is None
    assert not forward.plan.needs_response
    assert not forward.stats.dimensions_emulated
    assert forward.stats.fields_stripped == 0
    # The same request on an emulating policy strips the field and cuts the answer.
    cut = run(body, emulated)
    assert "dimensions" not in sent(cut, body)
    assert cut.plan.dimensions == dimensions and cut.plan.needs_response


@pytest.mark.parametrize("spelling", ["256", 256.0, " 256 "])
def test_lenient_spelling_is_forwarded_as_the_integer(native: Contract, spelling: Any) -> None:
    body = {"model": MODEL, "input": DOCS, "dimensions": spelling}
    forward = run(body, native)
    assert forward.upstream_body is not None
    assert sent(forward, body)["dimensions"] == 256
    assert type(sent(forward, body)["dimensions"]) is int
    assert not forward.plan.needs_response


def test_query_prompt_still_applied_with_dimensions_forwarded(native: Contract) -> None:
    body = {"model": MODEL, "input": "capital of France?", "input_type": "query", "dimensions": 256}
    forward = run(body, native)
    doc = sent(forward, body)
    assert doc["dimensions"] == 256
    assert "input_type" not in doc
    assert doc["input"][0].startswith("Instruct: ")
    assert forward.stats.fields_stripped == 1
    assert not forward.plan.needs_response


def test_native_size_is_stripped_not_forwarded(native: Contract) -> None:
    """A request for the native size needs no cut: it is stripped as on every policy,
    so an upstream started without Matryoshka never sees it."""
    body = {"model": MODEL, "input": DOCS, "dimensions": NATIVE}
    forward = run(body, native)
    assert "dimensions" not in sent(forward, body)
    assert not forward.plan.needs_response


def test_legacy_profile_asks_the_upstream_for_floats(native: Contract) -> None:
    """The legacy contract answers float arrays whatever the client asked: the upstream
    is asked for floats, so its answer goes back untouched."""
    body = {"model": MODEL, "input": DOCS, "dimensions": 256, "encoding_format": "base64"}
    forward = run(body, native)
    doc = sent(forward, body)
    assert "encoding_format" not in doc and doc["dimensions"] == 256
    assert forward.plan.client_encoding is forward.plan.upstream_encoding is Encoding.FLOAT
    assert not forward.plan.needs_response


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_openai_profile_forwards_the_clients_encoding(
    native_openai: Contract, encoding: str
) -> None:
    body = {"model": MODEL, "input": DOCS, "dimensions": 64, "encoding_format": encoding}
    forward = run(body, native_openai)
    assert forward.upstream_body is None
    assert forward.plan.upstream_encoding is Encoding(encoding)
    assert not forward.plan.needs_response


def upstream_answer(count: int, width: int) -> bytes:
    rows = np.eye(count, width, dtype=np.float32)  # unit vectors
    data = [
        {"object": "embedding", "index": i, "embedding": r.tolist()} for i, r in enumerate(rows)
    ]
    usage = {"prompt_tokens": count, "total_tokens": count}
    return orjson.dumps({"object": "list", "data": data, "model": MODEL, "usage": usage})


def test_checked_answers_are_read_at_the_forwarded_width(qwen_dir: Path) -> None:
    """With check_responses the answer is still read, against the size asked for."""
    checked = contract(qwen_dir, native=True, check=True)
    body = {"model": MODEL, "input": DOCS, "dimensions": 256}
    plan = run(body, checked).plan
    assert plan.needs_response and not plan.rewrites_vectors
    assert plan.native_dimensions == 256
    assert ResponsePlan.from_json(plan.to_json()) == plan
    assert rewrite_response(plan, 200, upstream_answer(len(DOCS), 256)) is None
    # The upstream ignored `dimensions`: whole vectors are not what was asked.
    wrong = rewrite_response(plan, 200, upstream_answer(len(DOCS), NATIVE))
    assert wrong is not None and wrong.status == 502


@pytest.mark.parametrize("dimensions", [0, 31, 1025, -1, "256.5", 256.5, True])
def test_invalid_dimensions_get_the_same_400(
    native: Contract, emulated: Contract, dimensions: Any
) -> None:
    body = {"model": MODEL, "input": DOCS, "dimensions": dimensions}
    errors = []
    for on in (native, emulated):
        with pytest.raises(ApiError) as caught:
            run(body, on)
        errors.append(caught.value)
    a, b = errors
    assert a.status == b.status == 400
    assert a.envelope() == b.envelope()
    assert a.param == "dimensions"


def test_gateway_truncation_kept_with_dimensions_forwarded(
    native: Contract, emulated: Contract
) -> None:
    """The gateway's own token-id truncation is unchanged (docs/upstreams.md says why
    forwarding `truncate_prompt_tokens` cannot replace it)."""
    long_text = "a" + " a" * 3000
    body = {"model": MODEL, "input": [long_text, "short"], "dimensions": 128}
    on_native, on_emulated = run(body, native), run(body, emulated)
    doc = sent(on_native, body)
    assert doc["input"] == sent(on_emulated, body)["input"]
    assert isinstance(doc["input"][0], list) and len(doc["input"][0]) == 1024
    assert "truncate_prompt_tokens" not in doc
    assert on_native.stats.truncated_inputs == on_emulated.stats.truncated_inputs == 1


@pytest.mark.parametrize("value", [-1, 100])
def test_truncate_prompt_tokens_is_forwarded_only_where_the_upstream_applies_it(
    qwen_dir: Path, emulated: Contract, value: int
) -> None:
    """vLLM and Dynamo apply it (their adapters' default): forwarded. A policy that
    says its upstream cannot: a 400 naming the field, never forwarded to be ignored."""
    body = {"model": MODEL, "input": DOCS, "truncate_prompt_tokens": value}
    assert sent(run(body, emulated), body)["truncate_prompt_tokens"] == value
    text = policy_yaml(native=False, truncate=False)
    cannot = load_contract(load_policy_text(text, tokenizer_overrides={MODEL: qwen_dir}))
    assert not cannot.policy.models[MODEL].upstream.native.truncate_prompt_tokens
    with pytest.raises(ApiError) as caught:
        run(body, cannot)
    assert (caught.value.status, caught.value.param) == (400, "truncate_prompt_tokens")
    assert "not supported" in caught.value.message
    del body["truncate_prompt_tokens"]
    assert "truncate_prompt_tokens" not in sent(run(body, cannot), body)


# -- through a real Envoy ----------------------------------------------------------

ADMIN = re.compile(r"admin 127\.0\.0\.1:(\d+)")


def msgs_sent(gw: Gateway) -> int:
    """Envoy's count of ext_proc messages sent, summed over the listener's filters."""
    match = ADMIN.search(gw.ready_line)
    assert match, gw.ready_line
    url = f"http://127.0.0.1:{match.group(1)}/stats?format=json&filter=ext_proc.stream_msgs_sent"
    reply = http("GET", url, timeout=5)
    assert reply.status == 200
    return sum(int(s.get("value", 0)) for s in reply.json()["stats"])


@pytest.fixture(scope="module")
def matryoshka_vllm(qwen_dir: Path) -> Iterator[FakeUpstream]:
    with FakeUpstream(flavour="vllm", tokenizer_dir=qwen_dir, is_matryoshka=True) as fake:
        yield fake


def spec(upstream: FakeUpstream, qwen_dir: Path, *, native: bool, shape: str) -> GatewaySpec:
    return GatewaySpec(
        upstream.url,
        shape=shape,
        policy=policy_yaml(native=native),
        tokenizers=f"{MODEL}={qwen_dir}",
    )


# ext_proc messages of a request whose response needs no work: the buffered request
# body alone in standalone.yaml; request headers, body and response headers in the
# one-filter mesh shape (its header comment).
NO_RESPONSE_WORK = {"standalone.yaml": 1, "single-filter.yaml": 3}


@pytest.fixture(scope="module", params=sorted(NO_RESPONSE_WORK))
def gateway_pair(
    request: pytest.FixtureRequest,
    matryoshka_vllm: FakeUpstream,
    qwen_dir: Path,
    gateways: Gateways,
) -> Iterator[tuple[Gateway, Gateway, int]]:
    """(native, emulated, messages of a request with no response work) in front of the
    same upstream, in both shipped Envoy shapes."""
    envoy = str(request.param)
    shape = envoy.removesuffix(".yaml")
    with (
        gateways.own(spec(matryoshka_vllm, qwen_dir, native=True, shape=shape)) as native_gw,
        gateways.own(spec(matryoshka_vllm, qwen_dir, native=False, shape=shape)) as emulated_gw,
    ):
        yield native_gw, emulated_gw, NO_RESPONSE_WORK[envoy]


def vectors(doc: Any) -> np.ndarray[Any, Any]:
    rows = sorted(doc["data"], key=lambda d: d["index"])
    return np.asarray([r["embedding"] for r in rows], dtype=np.float64)


@pytest.mark.parametrize("dimensions", [128, 256])
def test_native_path_one_message_same_vectors(
    gateway_pair: tuple[Gateway, Gateway, int], matryoshka_vllm: FakeUpstream, dimensions: int
) -> None:
    native_gw, emulated_gw, plain = gateway_pair
    body = {"model": MODEL, "input": DOCS, "input_type": "query", "dimensions": dimensions}

    before = msgs_sent(native_gw)
    matryoshka_vllm.reset()
    got = native_gw.embeddings(body)
    assert got.status == 200, got.body
    assert msgs_sent(native_gw) - before == plain
    # The upstream did the cut: it was asked for `dimensions`.
    (received,) = matryoshka_vllm.received
    assert orjson.loads(received.body)["dimensions"] == dimensions

    before = msgs_sent(emulated_gw)
    want = emulated_gw.embeddings(body)
    assert want.status == 200, want.body
    assert msgs_sent(emulated_gw) - before > plain  # the response is read and cut

    a, b = vectors(got.json()), vectors(want.json())
    assert a.shape == b.shape == (len(DOCS), dimensions)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert got.json()["usage"] == want.json()["usage"]


def test_native_path_refuses_like_the_emulated_one(
    gateway_pair: tuple[Gateway, Gateway, int],
) -> None:
    native_gw, emulated_gw, _ = gateway_pair
    body = {"model": MODEL, "input": DOCS, "dimensions": 16}
    before = msgs_sent(native_gw)
    got, want = native_gw.embeddings(body), emulated_gw.embeddings(body)
    assert got.status == want.status == 400
    assert got.json() == want.json()
    assert msgs_sent(native_gw) - before <= 2  # answered from the request phase


# -- a policy reloaded after standalone.yaml's precheck was rendered ----------------------


def ext_proc_counts(gw: Gateway) -> tuple[int, int]:
    """(streams started, messages sent) by the listener's ext_proc filters."""
    match = ADMIN.search(gw.ready_line)
    assert match, gw.ready_line
    url = f"http://127.0.0.1:{match.group(1)}/stats?format=json&filter=ext_proc"
    stats = {s["name"]: int(s.get("value", 0)) for s in http("GET", url).json()["stats"]}
    return (
        stats.get("http.embeddings.ext_proc.streams_started", 0),
        stats.get("http.embeddings.ext_proc.stream_msgs_sent", 0),
    )


def reload_now(gw: Gateway, path: Path, text: str) -> None:
    """Make ``text`` the running policy: written, SIGHUP, waited for."""

    def reloaded() -> float:
        body = gw.metrics()
        return metric_value(body, "extproc_policy_reloads_total", outcome="reloaded")

    before = reloaded()
    path.write_text(text)
    gw.process.signal(signal.SIGHUP)
    deadline = time.monotonic() + 15
    while reloaded() <= before:
        assert time.monotonic() < deadline, f"no reload within 15 s:\n{gw.log()}"
        time.sleep(0.1)


@pytest.mark.parametrize(
    "started_native", [True, False], ids=["native-then-emulated", "emulated-then-native"]
)
def test_a_stale_precheck_still_gets_the_right_answer(
    started_native: bool,
    matryoshka_vllm: FakeUpstream,
    qwen_dir: Path,
    gateways: Gateways,
    tmp_path: Path,
) -> None:
    """`extproc run` renders the precheck's markers from the policy it starts with. A
    reload that needs another list is served right, only at another cost: a marker
    missing (started native: no precheck at all) sends each cut to the second-stream
    path; a marker no longer needed (started emulated) sends the request to the
    one-stream route, where the server ends the stream after the request reply."""
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(native=started_native))
    started = GatewaySpec(
        matryoshka_vllm.url, policy=path, tokenizers=f"{MODEL}={qwen_dir}"
    )  # a file: reloaded below
    with gateways.own(started) as gw:
        reload_now(gw, path, policy_yaml(native=not started_native))
        body = {"model": MODEL, "input": DOCS, "dimensions": 128}
        for _ in range(3):
            matryoshka_vllm.reset()
            before = ext_proc_counts(gw)
            reply = gw.embeddings(body)
            streams, messages = (a - b for a, b in zip(ext_proc_counts(gw), before, strict=True))
            assert reply.status == 200, reply.body
            got = vectors(reply.json())
            assert got.shape == (len(DOCS), 128)
            np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
            (received,) = matryoshka_vllm.received
            forwarded = orjson.loads(received.body).get("dimensions")
            if started_native:  # now emulated, no marker: the gateway cut, on two streams
                assert forwarded is None
                assert (streams, messages) == (2, 2)
            else:  # now native, an extra marker: the upstream cut, on one stream
                assert forwarded == 128
                assert streams == 1 and messages in (1, 2)
