"""Certificates and keys for a throwaway cluster: one CA, serving certs, client identities.

EC P-256 keys keep generation in milliseconds, so every `up` gets a fresh PKI.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVICE_CIDR = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"
_VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Identity:
    """A client certificate: user name (CN) and groups (O)."""

    name: str
    groups: tuple[str, ...] = ()


# Who talks to the API server. The admin and KWOK are cluster admins; the controller
# manager and scheduler get their built-in RBAC roles; the viewer gets nothing by default.
ADMIN = Identity("kvq-dev-admin", ("system:masters",))
CONTROLLER_MANAGER = Identity("system:kube-controller-manager")
SCHEDULER = Identity("system:kube-scheduler")
KWOK = Identity("kvq-kwok", ("system:masters",))
VIEWER = Identity("kvq-dev-viewer")
APISERVER_ETCD_CLIENT = Identity("kube-apiserver-etcd-client")
CLIENT_IDENTITIES = (ADMIN, CONTROLLER_MANAGER, SCHEDULER, KWOK, VIEWER, APISERVER_ETCD_CLIENT)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    ca: KeyPair
    apiserver: KeyPair
    etcd_server: KeyPair
    service_account_key: Path
    service_account_pub: Path
    clients: dict[str, KeyPair]

    def client(self, identity: Identity) -> KeyPair:
        return self.clients[identity.name]


def write_pki(directory: Path) -> Pki:
    """Create a fresh CA and every certificate the cluster needs under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvq-dev-ca")])
    now = datetime.datetime.now(datetime.UTC)
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca = _write(directory, "ca", ca_cert, ca_key)

    def issue(
        stem: str, identity: Identity, usages: list[x509.ObjectIdentifier], hosts: list[str]
    ) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name(
            [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in identity.groups]
            + [x509.NameAttribute(NameOID.COMMON_NAME, identity.name)]
        )
        builder = _builder(subject, ca_name, key.public_key(), now).add_extension(
            x509.ExtendedKeyUsage(usages), critical=False
        )
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_general_name(h) for h in hosts]), critical=False
            )
        return _write(directory, stem, builder.sign(ca_key, hashes.SHA256()), key)

    server, client = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH
    loopback = ["localhost", "127.0.0.1"]
    service_names = [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        KUBERNETES_SERVICE_IP,
    ]
    apiserver = issue("apiserver", Identity("kube-apiserver"), [server], loopback + service_names)
    etcd_server = issue("etcd-server", Identity("etcd"), [server, client], loopback)
    clients = {i.name: issue(f"client-{i.name}", i, [client], []) for i in CLIENT_IDENTITIES}

    sa_key = ec.generate_private_key(ec.SECP256R1())
    sa_key_path, sa_pub_path = directory / "sa.key", directory / "sa.pub"
    sa_key_path.write_bytes(_private_pem(sa_key))
    sa_pub_path.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    sa_key_path.chmod(0o600)
    return Pki(ca, apiserver, etcd_server, sa_key_path, sa_pub_path, clients)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> KeyPair:
    pair = KeyPair(directory / f"{stem}.crt", directory / f"{stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(_private_pem(key))
    pair.key.chmod(0o600)
    return pair
