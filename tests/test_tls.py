"""TLS and mTLS on the ext_proc gRPC port (extproc/service/tls.py): real handshakes against
the real server, certificate reload while it runs, `extproc run` through a real
Envoy with TLS + mTLS on its ext_proc cluster, `envoy --mode validate` on the
transformed configs, and the CLI's errors for unusable files.

Certificates are made per test session with the openssl CLI (the `cryptography`
package is not a dependency): two CAs, a server certificate for each (SANs
localhost and 127.0.0.1), a client certificate from CA 1 and a wrong one from CA 2.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.commands.cli import main as cli_main
from extproc.core.contract import Contract
from extproc.core.policy import GatewayPolicy
from extproc.runtime.envoy_config import (
    EnvoySettings,
    ExtProcTls,
    Upstream,
    dump,
    extproc_cluster_names,
    extproc_transport_socket,
    load_template,
    render,
    with_extproc_tls,
)
from extproc.service.tls import (
    ReloadState,
    TlsError,
    TlsMaterial,
    TlsSettings,
    after_load,
    file_stamp,
    load_material,
    pem_problem,
    plan_reload,
    settings_from_flags,
)
from extproc.service.tls_credentials import CertificateReloader
from testing_support.envoy import envoy_validate
from testing_support.fake_upstream import FakeUpstream
from testing_support.gateway import GatewaySpec
from testing_support.http import http
from testing_support.qwen import QWEN_MODEL, REPO, SHIPPED_QWEN_POLICY
from tests.ext_proc_server import serving
from tests.harness import Gateways
from tests.recorded_metrics import RecordedServerMetrics, RecordedTlsReloads

OPENSSL_TIMEOUT_S = 30
RPC_TIMEOUT_S = 5.0


# -- certificates -------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    ca: Path  # CA 1: signs the server and the good client
    other_ca: Path  # CA 2: signs server2 and the wrong client
    server: Pair
    server2: Pair  # a different CA and serial: what the reload test swaps in
    client: Pair
    wrong_client: Pair


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=OPENSSL_TIMEOUT_S)


def make_ca(directory: Path, name: str) -> Pair:
    pair = Pair(directory / f"{name}.pem", directory / f"{name}.key")
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", str(pair.key), "-out", str(pair.cert), "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return pair


def make_leaf(directory: Path, name: str, ca: Pair, serial: int, *, server: bool) -> Pair:
    pair = Pair(directory / f"{name}.pem", directory / f"{name}.key")
    csr, ext = directory / f"{name}.csr", directory / f"{name}.ext"
    openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", str(pair.key), "-out", str(csr), "-subj", f"/CN={name}",
    )  # fmt: skip
    san = "DNS:localhost,IP:127.0.0.1" if server else f"DNS:{name}"
    usage = "serverAuth" if server else "clientAuth"
    ext.write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n")
    openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-set_serial", str(serial), "-days", "2", "-out", str(pair.cert), "-extfile", str(ext),
    )  # fmt: skip
    return pair


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.fail("the openssl CLI is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    ca, other = make_ca(d, "ca"), make_ca(d, "other-ca")
    return Pki(
        ca=ca.cert,
        other_ca=other.cert,
        server=make_leaf(d, "server", ca, 1001, server=True),
        server2=make_leaf(d, "server2", other, 2002, server=True),
        client=make_leaf(d, "client", ca, 3003, server=False),
        wrong_client=make_leaf(d, "wrong-client", other, 4004, server=False),
    )


def copy_pair(pair: Pair, directory: Path) -> Pair:
    """A private copy the reload test can overwrite."""
    out = Pair(directory / "tls.crt", directory / "tls.key")
    shutil.copyfile(pair.cert, out.cert)
    shutil.copyfile(pair.key, out.key)
    return out


def replace_file(source: Path, target: Path) -> None:
    """Write then rename, as cert-manager and Secret volumes do."""
    staging = target.with_suffix(".new")
    shutil.copyfile(source, staging)
    os.replace(staging, target)


# -- an in-process server and a client ----------------------------------------------


@asynccontextmanager
async def running_server(
    contract: Contract, tls: TlsSettings | None, metrics: RecordedServerMetrics
) -> AsyncIterator[int]:
    async with serving(contract, metrics, grace_seconds=0, tls=tls) as port:
        yield port


def credentials(ca: Path | None = None, client: Pair | None = None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes() if ca else None,
        private_key=client.key.read_bytes() if client else None,
        certificate_chain=client.cert.read_bytes() if client else None,
    )


@asynccontextmanager
async def channel(port: int, creds: grpc.ChannelCredentials | None) -> AsyncIterator[Any]:
    """A new channel, hence a new connection and a new TLS handshake."""
    target = f"127.0.0.1:{port}"
    ch = (
        grpc.aio.insecure_channel(target)
        if creds is None
        else grpc.aio.secure_channel(target, creds)
    )
    async with ch:
        yield ch


async def health_status(ch: Any) -> str:
    reply = await health_pb2_grpc.HealthStub(ch).Check(
        health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT_S
    )
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


async def health_error(ch: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await health_status(ch)
    return caught.value.code()


async def one_ext_proc_message(ch: Any) -> ep.ProcessingResponse:
    """What Envoy sends for a POST /v1/embeddings (a malformed body: answered 400)."""
    call = ep_grpc.ExternalProcessorStub(ch).Process(timeout=RPC_TIMEOUT_S)
    await call.write(ep.ProcessingRequest(request_body=ep.HttpBody(body=b"{", end_of_stream=True)))
    reply = await call.read()
    await call.done_writing()
    return reply  # type: ignore[no-any-return]


def streams_reached(metrics: RecordedServerMetrics) -> int:
    """The ext_proc streams that reached the servicer."""
    return len(metrics.streams.named("stream_opened"))


# -- 1. TLS handshake ---------------------------------------------------------------


async def test_tls_server_answers_a_client_that_trusts_its_ca(
    pki: Pki, qwen_contract: Contract
) -> None:
    tls = TlsSettings(pki.server.cert, pki.server.key)
    metrics = RecordedServerMetrics()
    async with running_server(qwen_contract, tls, metrics) as port:
        async with channel(port, credentials(pki.ca)) as ch:
            assert await health_status(ch) == "SERVING"
            assert (await one_ext_proc_message(ch)).HasField("immediate_response")
        # The certificate is really checked: trusting another CA fails, and so does plaintext.
        async with channel(port, credentials(pki.other_ca)) as ch:
            assert await health_error(ch) == grpc.StatusCode.UNAVAILABLE
        async with channel(port, None) as ch:
            assert await health_error(ch) == grpc.StatusCode.UNAVAILABLE
    assert streams_reached(metrics) == 1


# -- 2. mTLS ------------------------------------------------------------------------


async def test_mtls_accepts_only_clients_with_a_certificate_from_the_client_ca(
    pki: Pki, qwen_contract: Contract
) -> None:
    tls = TlsSettings(pki.server.cert, pki.server.key, client_ca_file=pki.ca)
    metrics = RecordedServerMetrics()
    async with running_server(qwen_contract, tls, metrics) as port:
        for rejected in (credentials(pki.ca, pki.wrong_client), credentials(pki.ca)):
            async with channel(port, rejected) as ch:
                assert await health_error(ch) == grpc.StatusCode.UNAVAILABLE
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await one_ext_proc_message(ch)
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert streams_reached(metrics) == 0  # the handshake failed: nothing reached it

        async with channel(port, credentials(pki.ca, pki.client)) as ch:
            assert await health_status(ch) == "SERVING"
            assert (await one_ext_proc_message(ch)).HasField("immediate_response")
        assert streams_reached(metrics) == 1

        # `extproc health` (the container/exec probe) with and without a client cert.
        probe = ["health", "--address", f"127.0.0.1:{port}", "--tls-ca", str(pki.ca)]
        client = ["--tls-cert", str(pki.client.cert), "--tls-key", str(pki.client.key)]
        assert await asyncio.to_thread(cli_main, [*probe, *client]) == 0
        assert await asyncio.to_thread(cli_main, probe) == 1


# -- 3. reload without restart ------------------------------------------------------


async def test_new_certificate_files_are_served_to_new_connections_without_restart(
    pki: Pki, qwen_contract: Contract, tmp_path: Path
) -> None:
    live = copy_pair(pki.server, tmp_path)
    tls = TlsSettings(live.cert, live.key)
    metrics = RecordedServerMetrics()
    reloads = metrics.tls_reloads.events
    async with running_server(qwen_contract, tls, metrics) as port:
        async with channel(port, credentials(pki.other_ca)) as ch:
            assert await health_error(ch) == grpc.StatusCode.UNAVAILABLE  # not yet
        async with channel(port, credentials(pki.ca)) as before:
            assert await health_status(before) == "SERVING"

            # Half a rotation (new certificate, old key): unusable, the old pair stays.
            replace_file(pki.server2.cert, live.cert)
            async with channel(port, credentials(pki.ca)) as ch:
                assert await health_status(ch) == "SERVING"
            assert reloads == [("rejected",)]

            # The rotation completes: new connections get CA 2's certificate.
            replace_file(pki.server2.key, live.key)
            async with channel(port, credentials(pki.other_ca)) as ch:
                assert await health_status(ch) == "SERVING"
            async with channel(port, credentials(pki.ca)) as ch:
                assert await health_error(ch) == grpc.StatusCode.UNAVAILABLE
            assert reloads == [("rejected",), ("reloaded",)]

            # The connection made before the swap is not disturbed.
            assert await health_status(before) == "SERVING"


def test_the_reloader_reports_each_outcome_once_per_set_of_files(pki: Pki, tmp_path: Path) -> None:
    live = copy_pair(pki.server, tmp_path)
    settings = TlsSettings(live.cert, live.key)
    metrics = RecordedTlsReloads()
    state = ReloadState(file_stamp(settings.files()), load_material(settings))
    reloader = CertificateReloader(settings, state, metrics)
    assert reloader() is None  # unchanged
    replace_file(pki.server2.cert, live.cert)  # half a rotation
    assert reloader() is None
    assert reloader() is None  # the next handshake tries again, reported once
    assert metrics.events == [("rejected",)]
    replace_file(pki.server2.key, live.key)
    assert reloader() is not None
    assert reloader() is None
    assert metrics.events == [("rejected",), ("reloaded",)]


def material(tag: str) -> TlsMaterial:
    return TlsMaterial(f"cert {tag}".encode(), f"key {tag}".encode())


def test_reload_decisions() -> None:
    a, b = ((1, 10, 100, 100),), ((2, 10, 200, 200),)
    state = ReloadState(a, material("a"))
    assert not plan_reload(state, a)
    assert not plan_reload(state, None)  # a file missing mid-rotation: keep serving
    assert plan_reload(state, b)

    failed = after_load(state, b, TlsError("mismatch"))
    assert failed.new_material is None and failed.warning == "mismatch"
    assert plan_reload(failed.state, b)  # retried on the next handshake...
    again = after_load(failed.state, b, TlsError("mismatch"))
    assert again.warning is None  # ...but logged once

    same = after_load(state, b, material("a"))  # touched, same bytes
    assert same.new_material is None and not plan_reload(same.state, b)
    new = after_load(failed.state, b, material("b"))
    assert new.new_material == material("b") and new.state == ReloadState(b, material("b"))


# -- 4. `extproc run` with TLS + mTLS through a real Envoy --------------------------


def mtls_args(pki: Pki, envoy_client: Pair) -> list[str]:
    return [
        "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key),
        "--tls-client-ca", str(pki.ca),
        "--envoy-ca", str(pki.ca),
        "--envoy-client-cert", str(envoy_client.cert),
        "--envoy-client-key", str(envoy_client.key),
    ]  # fmt: skip


def envoy_stat(ready_line: str, name: str) -> int:
    admin = re.search(r"admin (127\.0\.0\.1:\d+)", ready_line)
    assert admin, ready_line
    stats = http("GET", f"http://{admin.group(1)}/stats?filter=^{re.escape(name)}$").body.decode()
    match = re.search(rf"^{re.escape(name)}: (\d+)$", stats, re.M)
    assert match, stats
    return int(match.group(1))


@pytest.mark.parametrize(
    ("template", "workers"),
    [("standalone", 1), ("single-filter", 1), ("standalone", 2)],
    ids=["standalone", "single-filter", "standalone-2-workers"],
)
def test_extproc_run_with_mtls_serves_embeddings_through_envoy(
    template: str, workers: int, *, pki: Pki, upstream: FakeUpstream, gateways: Gateways
) -> None:
    spec = GatewaySpec(
        upstream.url, shape=template, workers=workers, args=tuple(mtls_args(pki, pki.client))
    )
    with gateways.own(spec) as gateway:
        assert (" mTLS," if workers == 1 else f" mTLS ({workers} workers),") in gateway.ready_line
        reply = gateway.embeddings({"model": QWEN_MODEL, "input": "hello", "dimensions": 256})
        assert reply.status == 200, reply.body
        assert len(reply.json()["data"][0]["embedding"]) == 256
        # Envoy's ext_proc cluster did the TLS handshake (not a plaintext fallback).
        assert envoy_stat(gateway.ready_line, "cluster.extproc.ssl.handshake") >= 1


@pytest.mark.parametrize("workers", [1, 2], ids=["1-worker", "2-workers"])
def test_extproc_run_fails_closed_when_envoy_presents_a_wrong_client_cert(
    workers: int,
    *,
    pki: Pki,
    upstream: FakeUpstream,
    gateways: Gateways,
) -> None:
    spec = GatewaySpec(
        upstream.url,
        workers=workers,
        args=tuple(mtls_args(pki, pki.wrong_client)),
        # grpc core logs the server's handshake verdict at INFO.
        env=(("GRPC_VERBOSITY", "INFO"),),
    )
    with gateways.own(spec) as gateway:
        upstream.reset()
        reply = gateway.embeddings({"model": QWEN_MODEL, "input": "hello"})
        assert reply.status == 503, reply.body
        assert reply.json()["error"]["type"] == "server_error"
        assert upstream.received == []  # fail closed: nothing forwarded unprocessed
        # Refused by the server for its certificate (not a plaintext/TLS mix-up).
        assert envoy_stat(gateway.ready_line, "cluster.extproc.ssl.handshake") == 0
        assert "CERTIFICATE_VERIFY_FAILED" in gateway.log()


# -- 5. the transformed Envoy configs validate --------------------------------------


@pytest.mark.parametrize("template", ["standalone", "single-filter", "shadow"])
def test_tls_transformed_config_passes_envoy_validate(
    template: str, pki: Pki, qwen_policy: GatewayPolicy, tmp_path: Path
) -> None:
    settings = EnvoySettings(
        "127.0.0.1", 18080, 19901, 15051, Upstream.from_url("http://127.0.0.1:8000")
    )
    path = REPO / "envoy" / f"{template}.yaml"
    rendered = load_template(path)
    if template != "shadow":  # render() knows the extproc run shape only
        rendered = render(rendered, settings, qwen_policy)
    tls = ExtProcTls(pki.ca, "localhost", pki.client.cert, pki.client.key)
    config = with_extproc_tls(rendered, tls)
    out = tmp_path / "envoy.yaml"
    out.write_text(dump(config))
    result = envoy_validate(out)
    assert result.returncode == 0, result.stdout + result.stderr

    names = extproc_cluster_names(config)
    assert names
    for cluster in config["static_resources"]["clusters"]:
        socket = cluster.get("transport_socket", {}).get("typed_config", {})
        if cluster["name"] in names:
            assert socket["sni"] == "localhost"
            common = socket["common_tls_context"]
            assert common["validation_context"]["trusted_ca"] == {"filename": str(pki.ca)}
            assert common["tls_certificates"][0]["private_key"] == {"filename": str(pki.client.key)}
        else:
            assert "common_tls_context" not in socket  # only the ext_proc hop changed
    assert "transport_socket" not in rendered["static_resources"]["clusters"][-1]  # a copy

    # Envoy really reads the files: a missing CA makes the same config invalid.
    broken = with_extproc_tls(rendered, ExtProcTls(tmp_path / "missing-ca.pem"))
    out.write_text(dump(broken))
    assert envoy_validate(out).returncode != 0


def test_the_snippet_in_docs_tls_md_is_what_the_transformation_produces() -> None:
    text = (REPO / "docs" / "tls.md").read_text()
    after_marker = text.split("<!-- extproc-tls-snippet", 1)[1]
    block = after_marker.split("```yaml\n", 1)[1].split("```", 1)[0]
    (cluster,) = yaml.safe_load(block)["clusters"]
    tls_dir = Path("/etc/envoy/extproc-tls")
    expected = extproc_transport_socket(
        ExtProcTls(
            tls_dir / "ca.crt",
            "extproc.embeddings.svc.cluster.local",
            tls_dir / "envoy.crt",
            tls_dir / "envoy.key",
        )
    )
    assert cluster["transport_socket"] == expected


def test_an_ip_server_name_is_matched_as_an_ip_san_without_sni(pki: Pki) -> None:
    config = with_extproc_tls(load_template(), ExtProcTls(pki.ca, "127.0.0.1"))
    (cluster,) = (c for c in config["static_resources"]["clusters"] if c["name"] == "extproc")
    context = cluster["transport_socket"]["typed_config"]
    assert "sni" not in context
    assert "tls_certificates" not in context["common_tls_context"]  # TLS only, no client cert
    assert context["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "IP_ADDRESS", "matcher": {"exact": "127.0.0.1"}}
    ]


def test_a_config_without_ext_proc_cannot_be_secured(pki: Pki) -> None:
    config = load_template()
    config["static_resources"]["listeners"] = []
    with pytest.raises(ValueError, match="no ext_proc gRPC cluster"):
        with_extproc_tls(config, ExtProcTls(pki.ca))


# -- 6. unusable settings: a clear error, no traceback ------------------------------


def test_load_material_names_the_bad_file(pki: Pki, tmp_path: Path) -> None:
    assert load_material(TlsSettings(pki.server.cert, pki.server.key, pki.ca)).client_ca
    cases = {
        "no such file": TlsSettings(tmp_path / "nope.pem", pki.server.key),
        "does not match the certificate": TlsSettings(pki.server.cert, pki.client.key),
        "holds no PEM private key": TlsSettings(pki.server.cert, pki.server.cert),
        "not a PEM CA bundle": TlsSettings(pki.server.cert, pki.server.key, _junk_ca(tmp_path)),
        "resolves to a directory": TlsSettings(tmp_path, pki.server.key),
        # Never opened in a way that blocks: a FIFO would wait for a writer forever.
        "resolves to a FIFO": TlsSettings(pki.server.cert, _fifo(tmp_path)),
        "resolves to a character device": TlsSettings(_dev_zero(tmp_path), pki.server.key),
    }
    for reason, settings in cases.items():
        with pytest.raises(TlsError, match=reason) as caught:
            load_material(settings)
        assert any(str(p) in str(caught.value) for p in settings.files()), caught.value


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "key.fifo"
    os.mkfifo(path)
    return path


def _dev_zero(tmp_path: Path) -> Path:
    path = tmp_path / "cert.pem"
    path.symlink_to("/dev/zero")
    return path


def _junk_ca(tmp_path: Path) -> Path:
    path = tmp_path / "junk-ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    return path


def test_pem_problems() -> None:
    assert pem_problem(b"", "certificate") == "is empty"
    assert pem_problem(b"-----BEGIN ENCRYPTED PRIVATE KEY-----", "private key")
    assert pem_problem(b"-----BEGIN EC PRIVATE KEY-----", "private key") is None
    assert settings_from_flags(None, None, None) is None
    for flags in ((Path("c"), None, None), (None, None, Path("ca"))):
        with pytest.raises(TlsError):
            settings_from_flags(*flags)


def cli_cases(pki: Pki, tmp: Path) -> dict[str, tuple[list[str], str]]:
    missing = str(tmp / "missing.key")
    serve = ["serve", "--listen", "127.0.0.1:0", "--config", str(SHIPPED_QWEN_POLICY)]
    run = ["run", "--upstream", "http://127.0.0.1:9", *serve[3:]]
    server = ["--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key)]
    return {
        "missing key": (serve + ["--tls-cert", str(pki.server.cert), "--tls-key", missing],
                        f"{missing}: no such file"),
        "key of another cert": (serve + ["--tls-cert", str(pki.server.cert),
                                         "--tls-key", str(pki.client.key)],
                                "does not match the certificate"),
        "cert without key": (serve + ["--tls-cert", str(pki.server.cert)], "go together"),
        "run without --envoy-ca": (run + server, "needs --envoy-ca"),
        "mTLS without Envoy's cert": (run + server + ["--tls-client-ca", str(pki.ca),
                                                      "--envoy-ca", str(pki.ca)],
                                      "needs --envoy-client-cert"),
        "Envoy's key of another cert": (run + server + [
            "--tls-client-ca", str(pki.ca), "--envoy-ca", str(pki.ca),
            "--envoy-client-cert", str(pki.client.cert),
            "--envoy-client-key", str(pki.wrong_client.key)], "does not match the certificate"),
    }  # fmt: skip


def test_cli_refuses_unusable_tls_settings(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("EXTPROC_TLS_CERT", "EXTPROC_TLS_KEY", "EXTPROC_TLS_CLIENT_CA"):
        monkeypatch.delenv(variable, raising=False)
    for name, (argv, message) in cli_cases(pki, tmp_path).items():
        assert cli_main(argv) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("error: TLS: ") and message in err, (name, err)


def test_cli_error_is_one_line_without_traceback_in_a_real_process(
    pki: Pki, tmp_path: Path
) -> None:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "extproc", "serve", "--listen", "127.0.0.1:0",
         "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.wrong_client.key)],
        capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith("EXTPROC_TLS")},
    )  # fmt: skip
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: TLS: {pki.wrong_client.key}: the private key does not match the certificate "
        f"in {pki.server.cert}"
    ]
    assert time.monotonic() - started < 60
