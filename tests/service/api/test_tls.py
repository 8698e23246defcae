"""Server TLS and mutual TLS, with certificates the test makes itself (trustme)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import trustme

from contextd.api.server import StartupError
from contextd_client import NO_RETRY, Client, ContextdError
from tests.conftest import ServerThread

MakeServer = Callable[..., ServerThread]


def _write_server_pair(ca: trustme.CA, folder: Path) -> tuple[str, str]:
    issued = ca.issue_cert("localhost", "127.0.0.1")
    cert, key = folder / "server.pem", folder / "server.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    key.write_bytes(issued.private_key_pem.bytes())
    return str(cert), str(key)


def _credentials(ca: trustme.CA, client: trustme.LeafCert | None = None) -> grpc.ChannelCredentials:
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
    return grpc.ssl_channel_credentials(
        root_certificates=ca.cert_pem.bytes(),
        private_key=client.private_key_pem.bytes(),
        certificate_chain=b"".join(blob.bytes() for blob in client.cert_chain_pems),
    )


def _works(target: str, credentials: grpc.ChannelCredentials | None) -> bool:
    """Whether a call over `credentials` is answered (the certificate names 127.0.0.1, the target)."""
    with Client(target, credentials=credentials, retry=NO_RETRY, timeout=5) as client:
        try:
            list(client.list_sessions())
        except ContextdError as exc:
            assert exc.code == "UNAVAILABLE", exc  # a refused handshake, never another status
            return False
    return True


def test_tls_serves_clients_that_trust_its_ca_and_no_others(make_server: MakeServer, tmp_path: Path) -> None:
    ca = trustme.CA()
    cert, key = _write_server_pair(ca, tmp_path)
    server = make_server(tls_cert=cert, tls_key=key)
    assert _works(server.target, _credentials(ca))
    assert not _works(server.target, None)  # plaintext to a TLS port
    assert not _works(server.target, _credentials(trustme.CA()))  # a CA it does not know


def test_mutual_tls_needs_a_client_certificate_from_the_given_ca(make_server: MakeServer, tmp_path: Path) -> None:
    ca, clients_ca = trustme.CA(), trustme.CA()
    cert, key = _write_server_pair(ca, tmp_path)
    clients_ca.cert_pem.write_to_path(str(tmp_path / "clients-ca.pem"))
    server = make_server(tls_cert=cert, tls_key=key, tls_client_ca=str(tmp_path / "clients-ca.pem"))
    assert _works(server.target, _credentials(ca, clients_ca.issue_cert("agent-1")))
    assert not _works(server.target, _credentials(ca))  # no client certificate
    assert not _works(server.target, _credentials(ca, trustme.CA().issue_cert("agent-1")))  # another CA's


def test_a_rotated_certificate_serves_new_connections_without_a_restart(
    make_server: MakeServer, tmp_path: Path
) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    cert, key = _write_server_pair(old_ca, tmp_path)
    server = make_server(tls_cert=cert, tls_key=key)
    assert _works(server.target, _credentials(old_ca))
    staged = tmp_path / "staged"
    staged.mkdir()
    new_cert, new_key = _write_server_pair(new_ca, staged)
    # Half a rotation (a new certificate, the old key): the old pair goes on serving.
    os.replace(new_cert, cert)
    stamp = Path(cert).stat().st_mtime_ns
    os.utime(cert, ns=(stamp + 10**9, stamp + 10**9))
    assert _works(server.target, _credentials(old_ca))
    os.replace(new_key, key)
    os.utime(key, ns=(stamp + 2 * 10**9, stamp + 2 * 10**9))
    assert _works(server.target, _credentials(new_ca))
    assert not _works(server.target, _credentials(old_ca))


@pytest.mark.parametrize("problem", ["missing", "mismatched", "not-pem"])
def test_unusable_tls_files_stop_the_start_with_a_reason(make_server: MakeServer, tmp_path: Path, problem: str) -> None:
    ca = trustme.CA()
    cert, key = _write_server_pair(ca, tmp_path)
    if problem == "missing":
        key = str(tmp_path / "nowhere.key")
    elif problem == "mismatched":
        key = str(tmp_path / "other.key")
        Path(key).write_bytes(ca.issue_cert("other").private_key_pem.bytes())
    else:
        Path(cert).write_text("not a certificate\n")
    with pytest.raises(StartupError) as refused:
        make_server(tls_cert=cert, tls_key=key)
    message = str(refused.value)
    assert message.startswith("cannot serve TLS: ") and "\n" not in message
    assert {"missing": "cannot read", "mismatched": "not a certificate and its key", "not-pem": cert}[
        problem
    ] in message
