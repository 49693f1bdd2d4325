"""Kubeconfig files with the credentials embedded, so a copy works anywhere on this host."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml
from e2e.devcluster.pki import CLIENT_AUTH, Identity, KeyPair, issue_cert


def write_kubeconfig(path: Path, *, server: str, ca_cert: Path, client: KeyPair, user: str) -> Path:
    cluster, context = "kvq-dev", f"{user}@kvq-dev"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(client.cert),
                    "client-key-data": _b64(client.key),
                },
            }
        ],
        "contexts": [{"name": context, "context": {"cluster": cluster, "user": user}}],
        "current-context": context,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=True))
    path.chmod(0o600)
    return path


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def addon_kubeconfig(run_dir: Path, server: str, stem: str, identity: Identity) -> Path:
    """An add-on's own client certificate (`client-<stem>`, signed by the cluster's CA) in
    `kubeconfigs/<stem>.kubeconfig`, so the API server's audit log names the add-on."""
    pki_dir = run_dir / "pki"
    return write_kubeconfig(
        run_dir / "kubeconfigs" / f"{stem}.kubeconfig",
        server=server,
        ca_cert=pki_dir / "ca.crt",
        client=issue_cert(pki_dir, f"client-{stem}", identity, [CLIENT_AUTH], []),
        user=identity.name,
    )
