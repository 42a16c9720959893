"""A self-signed certificate for the TLS tests (remoting, MQTT, AMQP, gRPC listeners)."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def self_signed(directory) -> tuple[str, str]:
    """(cert.pem, key.pem) in `directory`: RSA 2048, for localhost and 127.0.0.1, valid a
    day. The test is skipped where openssl is not installed."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> tuple[str, str]:
    """One certificate for the tests of a module."""
    return self_signed(tmp_path_factory.mktemp("tls"))
