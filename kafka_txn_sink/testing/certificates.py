"""A certificate authority of the test bed's own, for TLS on loopback: PEM files only.

The CA signs one server certificate for the broker (valid for 127.0.0.1 and localhost) and one
client certificate per mutual-TLS user (subject ``CN=<name>``). Every certificate is written as
``<name>.crt`` and its unencrypted PKCS#8 key as ``<name>.key``, the forms librdkafka and
kafka-python read; ``<name>.keystore.pem`` holds key, certificate and CA together, the form of
Kafka's ``ssl.keystore.type=PEM``.

``cryptography`` (the ``testing`` extra) is imported only when a certificate is made.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.processes import LOOPBACK

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

# Long enough for any test run, short enough that a leaked key expires.
VALIDITY = datetime.timedelta(days=7)
KEY_BITS = 2048


@dataclass(frozen=True)
class IssuedCertificate:
    """The PEM files of one certificate signed by the test bed's CA."""

    name: str
    certificate: Path
    key: Path
    keystore: Path


class CertificateAuthority:
    """A CA whose key and certificate live in ``directory`` (made there on first use)."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self._key: RSAPrivateKey | None = None
        self._cert: x509.Certificate | None = None

    @property
    def ca_path(self) -> Path:
        """The CA certificate (PEM): the trust store of clients and of the broker."""
        return self.directory / "ca.crt"

    @property
    def _ca_key_path(self) -> Path:
        return self.directory / "ca.key"

    def issue(self, name: str, server: bool = False) -> IssuedCertificate:
        """Sign a certificate for ``CN=name`` and write its files; ``server`` adds the loopback
        names that clients verify the broker by."""
        try:
            from cryptography import x509
            from cryptography.x509.oid import ExtendedKeyUsageOID
        except ImportError as exc:
            raise TestbedError(
                "the secured test bed makes its certificates with `cryptography`:"
                " install the `testing` extra of kafka-txn-sink"
            ) from exc

        ca_key, ca_cert = self._load_or_create()
        key = _new_key()
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            _builder(_name(name), ca_cert.subject, key)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            # A broker's certificate also authenticates it to its own controller.
            .add_extension(
                x509.ExtendedKeyUsage(
                    [usage, ExtendedKeyUsageOID.CLIENT_AUTH] if server else [usage]
                ),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.IPAddress(ipaddress.ip_address(LOOPBACK)),
                        x509.DNSName("localhost"),
                    ]
                ),
                critical=False,
            )
        cert = _sign(builder, ca_key)
        return self._write(name, key, cert, ca_cert)

    def _load_or_create(self) -> tuple[RSAPrivateKey, x509.Certificate]:
        if self._key is None or self._cert is None:
            if self.ca_path.exists() and self._ca_key_path.exists():
                self._key, self._cert = _load(self._ca_key_path, self.ca_path)
            else:
                self._key, self._cert = self._create()
        return self._key, self._cert

    def _create(self) -> tuple[RSAPrivateKey, x509.Certificate]:
        from cryptography import x509

        key = _new_key()
        subject = _name("kafka_txn_sink test bed CA")
        cert = _sign(
            _builder(subject, subject, key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            ),
            key,
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        _write_private(self._ca_key_path, _key_pem(key))
        self.ca_path.write_bytes(_cert_pem(cert))
        return key, cert

    def files(self, name: str) -> IssuedCertificate:
        """Where the files of ``name``'s certificate are (once issued)."""
        return IssuedCertificate(
            name=name,
            certificate=self.directory / f"{name}.crt",
            key=self.directory / f"{name}.key",
            keystore=self.directory / f"{name}.keystore.pem",
        )

    def _write(
        self, name: str, key: RSAPrivateKey, cert: x509.Certificate, ca_cert: x509.Certificate
    ) -> IssuedCertificate:
        issued = self.files(name)
        issued.certificate.write_bytes(_cert_pem(cert) + _cert_pem(ca_cert))
        _write_private(issued.key, _key_pem(key))
        _write_private(issued.keystore, _key_pem(key) + _cert_pem(cert) + _cert_pem(ca_cert))
        return issued


# --------------------------------------------------------------------------------------------
# cryptography, in small steps
# --------------------------------------------------------------------------------------------


def _new_key() -> RSAPrivateKey:
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)


def _name(common_name: str) -> x509.Name:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: x509.Name, issuer: x509.Name, key: RSAPrivateKey) -> x509.CertificateBuilder:
    from cryptography import x509

    # Back-dated a little: the broker and the clients may read the clock slightly apart.
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALIDITY)
    )


def _sign(builder: x509.CertificateBuilder, ca_key: RSAPrivateKey) -> x509.Certificate:
    from cryptography.hazmat.primitives import hashes

    return builder.sign(ca_key, hashes.SHA256())


def _key_pem(key: RSAPrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _load(key_path: Path, cert_path: Path) -> tuple[RSAPrivateKey, x509.Certificate]:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise TypeError(f"{key_path} is not the RSA key of a test bed CA")
    return key, x509.load_pem_x509_certificate(cert_path.read_bytes())


def _write_private(path: Path, data: bytes) -> None:
    """Write a file holding a private key, readable by its owner only."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)
