"""A CA, a server certificate for 127.0.0.1 and a client certificate, made by the system's
``openssl`` for a test's TLS (an etcd cluster that checks its clients)."""

from __future__ import annotations

import dataclasses
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca)
        context.load_cert_chain(self.client_cert, self.client_key)
        return context


def make_tls_files(folder: Path) -> TlsFiles:
    """Fresh files in ``folder``; the test skips where ``openssl`` is not installed."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca = folder / "ca.key", folder / "ca.pem"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=cclctl test CA", "-keyout", ca_key, "-out", ca)  # fmt: skip
    certs = {}
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "")):
        key, csr, cert = folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.pem"
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=cclctl {name}",
                 "-keyout", key, "-out", csr)  # fmt: skip
        extfile = folder / f"{name}.ext"
        extfile.write_text("extendedKeyUsage=serverAuth,clientAuth\n" + (ext + "\n" if ext else ""))
        _openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
                 "-days", "2", "-extfile", extfile, "-out", cert)  # fmt: skip
        certs[name] = (str(cert), str(key))
    return TlsFiles(str(ca), *certs["server"], *certs["client"])


def _openssl(*args: object) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)
