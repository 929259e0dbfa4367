"""A certificate authority of the tests' own, like an organisation's internal CA.

It signs server certificates for loopback servers; nothing trusts it unless
told to, which is what the tests of ``outbound_ca_bundle`` need.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@dataclass
class PrivateAuthority:
    """A root certificate and its key; :meth:`server_context` serves a certificate it signed."""

    common_name: str = "Internal Root CA"
    key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    certificate: x509.Certificate = field(init=False)

    def __post_init__(self) -> None:
        now = datetime.now(UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(self.common_name)).issuer_name(_name(self.common_name))
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256()))

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def write(self, path: Path) -> Path:
        """The root certificate as a PEM bundle at ``path``."""
        path.write_bytes(self.pem)
        return path

    def issue(self, host: str) -> tuple[bytes, bytes]:
        """A server certificate for ``host`` (a name, or an address) and its key, as PEM."""
        key = ec.generate_private_key(ec.SECP256R1())
        try:
            alternative: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alternative = x509.DNSName(host)
        now = datetime.now(UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(host)).issuer_name(self.certificate.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([alternative]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(self.key, hashes.SHA256()))
        key_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return certificate.public_bytes(serialization.Encoding.PEM), key_pem

    def server_context(self, host: str, folder: Path) -> ssl.SSLContext:
        """A TLS server context presenting a certificate this authority signed for ``host``."""
        certificate, key = self.issue(host)
        certfile, keyfile = folder / f"{host}.crt", folder / f"{host}.key"
        certfile.write_bytes(certificate)
        keyfile.write_bytes(key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certfile, keyfile)
        return context
