"""Server TLS: the certificate and key files, optionally a CA that client certificates
must chain to (mutual TLS), reloaded when the files change.

The files are checked at start-up with Python's `ssl` (the key must match the
certificate), so a bad file is a one-line reason not to start rather than a
failed handshake later. gRPC asks for the certificate before every new
connection's handshake; when a file's modification time has changed since
the last load, the files are read and checked again, and a rotated
certificate serves new connections without a restart. A rotation caught
half-written (a key that does not match yet) keeps the previous pair, with a
warning, until the files agree.
"""

from __future__ import annotations

import logging
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger("contextd.tls")


class TlsFilesError(ValueError):
    """The TLS files cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path
    """PEM certificate chain, the server's certificate first."""
    key: Path
    """PEM private key of that certificate."""
    client_ca: Path | None = None
    """PEM certificates that client certificates must chain to; None: clients need none."""

    def paths(self) -> tuple[Path, ...]:
        return (self.cert, self.key) if self.client_ca is None else (self.cert, self.key, self.client_ca)


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Credentials that serve `files` and pick up their replacements; TlsFilesError if unusable."""
    reloader = _Reloader(files)
    return grpc.dynamic_ssl_server_credentials(
        reloader.current,
        reloader.fetch,  # type: ignore[arg-type]  # None means "no change" (the stub leaves it out)
        require_client_authentication=files.client_ca is not None,
    )


def _load(files: TlsFiles) -> grpc.ServerCertificateConfiguration:
    contents: dict[Path, bytes] = {}
    for path in files.paths():
        try:
            contents[path] = path.read_bytes()
        except OSError as exc:
            raise TlsFilesError(f"cannot read {path}: {exc.strerror or exc}") from None
    check = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        check.load_cert_chain(files.cert, files.key)
    except (ssl.SSLError, ValueError) as exc:
        raise TlsFilesError(f"{files.cert} and {files.key} are not a certificate and its key ({exc})") from None
    if files.client_ca is not None:
        try:
            check.load_verify_locations(cafile=files.client_ca)
        except (ssl.SSLError, ValueError) as exc:
            raise TlsFilesError(f"{files.client_ca} holds no CA certificate ({exc})") from None
    return grpc.ssl_server_certificate_configuration(
        [(contents[files.key], contents[files.cert])],
        root_certificates=contents[files.client_ca] if files.client_ca is not None else None,
    )


class _Reloader:
    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._stamps = self._stat()
        self.current = _load(files)
        self._lock = threading.Lock()  # gRPC may ask from several threads

    def _stat(self) -> tuple[int, ...]:
        stamps = []
        for path in self.files.paths():
            try:
                stamps.append(path.stat().st_mtime_ns)
            except OSError:
                stamps.append(-1)
        return tuple(stamps)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """The new configuration when the files changed and agree, else None (keep the current)."""
        with self._lock:
            stamps = self._stat()
            if stamps == self._stamps:
                return None
            self._stamps = stamps  # tried once per change, not at every connection
            try:
                loaded = _load(self.files)
            except TlsFilesError as exc:
                log.warning("TLS files changed but cannot be used yet, so the previous ones serve: %s", exc)
                return None
            self.current = loaded
            log.info("TLS certificate reloaded from %s", self.files.cert)
            return loaded
