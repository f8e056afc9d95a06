"""The embeddings dialects end to end on the real upstreams: the gateway (`extproc run`:
Envoy + ext_proc) in front of real vLLM and real Dynamo, with a MiniLM policy that
serves TEI, Cohere v1 and v2, and Ollama's two routes, and a real legacy server
speaking those dialects over the same weights (tests/e2e/legacy_dialects_app.py).
The official clients, unchanged (huggingface_hub's InferenceClient, the cohere and
ollama SDKs), call both and must get the same: vectors (cosine >= 0.9995 a row, norms
within 1e-3), quantised types (bits equal but where a component is near 0, int8 and
uint8 within one level), token counts, and errors as each client raises them (type,
status, the error body's keys). Ollama's older route unnormalised (``normalized:
false``) is vLLM's alone: a Dynamo policy with it is refused."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cohere
import numpy as np
import ollama
import pytest
from cohere.core.api_error import ApiError
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError

from testing_support.gateway import Gateway
from testing_support.http import http
from testing_support.real_upstream import SERVED_MODEL, RealEnv, Stack
from tests.e2e.conftest import minilm
from tests.harness import Gateways

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120.0
MIN_COSINE = 0.9995
NORM_TOLERANCE = 1e-3
NEAR_ZERO = 1e-3  # a component this close to 0 may take either bit
MAX_BITS_PER_ROW = 4  # differing bits allowed a row, all of them near-zero components
LONG_TEXT = " ".join(["the harbour lights flickered as the ferry crossed the bay"] * 40)


def corpus(kind: str) -> list[str]:
    lines = (REPO / "extproc" / "data" / "corpus.jsonl").read_text().splitlines()
    return [row["text"] for row in map(json.loads, lines) if row["kind"] == kind]


TEXTS = [*corpus("document")[:2], corpus("query")[-1]]  # two English passages, a Korean query
# What the comparisons measured: the most differing bits a row (by dialect and
# upstream), the lowest cosine and the largest difference of norms (over all).
MEASURED: dict[str, float] = {}


def policy(kind: str) -> str:
    """extproc/policies/all-minilm-l6-v2.yaml on ``kind``, serving the dialects; the
    older Ollama route unnormalised only where the upstream gives such vectors."""
    older = "      - {dialect: OLLAMA_EMBEDDINGS, normalized: false}\n" if kind == "vllm" else ""
    return f"""
models:
  - name: {SERVED_MODEL}
    preset: all-minilm-l6-v2
    upstream_model: {SERVED_MODEL}
    max_tokens: 256
    native_dimensions: 384
    encoding_profile: OPENAI
    upstream: {{kind: {kind}}}
    quantization: {{scaling: SYMMETRIC}}
    serves:
      - {{dialect: TEI}}
      - {{dialect: TEI, path: /}}
      - {{dialect: COHERE_V1}}
      - {{dialect: COHERE_V2}}
      - {{dialect: OLLAMA}}
{older}"""


@pytest.fixture(scope="session")
def dialects_policy(upstream: Stack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp(f"dialects-{upstream.kind}") / "policy.yaml"
    path.write_text(policy(upstream.kind), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def dialects_gateway(
    upstream: Stack, dialects_policy: Path, env: RealEnv, gateways: Gateways
) -> Gateway:
    return gateways.shared(minilm(upstream, dialects_policy, env))


@pytest.fixture
def both(legacy_dialects: Stack, dialects_gateway: Gateway, upstream: Stack) -> tuple[str, ...]:
    """The legacy server's URL, the gateway's and the upstream's kind."""
    return legacy_dialects.url, dialects_gateway.url, upstream.kind


@pytest.fixture(scope="module", autouse=True)
def report_measured(request: pytest.FixtureRequest) -> Iterator[None]:
    """What the comparisons measured, shown once the module ends (not captured)."""
    yield
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None and MEASURED:
        with capture.global_and_fixture_disabled():
            print(f"\n[dialects] measured: {MEASURED}")


# --- comparing answers ------------------------------------------------------------


