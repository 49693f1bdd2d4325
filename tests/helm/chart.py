"""Running Helm on charts/kvq from tests: the pinned binary, rendering, and values files."""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from e2e.devcluster.binaries import build_components, locate_binaries

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kvq"
RELEASE = "kvq"


@functools.cache
def helm_binary() -> Path:
    """The pinned Helm, built into the version-keyed cache when missing or built with another
    recipe (about 0.1 s when it is there: asked once per session)."""
    build_components(["helm"])
    return locate_binaries().helm


def helm(
    *args: str, kubeconfig: str | Path | None = None, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    command = [str(helm_binary()), *args]
    if kubeconfig is not None:
        command += ["--kubeconfig", str(kubeconfig)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{done.stderr}")
    return done


def values_file(tmp_path: Path, values: Mapping[str, Any], name: str = "values.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(dict(values)))
    return path


def render(
    tmp_path: Path, values: Mapping[str, Any] | None = None, namespace: str = "kvq-system"
) -> list[dict[str, Any]]:
    """`helm template` of the chart with `values`, as a list of objects."""
    args = ["template", RELEASE, str(CHART), "--namespace", namespace]
    if values:
        args += ["--values", str(values_file(tmp_path, values))]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def find(
    docs: Sequence[dict[str, Any]], kind: str, name: str | None = None
) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
