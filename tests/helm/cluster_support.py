"""What the chart's cluster tests share: kubectl, a ServiceAccount's kubeconfig, and
`kvq run` as that ServiceAccount (a subprocess, as the chart's Deployment would run it)."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from e2e.devcluster.binaries import locate_binaries
from e2e.devcluster.ports import allocate_ports
from e2e.devcluster.waits import wait_until

# What kopf and the API server say when RBAC refuses a request (not other 403s, such as
# writes into a namespace being deleted by another test).
REFUSALS = ("is forbidden: User", "Not enough permissions")


def kubectl(
    *args: str, kubeconfig: str | Path, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    command = [str(locate_binaries().kubectl), "--kubeconfig", str(kubeconfig), *args]
    done = subprocess.run(
        command, input=stdin, capture_output=True, text=True, timeout=120, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed:\n{done.stderr}")
    return done


def service_account_kubeconfig(
    admin_kubeconfig: str | Path, namespace: str, account: str, path: Path
) -> Path:
    """A kubeconfig that authenticates as `account` with a fresh token (server and CA: admin's)."""
    token = kubectl(
        "create", "token", account, "-n", namespace, "--duration=1h", kubeconfig=admin_kubeconfig
    ).stdout.strip()
    admin: dict[str, Any] = yaml.safe_load(Path(admin_kubeconfig).read_text())
    cluster = admin["clusters"][0]["cluster"]
    ca = (
        cluster.get("certificate-authority-data")
        or base64.b64encode(Path(cluster["certificate-authority"]).read_bytes()).decode()
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kvq",
                "cluster": {"server": cluster["server"], "certificate-authority-data": ca},
            }
        ],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": {"cluster": "kvq", "user": account}}],
        "current-context": account,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@contextmanager
def operator_running(kubeconfig: Path, args: list[str], log_path: Path) -> Iterator[Path]:
    """`kvq run ARGS` with `kubeconfig`'s identity until the block ends; yields its log file."""
    health = allocate_ports(["health"])["health"]
    kvq = Path(sys.executable).parent / "kvq"
    argv = [
        str(kvq),
        "run",
        *args,
        "--metrics-port=0",
        f"--liveness=http://127.0.0.1:{health}/healthz",
    ]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    with log_path.open("ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    def tail() -> str:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])

    def healthy() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"kvq run exited with {process.returncode}:\n{tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=2) as rsp:
                return bool(rsp.status == 200)
        except OSError:
            return False

    try:
        wait_until(healthy, what="kvq run's /healthz", timeout=90, describe=tail)
        yield log_path
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def refusals_in(log_path: Path) -> list[str]:
    """Log lines where RBAC refused the operator something."""
    return [
        line
        for line in log_path.read_text(errors="replace").splitlines()
        if any(word in line for word in REFUSALS)
    ]


def lists_namespaces(line: str) -> bool:
    """kopf listing or watching Namespaces (it falls back to the exact names it was given)."""
    return bool(
        re.search(r"/api/v1/namespaces(\?| )", line)
        or "to list namespaces" in line
        or "to watch for namespaces" in line
    )
