"""TLS and mutual TLS for the ext_proc gRPC listener, with certificate reload.

Settings are three file paths (certificate chain, private key, optional client CA;
a client CA makes client certificates mandatory). They are checked when the server
starts, so a bad file stops it with a message naming the file, never a traceback.

Reload without restart: grpc's ``dynamic_ssl_server_credentials`` calls a fetcher
before every new TLS handshake (on a gRPC core thread, not the event loop). The
fetcher stats the files (microseconds) and only when a stat changed reads, checks
and hands grpc a new configuration; established connections keep theirs, new ones
get the new certificate. A half-finished rotation (new certificate, old key) fails
the check and the current certificate stays in use until the files are consistent:
the next handshake tries again.

The decisions are pure functions over a :class:`ReloadState` (``plan_reload``,
``after_load``); extproc/service/tls_credentials.py is the thin grpc shell that does
the I/O and reports each outcome to the :class:`TlsReloadMetrics` it is given. This
module does not import grpc, so `extproc run`'s launcher checks TLS flags without it.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from extproc.service.regular_file import FileRefusedError, read_regular_file

# A certificate chain or key is a few KiB; a CA bundle can hold a few hundred.
MAX_PEM_BYTES = 4 * 1024 * 1024

log = logging.getLogger("extproc.service.tls")

# Per file: (inode, size, mtime ns, ctime ns). The inode catches the atomic rename
# that Kubernetes Secret volumes and cert-manager use; size and times catch an
# in-place rewrite.
FileStamp = tuple[tuple[int, int, int, int], ...]


class TlsReloadMetrics(Protocol):
    """What the certificate reloader reports, from gRPC's handshake threads (several
    at once: an implementation must be thread-safe). extproc/service/metrics.py counts
    it in Prometheus."""

    def reloaded(self) -> None:
        """Changed TLS files were loaded: new connections use them."""

    def rejected(self) -> None:
        """Changed TLS files cannot be used and the current ones stay; once per set of
        files, however many handshakes try them."""


class TlsError(ValueError):
    """A TLS file cannot be used; the message names the file and the reason."""


@dataclass(frozen=True)
class TlsSettings:
    """Where the server's TLS material lives. ``client_ca_file`` set = mTLS."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca_file is not None

    def files(self) -> tuple[Path, ...]:
        extra = (self.client_ca_file,) if self.client_ca_file is not None else ()
        return (self.cert_file, self.key_file, *extra)


@dataclass(frozen=True)
class TlsMaterial:
    """The PEM bytes grpc is given (what is compared to decide a reload)."""

    certificate_chain: bytes
    private_key: bytes
    client_ca: bytes | None = None


def settings_from_flags(
    cert: Path | None, key: Path | None, client_ca: Path | None
) -> TlsSettings | None:
    """The settings the three flags describe, or None for plaintext."""
    if cert is None and key is None:
        if client_ca is not None:
            raise TlsError("--tls-client-ca needs --tls-cert and --tls-key (mTLS is TLS first)")
        return None
    if cert is None or key is None:
        raise TlsError("--tls-cert and --tls-key go together (a certificate and its key)")
    return TlsSettings(cert, key, client_ca)


# -- checks (pure) ------------------------------------------------------------------


def pem_problem(data: bytes, kind: str) -> str | None:
    """Why ``data`` is not a PEM ``kind`` ("certificate" or "private key"), or None.

    A cheap first check with a readable reason; ``ssl`` does the real parsing.
    """
    if not data.strip():
        return "is empty"
    if kind == "certificate":
        return None if b"-----BEGIN CERTIFICATE-----" in data else "holds no PEM certificate"
    if b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in data:
        # grpc takes no passphrase: an encrypted key would fail at every handshake.
        return "holds an encrypted private key (grpc needs it unencrypted)"
    if b"PRIVATE KEY-----" not in data:
        return "holds no PEM private key"
    return None


def ssl_reason(exc: ssl.SSLError) -> str:
    if exc.reason == "KEY_VALUES_MISMATCH":
        return "does not match the certificate"
    return f"cannot be parsed ({exc.reason or exc})"


# -- loading (thin I/O) -------------------------------------------------------------


