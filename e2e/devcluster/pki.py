"""Certificates and keys for a throwaway cluster: CAs, serving certs, client identities.

EC P-256 keys keep generation in milliseconds, so every `up` gets a fresh PKI. Two CAs, as
kubeadm makes them: the cluster CA (serving and client certificates) and the front-proxy CA,
which signs only the certificate the API server's aggregator presents to extension API
servers (KEDA's metrics server), so no ordinary client can pose as the aggregator.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVICE_CIDR = "10.0.0.0/16"
KUBERNETES_SERVICE_IP = "10.0.0.1"
_VALIDITY = datetime.timedelta(days=30)
SERVER_AUTH, CLIENT_AUTH = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH


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
# The aggregator's identity towards extension API servers (--requestheader-allowed-names).
FRONT_PROXY_CLIENT = Identity("front-proxy-client")


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
    front_proxy_ca: KeyPair
    front_proxy_client: KeyPair

    def client(self, identity: Identity) -> KeyPair:
        return self.clients[identity.name]


def write_pki(directory: Path) -> Pki:
    """Create fresh CAs and every certificate the cluster needs under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _write_ca(directory, "ca", "kvq-dev-ca")
    loopback = ["localhost", "127.0.0.1"]
    service_names = [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        KUBERNETES_SERVICE_IP,
    ]
    apiserver = issue_cert(
        directory, "apiserver", Identity("kube-apiserver"), [SERVER_AUTH], loopback + service_names
    )
    etcd_server = issue_cert(
        directory, "etcd-server", Identity("etcd"), [SERVER_AUTH, CLIENT_AUTH], loopback
    )
    clients = {
        i.name: issue_cert(directory, f"client-{i.name}", i, [CLIENT_AUTH], [])
        for i in CLIENT_IDENTITIES
    }
    front_proxy_ca = _write_ca(directory, "front-proxy-ca", "kvq-dev-front-proxy-ca")
    front_proxy_client = issue_cert(
        directory, "front-proxy-client", FRONT_PROXY_CLIENT, [CLIENT_AUTH], [], ca="front-proxy-ca"
    )

    sa_key = ec.generate_private_key(ec.SECP256R1())
    sa_key_path, sa_pub_path = directory / "sa.key", directory / "sa.pub"
    sa_key_path.write_bytes(_private_pem(sa_key))
    sa_pub_path.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    sa_key_path.chmod(0o600)
    return Pki(
        ca,
        apiserver,
        etcd_server,
        sa_key_path,
        sa_pub_path,
        clients,
        front_proxy_ca,
        front_proxy_client,
    )


def issue_cert(
    directory: Path,
    stem: str,
    identity: Identity,
    usages: list[x509.ObjectIdentifier],
    hosts: list[str],
    ca: str = "ca",
) -> KeyPair:
    """A certificate for `identity` signed by the CA `<directory>/<ca>.crt|key`, written as
    `<directory>/<stem>.crt|key`. Add-ons started later use it on the cluster's PKI dir."""
    ca_cert = x509.load_pem_x509_certificate((directory / f"{ca}.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((directory / f"{ca}.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in identity.groups]
        + [x509.NameAttribute(NameOID.COMMON_NAME, identity.name)]
    )
    now = datetime.datetime.now(datetime.UTC)
    builder = _builder(subject, ca_cert.subject, key.public_key(), now).add_extension(
        x509.ExtendedKeyUsage(usages), critical=False
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_general_name(h) for h in hosts]), critical=False
        )
    return _write(directory, stem, builder.sign(ca_key, hashes.SHA256()), key)


def _write_ca(directory: Path, stem: str, common_name: str) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(name, name, key.public_key(), datetime.datetime.now(datetime.UTC))
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
        .sign(key, hashes.SHA256())
    )
    return _write(directory, stem, cert, key)


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


def tls_directory(
    run_dir: Path, stem: str, usages: list[x509.ObjectIdentifier], hosts: list[str]
) -> Path:
    """`<run_dir>/<stem>-certs` holding tls.crt, tls.key and ca.crt, the layout both
    controller-runtime's webhook server and KEDA read; the certificate names `hosts`."""
    pki_dir = run_dir / "pki"
    pair = issue_cert(pki_dir, stem, Identity(stem), usages, hosts)
    certs = run_dir / f"{stem}-certs"
    certs.mkdir(exist_ok=True)
    shutil.copyfile(pair.cert, certs / "tls.crt")
    shutil.copyfile(pair.key, certs / "tls.key")
    shutil.copyfile(pki_dir / "ca.crt", certs / "ca.crt")
    return certs
