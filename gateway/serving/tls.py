"""TLS certificates: checks for configured ones, a self-signed one for development."""

from __future__ import annotations

import ipaddress
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.files import FileError, check_private, write_private_files

DEV_CERT_DAYS = 365


def dev_certificate_paths(instance_path: Path) -> tuple[Path, Path]:
    """Where the self-signed development certificate and its key live."""
    folder = instance_path / "tls"
    return folder / "localhost-cert.pem", folder / "localhost-key.pem"


def ensure_dev_certificate(instance_path: Path) -> tuple[Path, Path]:
    """The development certificate for localhost, made on first use."""
    certfile, keyfile = dev_certificate_paths(instance_path)
    if not certfile.exists() and not keyfile.exists():
        cert_pem, key_pem = make_self_signed(("localhost",), ("127.0.0.1", "::1"))
        write_private_files({keyfile: key_pem, certfile: cert_pem})
        certfile.chmod(0o644)  # a certificate is public; only the key stays 0600
    return certfile, keyfile


def make_self_signed(names: tuple[str, ...], addresses: tuple[str, ...]) -> tuple[bytes, bytes]:
    """A fresh P-256 key and a certificate for those names and addresses, as PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.now(UTC)
    alternative_names: list[x509.GeneralName] = [x509.DNSName(name) for name in names]
    alternative_names += [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=DEV_CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName(alternative_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


def check_certificate_pair(certfile: Path, keyfile: Path) -> None:
    """Refuse a missing, unreadable, mismatched or world-readable pair, in one line."""
    if not certfile.is_file():
        raise FileError(f"certificate file {certfile} does not exist")
    check_private(keyfile, "key file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile)
    except ssl.SSLError as error:
        raise FileError(f"cannot use {certfile} with {keyfile}: {error.reason}") from None
    except OSError as error:
        raise FileError(f"cannot read {error.filename}: {error.strerror}") from None