def read_file(path: Path, kind: str) -> bytes:
    """A PEM file's bytes: a regular file only, never blocking (a FIFO or a device
    put where a certificate was is refused, extproc/service/regular_file.py)."""
    try:
        data = read_regular_file(path, max_bytes=MAX_PEM_BYTES, what=f"a {kind} file").data
    except FileRefusedError as exc:
        if not path.exists() and not path.is_symlink():
            raise TlsError(f"{path}: no such file ({kind})") from None
        raise TlsError(f"{path}: {exc.reason} ({kind})") from None
    problem = pem_problem(data, kind)
    if problem:
        raise TlsError(f"{path}: {problem}")
    return data


def check_key_pair(cert_file: Path, key_file: Path) -> None:
    """The key parses and belongs to the certificate (OpenSSL's own check)."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsError(
                f"{key_file}: the private key does not match the certificate in {cert_file}"
            ) from None
        raise TlsError(
            f"{cert_file} / {key_file}: not a usable certificate and private key "
            f"({exc.reason or exc})"
        ) from None
    except OSError as exc:
        raise TlsError(f"{cert_file} / {key_file}: {exc.strerror or exc}") from None


def check_ca(path: Path) -> None:
    """The file holds at least one certificate OpenSSL can load as a trust anchor.

    From the path, not the bytes: ``cadata`` must be ASCII, and CA bundles often
    carry UTF-8 comments.
    """
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise TlsError(f"{path}: not a PEM CA bundle: {ssl_reason(exc)}") from None
    except OSError as exc:
        raise TlsError(f"{path}: {exc.strerror or exc}") from None


def load_material(settings: TlsSettings) -> TlsMaterial:
    """Read and check every file; raise :class:`TlsError` naming the bad one.

    ``ssl`` checks the files from their paths, so the bytes are read again afterwards:
    a rotation landing in between gives an error (retried later), never a pair
    that was not the one checked.
    """
    material = _read(settings)
    check_key_pair(settings.cert_file, settings.key_file)
    if settings.client_ca_file is not None:
        check_ca(settings.client_ca_file)
    if _read(settings) != material:
        raise TlsError(f"{settings.cert_file}: TLS files changed while being loaded")
    return material


def _read(settings: TlsSettings) -> TlsMaterial:
    return TlsMaterial(
        certificate_chain=read_file(settings.cert_file, "certificate"),
        private_key=read_file(settings.key_file, "private key"),
        client_ca=(
            read_file(settings.client_ca_file, "certificate")
            if settings.client_ca_file is not None
            else None
        ),
    )


def file_stamp(paths: tuple[Path, ...]) -> FileStamp | None:
    """None while a file is missing (mid-rotation)."""
    stamps = []
    for path in paths:
        try:
            st = os.stat(path)  # follows symlinks: a Secret volume's ..data swap shows
        except OSError:
            return None
        stamps.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(stamps)


# -- reload decisions (pure) --------------------------------------------------------


@dataclass(frozen=True)
class ReloadState:
    stamp: FileStamp | None  # the files as they were when `material` was loaded
    material: TlsMaterial
    failed_stamp: FileStamp | None = None  # last stamp whose files failed (log once)


def plan_reload(state: ReloadState, stamp: FileStamp | None) -> bool:
    """Whether the files must be read again: only when a stat changed. A missing
    file (stamp None) is a rotation in progress: keep serving, look again later."""
    return stamp is not None and stamp != state.stamp


@dataclass(frozen=True)
class ReloadOutcome:
    state: ReloadState
    new_material: TlsMaterial | None  # hand this to grpc; None = keep the current one
    warning: str | None = None  # to log (once per bad set of files)


def after_load(
    state: ReloadState, stamp: FileStamp, loaded: TlsMaterial | TlsError
) -> ReloadOutcome:
    if isinstance(loaded, TlsError):
        # The stamp is not recorded as loaded: the next handshake tries again, so a
        # rotation finishing within the same timestamp tick is not missed.
        warning = None if stamp == state.failed_stamp else str(loaded)
        return ReloadOutcome(ReloadState(state.stamp, state.material, stamp), None, warning)
    if loaded == state.material:  # touched, or rewritten with the same bytes
        return ReloadOutcome(ReloadState(stamp, state.material), None)
    return ReloadOutcome(ReloadState(stamp, loaded), loaded)