def same_vectors(old: Any, new: Any, label: str) -> None:
    a, b = np.asarray(old, dtype=np.float64), np.asarray(new, dtype=np.float64)
    assert a.shape == b.shape, (label, a.shape, b.shape)
    norms_a, norms_b = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    cosine = (a * b).sum(axis=1) / (norms_a * norms_b)
    MEASURED["min cosine"] = min(MEASURED.get("min cosine", 1.0), float(cosine.min()))
    norm_difference = float(np.abs(norms_a - norms_b).max())
    MEASURED["max norm difference"] = max(MEASURED.get("max norm difference", 0.0), norm_difference)
    assert cosine.min() >= MIN_COSINE, (label, cosine.tolist())
    assert np.abs(norms_a - norms_b).max() <= NORM_TOLERANCE, (label, norms_a, norms_b)


def same_bits(old: Any, new: Any, floats: tuple[Any, Any], label: str, *, offset: int = 0) -> None:
    """Packed bits (``offset`` 128 for ``binary``) equal but where either float
    vector's component is within NEAR_ZERO of 0; the most a row differs is recorded."""
    old_floats, new_floats = (np.asarray(f, dtype=np.float64) for f in floats)
    width = old_floats.shape[1]

    def bits(rows: Any) -> np.ndarray:
        packed = (np.asarray(rows, dtype=np.int64) + offset).astype(np.uint8)
        return np.unpackbits(packed, axis=1)[:, :width].astype(bool)

    differ = bits(old) != bits(new)
    near = (np.abs(old_floats) < NEAR_ZERO) | (np.abs(new_floats) < NEAR_ZERO)
    assert not (differ & ~near).any(), (label, np.argwhere(differ & ~near).tolist())
    worst = int(differ.sum(axis=1).max())
    MEASURED[label] = max(MEASURED.get(label, 0), worst)
    assert worst <= MAX_BITS_PER_ROW, (label, worst)


def same_levels(old: Any, new: Any, label: str) -> None:
    a, b = np.asarray(old, dtype=np.int64), np.asarray(new, dtype=np.int64)
    assert a.shape == b.shape, (label, a.shape, b.shape)
    worst = int(np.abs(a - b).max())
    MEASURED["max level difference"] = max(MEASURED.get("max level difference", 0), worst)
    assert worst <= 1, (label, worst)


def raised(call: Callable[[], Any]) -> tuple[Any, ...]:
    """What the client made of the answer: the exception's type, status and error
    body's keys, or ``("answered", <the answer>)``."""
    try:
        answer = call()
    except ApiError as error:
        body = error.body
        keys = sorted(body) if isinstance(body, dict) else type(body).__name__
        return type(error).__name__, error.status_code, keys
    except HfHubHTTPError as error:
        assert error.response is not None
        return type(error).__name__, error.response.status_code, sorted(error.response.json())
    except ollama.ResponseError as error:
        return type(error).__name__, error.status_code
    return "answered", answer


def same_error(old: Callable[[], Any], new: Callable[[], Any], label: str) -> tuple[Any, ...]:
    got_old, got_new = raised(old), raised(new)
    assert got_old[0] != "answered", (label, "the legacy server answered", got_old)
    assert got_old == got_new, (label, got_old, got_new)
    return got_old


def same_raw_error(urls: tuple[str, ...], path: str, body: dict[str, Any], label: str) -> None:
    """The same body posted to both: the same status and error body's keys."""
    old = http("POST", urls[0] + path, body, timeout=TIMEOUT_S)
    new = http("POST", urls[1] + path, body, timeout=TIMEOUT_S)
    assert old.status >= 400, (label, old.status, old.body[:300])
    assert (new.status, sorted(new.json())) == (old.status, sorted(old.json())), (
        label,
        old.status,
        old.body[:300],
        new.status,
        new.body[:300],
    )


# --- the dialects -------------------------------------------------------------------


