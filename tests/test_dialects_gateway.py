"""Every embeddings dialect end to end through the real gateway (`extproc run`: Envoy +
ext_proc) in front of the fake vLLM and the fake Dynamo, spoken by its own clients
where one exists (huggingface_hub's InferenceClient, the cohere and ollama SDKs):
the vectors the upstream gives for the same tokens, in each client's shape, its
quantised types, its errors as the client raises them, and a policy that serves no
dialect path leaving those paths to the legacy server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import cohere
import numpy as np
import ollama
import orjson
import pytest
from huggingface_hub import InferenceClient

from extproc.commands import probe as probe_command
from extproc.commands.cli import _parser
from testing_support.fake_upstream import FakeUpstream, pooled
from testing_support.gateway import Gateway, GatewaySpec
from testing_support.http import http
from testing_support.qwen import QWEN_MODEL
from tests.fake_legacy import FakeLegacy
from tests.harness import Gateways

MAX_TOKENS = 64
QUERY_PROMPT = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)
TEXTS = ["the river runs past the stone house", "a boat on the water"]


def policy(kind: str) -> str:
    return f"""
models:
  - name: {QWEN_MODEL}
    preset: qwen3-embedding-0.6b
    max_tokens: {MAX_TOKENS}
    encoding_profile: LEGACY
    upstream: {{kind: {kind}}}
    other_names: [qwen3]
    quantization: {{scaling: SYMMETRIC}}
    matryoshka: {{min_dimensions: 32}}
    serves:
      - dialect: TEI
      - dialect: TEI
        path: /
      - dialect: COHERE_V1
      - dialect: COHERE_V2
      - dialect: OLLAMA
      - dialect: OLLAMA_EMBEDDINGS
      - dialect: JINA
