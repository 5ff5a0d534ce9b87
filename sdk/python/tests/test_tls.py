"""TLS to the servers: server verification with a given CA, and client
certificates for mutual TLS."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List

import grpc
import pytest

from gnomon_worker import Tls

from peer import Peer, until

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    d = tmp_path_factory.mktemp("certs")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=test-ca", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for who in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}.key", "-out", f"{who}.csr",
                "-subj", f"/CN=test-{who}", cwd=d)
        openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{who}.pem", "-days", "2", "-extfile", f"{who}.ext", cwd=d)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out", "other.pem",
            "-days", "2", "-subj", "/CN=other-ca", cwd=d)
    return {p.stem + p.suffix: p for p in d.iterdir()}


def server_credentials(certs: Dict[str, Path], client_auth: bool) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials(
        [(certs["server.key"].read_bytes(), certs["server.pem"].read_bytes())],
        root_certificates=certs["ca.pem"].read_bytes() if client_auth else None,
        require_client_auth=client_auth,
    )


async def noop(ctx):
    return None


async def test_tls_with_a_given_ca(start_worker, certs) -> None:
    peer = await Peer().start(credentials=server_credentials(certs, client_auth=False))
    try:
        await start_worker(peer, {"h": noop}, tls=Tls(ca=str(certs["ca.pem"])), token="tok")
        s = await peer.session()
        assert s.hello.worker_id == "w1" and s.metadata["authorization"] == "Bearer tok"
        assert s.metadata.get("auth:transport_security_type") == "ssl"
    finally:
        await peer.stop()


async def test_mutual_tls_presents_the_client_certificate(start_worker, certs) -> None:
    peer = await Peer().start(credentials=server_credentials(certs, client_auth=True))
    try:
        tls = Tls(ca=str(certs["ca.pem"]), cert=str(certs["client.pem"]), key=str(certs["client.key"]))
        await start_worker(peer, {"h": noop}, tls=tls)
        s = await peer.session()
        assert s.metadata.get("auth:x509_common_name") == "test-client"
    finally:
        await peer.stop()


async def test_a_server_signed_by_another_ca_is_not_trusted(start_worker, certs, pauses: List[float]) -> None:
    peer = await Peer().start(credentials=server_credentials(certs, client_auth=False))
    try:
        await start_worker(peer, {"h": noop}, tls=Tls(ca=str(certs["other.pem"])))
        await until(lambda: len(pauses) >= 3, "reconnect attempts")
        assert peer.hellos == []
    finally:
        await peer.stop()


async def test_unreadable_tls_files_are_an_error_and_retried(start_worker, pauses: List[float], tmp_path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="gnomon_worker")
    await start_worker("127.0.0.1:1", {"h": noop}, tls=Tls(ca=str(tmp_path / "missing.pem")))
    await until(lambda: len(pauses) >= 2, "two attempts")
    assert any("cannot read the TLS files" in r.getMessage() for r in caplog.records)