def test_tei_through_huggingface_hub(both: tuple[str, ...]) -> None:
    legacy_url, gateway_url, kind = both
    with (
        InferenceClient(base_url=legacy_url, timeout=TIMEOUT_S) as old,
        InferenceClient(base_url=gateway_url, timeout=TIMEOUT_S) as new,
    ):
        same_vectors(old.feature_extraction(TEXTS), new.feature_extraction(TEXTS), "tei: batch")
        one_old, one_new = old.feature_extraction(TEXTS[2]), new.feature_extraction(TEXTS[2])
        assert one_old.shape == one_new.shape == (1, 384)
        same_vectors(one_old, one_new, "tei: one string")
        for side in ("right", "left"):
            same_vectors(
                old.feature_extraction(LONG_TEXT, truncate=True, truncation_direction=side),
                new.feature_extraction(LONG_TEXT, truncate=True, truncation_direction=side),
                f"tei: long, cut on the {side}",
            )
        if kind == "vllm":  # Dynamo has no switch for the pooled vectors
            same_vectors(
                old.feature_extraction(TEXTS, normalize=False),
                new.feature_extraction(TEXTS, normalize=False),
                "tei: normalize false",
            )
    # The same through TEI's own path.
    body = {"inputs": TEXTS[:2]}
    old_embed = http("POST", f"{legacy_url}/embed", body, timeout=TIMEOUT_S)
    new_embed = http("POST", f"{gateway_url}/embed", body, timeout=TIMEOUT_S)
    assert old_embed.status == new_embed.status == 200, new_embed.body[:300]
    same_vectors(old_embed.json(), new_embed.json(), "tei: /embed")
    with (
        InferenceClient(base_url=legacy_url, timeout=TIMEOUT_S) as old,
        InferenceClient(base_url=gateway_url, timeout=TIMEOUT_S) as new,
    ):
        error = same_error(
            lambda: old.feature_extraction(LONG_TEXT, truncate=False),
            lambda: new.feature_extraction(LONG_TEXT, truncate=False),
            "tei: long, truncate false",
        )
        assert error[1:] == (413, ["error", "error_type"])
        # TEI refuses no inputs as `"error_type": "Empty"`, a 400 (BadRequestError).
        error = same_error(
            lambda: old.feature_extraction([]),
            lambda: new.feature_extraction([]),
            "tei: no inputs",
        )
        assert error == ("BadRequestError", 400, ["error", "error_type"])


# The SDK's own merge of by-type answers (cohere.utils) calls pydantic APIs pydantic
# deprecates (`parse_obj`, `model_fields` off an instance): the client's warnings.
@pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecationWarning")
def test_cohere_v1_client(both: tuple[str, ...]) -> None:
    legacy_url, gateway_url, kind = both
    with (
        cohere.Client(base_url=legacy_url, api_key="x", timeout=TIMEOUT_S) as old,
        cohere.Client(base_url=gateway_url, api_key="x", timeout=TIMEOUT_S) as new,
    ):

        def embed(client: cohere.Client, **kwargs: Any) -> Any:
            return client.embed(model=SERVED_MODEL, input_type="search_document", **kwargs)

        plain_old, plain_new = embed(old, texts=TEXTS), embed(new, texts=TEXTS)
        assert plain_old.response_type == plain_new.response_type == "embeddings_floats"
        same_vectors(plain_old.embeddings, plain_new.embeddings, "cohere v1: floats")
        assert plain_new.texts == TEXTS
        assert plain_new.meta is not None and plain_old.meta is not None
        assert plain_new.meta.api_version is not None
        assert plain_new.meta.api_version.version == "1"
        assert plain_new.meta.billed_units is not None and plain_old.meta.billed_units is not None
        assert plain_new.meta.billed_units.input_tokens == plain_old.meta.billed_units.input_tokens

        types = ["float", "uint8", "binary"]
        typed_old = embed(old, texts=TEXTS, embedding_types=types)
        typed_new = embed(new, texts=TEXTS, embedding_types=types)
        assert typed_old.response_type == typed_new.response_type == "embeddings_by_type"
        floats_old, floats_new = typed_old.embeddings.float_, typed_new.embeddings.float_
        same_vectors(floats_old, floats_new, "cohere v1: float by type")
        same_levels(typed_old.embeddings.uint8, typed_new.embeddings.uint8, "cohere v1: uint8")
        same_bits(
            typed_old.embeddings.binary,
            typed_new.embeddings.binary,
            (floats_old, floats_new),
            f"cohere v1 binary ({kind})",
            offset=128,
        )

        long = [LONG_TEXT, TEXTS[0]]
        start_old = embed(old, texts=long, truncate="START")
        start_new = embed(new, texts=long, truncate="START")
        same_vectors(start_old.embeddings, start_new.embeddings, "cohere v1: long, START")
        assert start_new.meta.billed_units.input_tokens == start_old.meta.billed_units.input_tokens

        error = same_error(
            lambda: embed(old, texts=long, truncate="NONE"),
            lambda: embed(new, texts=long, truncate="NONE"),
            "cohere v1: long, NONE",
        )
        assert error == ("BadRequestError", 400, ["message"])
        error = same_error(  # batching=False: else the SDK fails on [] before asking
            lambda: embed(old, texts=[], batching=False),
            lambda: embed(new, texts=[], batching=False),
            "cohere v1: no texts",
        )
        assert error == ("BadRequestError", 400, ["message"])
        error = same_error(
            lambda: old.embed(texts=TEXTS, model="nope", input_type="search_query"),
            lambda: new.embed(texts=TEXTS, model="nope", input_type="search_query"),
            "cohere v1: unknown model",
        )
        assert error == ("NotFoundError", 404, ["message"])