"""


@pytest.fixture(scope="module", params=["vllm", "dynamo"])
def served(
    request: pytest.FixtureRequest, gateways: Gateways, qwen_dir: Any
) -> Iterator[tuple[Gateway, FakeUpstream]]:
    kind = request.param
    with (
        FakeUpstream(flavour=kind, tokenizer_dir=qwen_dir) as upstream,
        gateways.own(GatewaySpec(upstream.url, policy=policy(kind))) as gateway,
    ):
        yield gateway, upstream


def vectors(upstream: FakeUpstream, texts: list[str], prompt: str = "") -> np.ndarray:
    return np.stack([upstream.embed_ids(upstream.tokenize(prompt + t)) for t in texts])


def same(got: Any, expected: np.ndarray) -> None:
    assert np.array_equal(np.asarray(got, dtype=np.float32), expected)


def test_tei_through_huggingface_hub(served: tuple[Gateway, FakeUpstream]) -> None:
    gateway, upstream = served
    with InferenceClient(base_url=gateway.url) as client:
        _tei_through(client, gateway, upstream)


def _tei_through(client: InferenceClient, gateway: Gateway, upstream: FakeUpstream) -> None:
    same(client.feature_extraction(TEXTS), vectors(upstream, TEXTS))
    same(
        client.feature_extraction(TEXTS[0], prompt_name="query"),
        vectors(upstream, TEXTS[:1], QUERY_PROMPT),
    )
    reply = http("POST", f"{gateway.url}/embed", {"inputs": TEXTS[0]})
    assert reply.status == 200
    same(orjson.loads(reply.body), vectors(upstream, TEXTS[:1]))


def test_tei_normalize_false_and_its_errors(served: tuple[Gateway, FakeUpstream]) -> None:
    gateway, upstream = served
    raw = http("POST", f"{gateway.url}/embed", {"inputs": [TEXTS[0]], "normalize": False})
    if upstream.flavour == "vllm":
        ids = upstream.tokenize(TEXTS[0])
        same(orjson.loads(raw.body), pooled(upstream.embed_ids(ids), ids)[None, :])
    else:  # Dynamo has no switch for it: the client hears so, in TEI's words
        assert raw.status == 422 and list(orjson.loads(raw.body)) == ["error", "error_type"]
    long = http("POST", f"{gateway.url}/embed", {"inputs": "w " * 100, "truncate": False})
    assert long.status == 413
    assert orjson.loads(long.body)["error_type"] == "Validation"
    for empty in ([], "", ["a", ""]):  # TEI: 400, "Empty", as its router answers
        reply = http("POST", f"{gateway.url}/embed", {"inputs": empty})
        assert reply.status == 400, (empty, reply.body)
        assert orjson.loads(reply.body)["error_type"] == "Empty", reply.body


def test_ollama_without_input_is_answered_as_ollama_does(
    served: tuple[Gateway, FakeUpstream],
) -> None:
    """Ollama loads the model and embeds nothing: an empty answer, and the upstream is
    never asked."""
    gateway, upstream = served
    before = len(upstream.received)
    for body in (
        {"model": "qwen3"},
        {"model": "qwen3", "input": []},
        {"model": "qwen3", "input": ""},
    ):
        reply = http("POST", f"{gateway.url}/api/embed", body)
        assert (reply.status, orjson.loads(reply.body)) == (
            200,
            {"model": "qwen3", "embeddings": []},
        )
    older = http("POST", f"{gateway.url}/api/embeddings", {"model": "qwen3", "prompt": ""})
    assert (older.status, orjson.loads(older.body)) == (200, {"embedding": []})
    unknown = http("POST", f"{gateway.url}/api/embed", {"model": "nope", "input": []})
    assert unknown.status == 404 and list(orjson.loads(unknown.body)) == ["error"]
    assert len(upstream.received) == before


def test_cohere_clients(served: tuple[Gateway, FakeUpstream]) -> None:
    gateway, upstream = served
    documents = vectors(upstream, TEXTS)
    with cohere.Client(base_url=gateway.url, api_key="unused") as v1:
        answer = v1.embed(texts=TEXTS, model="qwen3", input_type="search_document")
    same(answer.embeddings, documents)
    assert answer.texts == TEXTS and answer.meta is not None
    with cohere.ClientV2(base_url=gateway.url, api_key="unused") as v2:
        typed = v2.embed(
            texts=TEXTS,
            model="qwen3",
            input_type="search_query",
            embedding_types=["float", "int8", "ubinary"],
        )
        with pytest.raises(cohere.NotFoundError) as caught:
            v2.embed(
                texts=TEXTS, model="nope", input_type="search_query", embedding_types=["float"]
            )
    queries = vectors(upstream, TEXTS, QUERY_PROMPT)
    same(typed.embeddings.float_, queries)
    assert typed.embeddings.int8 == np.rint(queries * 127).astype(int).tolist()
    assert typed.embeddings.ubinary == np.packbits(queries > 0, axis=1).astype(int).tolist()
    assert list(caught.value.body) == ["message"]


def test_ollama_client(served: tuple[Gateway, FakeUpstream]) -> None:
    gateway, upstream = served
    with ollama.Client(host=gateway.url) as client:
        answer = client.embed(model="qwen3", input=TEXTS)
        older = client.embeddings(model="qwen3", prompt=TEXTS[0])
        with pytest.raises(ollama.ResponseError) as caught:
            client.embed(model="nope", input="x")
    same(answer.embeddings, vectors(upstream, TEXTS))
    assert answer.model == "qwen3" and answer.prompt_eval_count == sum(
        len(upstream.tokenize(t)) for t in TEXTS
    )
    assert answer.total_duration is not None and answer.total_duration > 0
    same(older.embedding, vectors(upstream, TEXTS[:1])[0])
    assert caught.value.status_code == 404


def test_jina_and_openai_clients_share_the_path(served: tuple[Gateway, FakeUpstream]) -> None:
    gateway, upstream = served
    url = f"{gateway.url}/v1/embeddings"
    jina = {"model": "qwen3", "input": [{"text": TEXTS[0]}], "task": "retrieval.query"}
    reply = http("POST", url, {**jina, "embedding_type": ["float", "binary"]})
    assert reply.status == 200
    (item,) = orjson.loads(reply.body)["data"]
    query = vectors(upstream, TEXTS[:1], QUERY_PROMPT)
    same(item["embedding"]["float"], query[0])
    assert item["embedding"]["binary"] == (np.packbits(query[0] > 0).astype(int) - 128).tolist()
    openai = http("POST", url, {"model": QWEN_MODEL, "input": TEXTS})
    assert openai.status == 200
    same([d["embedding"] for d in orjson.loads(openai.body)["data"]], vectors(upstream, TEXTS))


def test_paths_no_policy_serves_stay_the_legacy_servers(gateways: Gateways, qwen_dir: Any) -> None:
    with (
        FakeUpstream(flavour="dynamo", tokenizer_dir=qwen_dir) as upstream,
        FakeUpstream(flavour="vllm", tokenizer_dir=qwen_dir) as legacy,
    ):
        plain = policy("dynamo").split("    serves:")[0]
        spec = GatewaySpec(upstream.url, policy=plain, legacy=legacy.url)
        with gateways.own(spec) as gateway:
            reply = http("POST", f"{gateway.url}/embed", {"inputs": "x"})
            # The legacy stand-in serves no /embed: its 404 came back, untouched.
            assert reply.status == 404
            assert [r.path for r in legacy.received] == ["/embed"]
            assert not upstream.received


def test_probe_speaks_the_legacy_servers_dialect(
    served: tuple[Gateway, FakeUpstream], qwen_dir: Any, tmp_path: Any
) -> None:
    """`probe --dialect tei` asks a TEI legacy server and the gateway serving TEI at
    /embed, as TEI's clients do: the same vectors for every document and query; the
    rows TEI's clients cannot say (base64, instruction) are no rows."""
    gateway, _ = served
    legacy = FakeLegacy(
        served_model=QWEN_MODEL, tokenizer_dir=qwen_dir, max_tokens=MAX_TOKENS, dialects=("tei",)
    )
    with legacy:
        argv = ["probe", "--baseline", legacy.url, "--candidate", gateway.url, "--quick"]
        args = _parser().parse_args([*argv, "--dialect", "tei", "--out", str(tmp_path)])
        probe_command.run(args)
    report = orjson.loads((tmp_path / "report.json").read_bytes())
    parity = report["parity"]
    assert parity["documents"]["spread"]["min"] == pytest.approx(1.0, abs=1e-6), parity
    assert parity["queries"]["spread"]["min"] == pytest.approx(1.0, abs=1e-6), parity
    keys = {row["key"] for row in report["contract"]}
    assert keys and all(k.startswith("tei:") for k in keys), keys
    assert "tei:base64" not in keys and "tei:instruction" not in keys
    assert "tei:input_type_query" in keys
    # every request the legacy server got was TEI's (at /embed), none OpenAI's; the
    # malformed JSON row goes as it is
    docs = [orjson.loads(body) for body in legacy.received if body.endswith(b"}")]
    assert docs and all("inputs" in doc and "input" not in doc for doc in docs), docs[:3]
