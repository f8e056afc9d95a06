"""The gRPC side of ext_proc TLS: server credentials that reload the certificate files
on change (:class:`CertificateReloader`, called by grpc before each new handshake) and
client channel credentials. The checks and decisions they use are in
extproc/service/tls.py, which does not import grpc."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import cast

import grpc

from extproc.service.tls import (
    ReloadState,
    TlsError,
    TlsMaterial,
    TlsReloadMetrics,
    TlsSettings,
    after_load,
    check_key_pair,
    file_stamp,
    load_material,
    plan_reload,
    read_file,
)

log = logging.getLogger("extproc.service.tls")


def certificate_configuration(material: TlsMaterial) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(material.private_key, material.certificate_chain)],
        root_certificates=material.client_ca,
    )


class CertificateReloader:
    """grpc's certificate_configuration_fetcher: called before each new handshake,
    possibly from several gRPC core threads at once (hence the lock)."""

    def __init__(
        self, settings: TlsSettings, state: ReloadState, metrics: TlsReloadMetrics
    ) -> None:
        self._settings = settings
        self._state = state
        self._metrics = metrics
        self._lock = threading.Lock()

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            stamp = file_stamp(self._settings.files())
            if stamp is None or not plan_reload(self._state, stamp):
                return None
            loaded: TlsMaterial | TlsError
            try:
                loaded = load_material(self._settings)
            except TlsError as exc:
                loaded = exc
            outcome = after_load(self._state, stamp, loaded)
            self._state = outcome.state
        if outcome.warning:
            self._metrics.rejected()
            log.warning(
                "TLS files changed but cannot be used, keeping the current ones: %s",
                outcome.warning,
            )
        if outcome.new_material is None:
            return None
        self._metrics.reloaded()
        log.info("TLS certificate reloaded from %s", self._settings.cert_file)
        return certificate_configuration(outcome.new_material)


def server_credentials(settings: TlsSettings, metrics: TlsReloadMetrics) -> grpc.ServerCredentials:
    """Credentials that reload the files on change, reporting to ``metrics``; raises
    :class:`TlsError`."""
    stamp = file_stamp(settings.files())  # before reading: a change in between reloads
    material = load_material(settings)
    # types-grpcio types the fetcher as never returning None; grpc documents (and
    # its Cython wrapper handles) None as "unchanged".
    fetcher = cast(
        Callable[[], grpc.ServerCertificateConfiguration],
        CertificateReloader(settings, ReloadState(stamp, material), metrics),
    )
    return grpc.dynamic_ssl_server_credentials(
        certificate_configuration(material), fetcher, require_client_authentication=settings.mutual
    )


def channel_credentials(
    ca_file: Path | None, cert_file: Path | None = None, key_file: Path | None = None
) -> grpc.ChannelCredentials:
    """Client side (``extproc health``, tests): trust ``ca_file`` (None = the system
    roots); present the certificate pair when both are given (mTLS)."""
    if (cert_file is None) != (key_file is None):
        raise TlsError("a client certificate and its key go together")
    if cert_file is not None and key_file is not None:
        check_key_pair(cert_file, key_file)
    return grpc.ssl_channel_credentials(
        root_certificates=read_file(ca_file, "certificate") if ca_file else None,
        private_key=read_file(key_file, "private key") if key_file else None,
        certificate_chain=read_file(cert_file, "certificate") if cert_file else None,
    )