def test_cohere_v2_client(both: tuple[str, ...]) -> None:
    legacy_url, gateway_url, kind = both
    with (
        cohere.ClientV2(base_url=legacy_url, api_key="x", timeout=TIMEOUT_S) as old,
        cohere.ClientV2(base_url=gateway_url, api_key="x", timeout=TIMEOUT_S) as new,
    ):

        def embed(client: cohere.ClientV2, **kwargs: Any) -> Any:
            kwargs.setdefault("model", SERVED_MODEL)
            kwargs.setdefault("texts", TEXTS)
            return client.embed(input_type="search_query", **kwargs)

        types = ["float", "int8", "ubinary"]
        typed_old, typed_new = embed(old, embedding_types=types), embed(new, embedding_types=types)
        floats_old, floats_new = typed_old.embeddings.float_, typed_new.embeddings.float_
        same_vectors(floats_old, floats_new, "cohere v2: float")
        same_levels(typed_old.embeddings.int8, typed_new.embeddings.int8, "cohere v2: int8")
        same_bits(
            typed_old.embeddings.ubinary,
            typed_new.embeddings.ubinary,
            (floats_old, floats_new),
            f"cohere v2 ubinary ({kind})",
        )
        assert typed_new.texts == TEXTS
        assert typed_new.meta.api_version.version == "2"
        assert typed_new.meta.billed_units.input_tokens == typed_old.meta.billed_units.input_tokens

        def decoded(answer: Any) -> np.ndarray:
            return np.stack([np.frombuffer(base64.b64decode(row), dtype="<f4") for row in answer])

        packed_old = embed(old, embedding_types=["base64"]).embeddings.base64
        packed_new = embed(new, embedding_types=["base64"]).embeddings.base64
        same_vectors(decoded(packed_old), decoded(packed_new), "cohere v2: base64")
        default_old, default_new = embed(old), embed(new)  # no embedding_types: float
        assert default_old.embeddings.float_ is not None
        same_vectors(default_old.embeddings.float_, default_new.embeddings.float_, "cohere v2")

        long = [TEXTS[1], LONG_TEXT]
        error = same_error(
            lambda: embed(old, texts=long, truncate="NONE"),
            lambda: embed(new, texts=long, truncate="NONE"),
            "cohere v2: long, NONE",
        )
        assert error == ("BadRequestError", 400, ["message"])
        error = same_error(
            lambda: embed(old, texts=[]), lambda: embed(new, texts=[]), "cohere v2: no texts"
        )
        assert error == ("BadRequestError", 400, ["message"])
        error = same_error(
            lambda: embed(old, model="nope"),
            lambda: embed(new, model="nope"),
            "cohere v2: unknown model",
        )
        assert error == ("NotFoundError", 404, ["message"])


def test_ollama_embed_client(both: tuple[str, ...]) -> None:
    legacy_url, gateway_url, _ = both
    with (
        ollama.Client(host=legacy_url, timeout=TIMEOUT_S) as old,
        ollama.Client(host=gateway_url, timeout=TIMEOUT_S) as new,
    ):
        _ollama_embed(old, new, (legacy_url, gateway_url))


