"""Where the dev cluster reads its inputs (the repo's e2e/ tree) and keeps its state."""

from __future__ import annotations

import os
from pathlib import Path

# e2e/devcluster/paths.py -> the checkout holding e2e/.
_CHECKOUT = Path(__file__).resolve().parents[2]


def e2e_dir() -> Path:
    """The e2e/ tree: versions.env, cluster profiles, KWOK stages, build script."""
    return Path(os.environ.get("KVQ_E2E_DIR", _CHECKOUT / "e2e"))


def cache_dir() -> Path:
    return Path(os.environ.get("KVQ_CACHE", Path.home() / ".cache" / "kvq"))


def run_dir(name: str) -> Path:
    """State of one named cluster: PKI, kubeconfigs, etcd data, logs, pids."""
    override = os.environ.get("KVQ_RUN_DIR")
    if override:
        return Path(override)
    return cache_dir() / "run" / name


def read_versions(path: Path | None = None) -> dict[str, str]:
    """The pinned component versions (KEY=VALUE lines of e2e/versions.env)."""
    source = path or e2e_dir() / "versions.env"
    versions: dict[str, str] = {}
    for raw in source.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            versions[key.strip()] = value.strip()
    return versions
