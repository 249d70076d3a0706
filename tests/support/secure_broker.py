"""A Kafka test broker with secured listeners, and the TLS certificates they need.

:class:`SecureKafkaBroker` is a :class:`~tests.support.kafka_broker.KafkaBroker` whose one node
listens, besides its PLAINTEXT listener, on

- ``SASL_PLAINTEXT`` with PLAIN, SCRAM-SHA-256 and OAUTHBEARER (Kafka's unsecured tokens:
  any token ``unsecured_token`` makes is accepted, signature-less),
- ``SSL``, which requires a client certificate signed by the test CA,
- ``SASL_SSL`` with PLAIN and SCRAM-SHA-256 (no client certificate).

The SASL user :data:`USER` (password :data:`PASSWORD`) exists for both mechanisms: the PLAIN
one in the listeners' JAAS config, the SCRAM one written into the metadata log when the
storage is formatted (``kafka-storage format --add-scram``), so it exists before the broker
starts. The certificates are made with the ``openssl`` command line tool by
:func:`make_certificates`: a CA, a server certificate for ``127.0.0.1``/``localhost`` and a
client certificate whose key is encrypted. Every port is below 32768.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.kafka_broker import KafkaBroker, KafkaToolingError
from tests.support.ports import free_port

__all__ = [
    "CLIENT_KEY_PASSWORD",
    "PASSWORD",
    "SERVER_KEY_PASSWORD",
    "USER",
    "Certificates",
    "SecureKafkaBroker",
    "make_certificates",
    "unsecured_token",
]

USER = "alice"
PASSWORD = "alice-secret"
SERVER_KEY_PASSWORD = "server-key-secret"
CLIENT_KEY_PASSWORD = "client-key-secret"

_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
_OAUTH_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
_SECURE_LISTENERS = ("SASL_PLAINTEXT", "SSL", "SASL_SSL")


@dataclass(frozen=True)
class Certificates:
    """PEM files: ``ca`` signed ``server`` and ``client``; ``other_ca`` signed nothing here."""

    ca: Path
    other_ca: Path
    server: Path
    """The server's certificate and its private key (encrypted with ``SERVER_KEY_PASSWORD``)."""
    client: Path
    """The client's certificate and its private key (encrypted with ``CLIENT_KEY_PASSWORD``)."""


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise KafkaToolingError("'openssl' is not on PATH; it is needed to make the test certificates")
    proc = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise KafkaToolingError(f"openssl {args[0]} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")


def _make_ca(directory: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem",
             "-days", "2", "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)


def _make_signed(directory: Path, name: str, subject: str, extensions: str, key_password: str) -> Path:
    """``<name>.pem``: a certificate signed by ``ca`` followed by its encrypted PKCS#8 key."""
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", f"{name}.plain.key",
             cwd=directory)
    # PKCS#5 v1 (PBE-SHA1-3DES): Java 17 cannot read the PBES2 keys openssl writes by default.
    _openssl("pkcs8", "-topk8", "-in", f"{name}.plain.key", "-v1", "PBE-SHA1-3DES", "-passout", f"pass:{key_password}",
             "-out", f"{name}.key", cwd=directory)
    _openssl("req", "-new", "-key", f"{name}.key", "-passin", f"pass:{key_password}", "-subj", subject,
             "-out", f"{name}.csr", cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=directory)
    bundle = directory / f"{name}.pem"
    bundle.write_text((directory / f"{name}.crt").read_text() + (directory / f"{name}.key").read_text())
    return bundle


def make_certificates(directory: Path) -> Certificates:
    """Make a CA, a server and a client certificate (and an unrelated CA) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    _make_ca(directory, "ca")
    _make_ca(directory, "other-ca")
    server = _make_signed(directory, "server", "/CN=localhost",
                          "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                          "extendedKeyUsage=serverAuth\n", SERVER_KEY_PASSWORD)
    client = _make_signed(directory, "client", "/CN=streamloop-client",
                          "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n", CLIENT_KEY_PASSWORD)
    return Certificates(ca=directory / "ca.pem", other_ca=directory / "other-ca.pem", server=server, client=client)


def unsecured_token(subject: str = USER, lifetime_s: int = 3600) -> str:
    """A JWT without signature (``alg: none``), as the broker's default OAUTHBEARER validator accepts."""
    def part(claims: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")

    now = int(time.time())
    return f"{part({'alg': 'none'})}.{part({'sub': subject, 'iat': now, 'exp': now + lifetime_s})}."


class SecureKafkaBroker(KafkaBroker):
    """A :class:`KafkaBroker` with SASL_PLAINTEXT, SSL and SASL_SSL listeners; see the module docstring."""

    def __init__(self, certificates: Certificates, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.certificates = certificates
        self.secure_ports: dict[str, int] = {}

    def bootstrap_of(self, listener: str) -> str:
        """``"127.0.0.1:<port>"`` of ``listener`` (SASL_PLAINTEXT, SSL or SASL_SSL)."""
        if not self.running:
            raise KafkaToolingError("the broker is not started")
        return f"127.0.0.1:{self.secure_ports[listener]}"

    def _server_properties(self) -> str:
        # Called on every start attempt, once the plaintext and controller ports are picked.
        taken = {self.port, self.controller_port}
        self.secure_ports = {}
        for listener in _SECURE_LISTENERS:
            self.secure_ports[listener] = port = free_port(taken)  # type: ignore[arg-type]
            taken.add(port)
        secure = ",".join(f"{name}://127.0.0.1:{port}" for name, port in self.secure_ports.items())
        plain_users = f'{_PLAIN_MODULE} required user_{USER}="{PASSWORD}";'
        scram = f"{_SCRAM_MODULE} required;"
        certs = self.certificates
        self.properties.update({
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port},{secure}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},{secure}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,"
                                              + ",".join(f"{name}:{name}" for name in _SECURE_LISTENERS),
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
            "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,OAUTHBEARER",
            "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": f"{_OAUTH_MODULE} required;",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": plain_users,
            "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": scram,
            "listener.name.sasl_ssl.plain.sasl.jaas.config": plain_users,
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": scram,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(certs.server),
            "ssl.key.password": SERVER_KEY_PASSWORD,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(certs.ca),
            "listener.name.ssl.ssl.client.auth": "required",
        })
        return super()._server_properties()

    def _run_tool(self, cmd: list[str]) -> str:
        if "format" in cmd:
            cmd = [*cmd, "--add-scram", f"SCRAM-SHA-256=[name={USER},password={PASSWORD}]"]
        return super()._run_tool(cmd)