def _ollama_embed(old: ollama.Client, new: ollama.Client, urls: tuple[str, str]) -> None:
    got_old = old.embed(model=SERVED_MODEL, input=TEXTS)
    got_new = new.embed(model=SERVED_MODEL, input=TEXTS)
    same_vectors(got_old.embeddings, got_new.embeddings, "ollama embed")
    assert got_new.model == got_old.model == SERVED_MODEL
    assert got_new.prompt_eval_count == got_old.prompt_eval_count
    assert got_new.total_duration is not None and got_new.total_duration > 0
    assert got_new.load_duration is not None
    one_old = old.embed(model=SERVED_MODEL, input=LONG_TEXT)  # cut: truncate defaults to true
    one_new = new.embed(model=SERVED_MODEL, input=LONG_TEXT)
    same_vectors(one_old.embeddings, one_new.embeddings, "ollama embed: long, cut")
    assert one_new.prompt_eval_count == one_old.prompt_eval_count

    error = same_error(
        lambda: old.embed(model=SERVED_MODEL, input=LONG_TEXT, truncate=False),
        lambda: new.embed(model=SERVED_MODEL, input=LONG_TEXT, truncate=False),
        "ollama embed: long, truncate false",
    )
    assert error == ("ResponseError", 400)
    long_body = {"model": SERVED_MODEL, "input": LONG_TEXT, "truncate": False}
    same_raw_error(urls, "/api/embed", long_body, "ollama embed: long, truncate false")
    error = same_error(
        lambda: old.embed(model="nope", input=TEXTS),
        lambda: new.embed(model="nope", input=TEXTS),
        "ollama embed: unknown model",
    )
    assert error == ("ResponseError", 404)
    same_raw_error(urls, "/api/embed", {"model": "nope", "input": TEXTS}, "ollama: unknown model")
    # Ollama answers no input as a request to load the model: 200, no embeddings.
    empty_old = old.embed(model=SERVED_MODEL, input=[])
    assert empty_old.embeddings == [] and empty_old.model == SERVED_MODEL
    empty = {"model": SERVED_MODEL, "input": []}
    reply = http("POST", urls[1] + "/api/embed", empty, timeout=TIMEOUT_S)
    assert reply.status == 200, ("ollama embed: no input", reply.status, reply.body[:300])
    empty_new = new.embed(model=SERVED_MODEL, input=[])
    assert empty_new.embeddings == [] and empty_new.model == SERVED_MODEL


def test_ollama_embeddings_client(both: tuple[str, ...]) -> None:
    legacy_url, gateway_url, kind = both
    if kind != "vllm":
        # Dynamo cannot give pooled vectors: its policy leaves the route out, and the
        # request reaches Dynamo untouched (its 404), never a normalised stand-in.
        body = {"model": SERVED_MODEL, "prompt": "a"}
        reply = http("POST", gateway_url + "/api/embeddings", body, timeout=TIMEOUT_S)
        assert reply.status == 404 and b'"embedding"' not in reply.body, reply.body[:300]
        return
    with (
        ollama.Client(host=legacy_url, timeout=TIMEOUT_S) as old,
        ollama.Client(host=gateway_url, timeout=TIMEOUT_S) as new,
    ):
        _ollama_embeddings(old, new, (legacy_url, gateway_url))


def _ollama_embeddings(old: ollama.Client, new: ollama.Client, urls: tuple[str, str]) -> None:
    for text in TEXTS:
        got_old = old.embeddings(model=SERVED_MODEL, prompt=text)
        got_new = new.embeddings(model=SERVED_MODEL, prompt=text)
        norm = float(np.linalg.norm(got_old.embedding))
        assert abs(norm - 1.0) > 0.01, norm  # the pooled vector, not normalised
        same_vectors([got_old.embedding], [got_new.embedding], "ollama embeddings")
    error = same_error(
        lambda: old.embeddings(model="nope", prompt=TEXTS[0]),
        lambda: new.embeddings(model="nope", prompt=TEXTS[0]),
        "ollama embeddings: unknown model",
    )
    assert error == ("ResponseError", 404)
    same_raw_error(
        urls,
        "/api/embeddings",
        {"model": "nope", "prompt": TEXTS[0]},
        "ollama embeddings: unknown model",
    )
