"""The operator image's install steps, run without Docker: images/operator/install.sh builds
kvq's wheel from a copy of what the Dockerfile copies, installs it into a fresh virtualenv
outside the repository, and the installed `kvq` runs (with its package data)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE = ROOT / "images" / "operator"
INSTALL = IMAGE / "install.sh"
# Every flag the chart's Deployment passes to `kvq run`.
CHART_FLAGS = (
    "--namespace",
    "--all-namespaces",
    "--peering",
    "--standalone",
    "--resync",
    "--workers",
    "--qps",
    "--burst",
    "--grace",
    "--suspect-restarts",
    "--retry-after",
    "--retry-after-max",
    "--max-retries",
    "--metrics-port",
    "--operator-image",
    "--liveness",
)

pytestmark = pytest.mark.helm


def dockerfile_steps() -> tuple[list[str], list[str]]:
    """(sources the build stage copies from the repository, the RUN lines in order)."""
    text = (IMAGE / "Dockerfile").read_text()
    copies = [
        source
        for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M)
        for source in line.split()[:-1]
    ]
    return copies, re.findall(r"^RUN (.+)$", text, re.M)


def test_dockerfile_runs_install_sh_and_a_numeric_non_root_user() -> None:
    copies, runs = dockerfile_steps()
    assert runs == [
        "kvq-install wheel /src /dist",
        "kvq-install venv /dist /opt/kvq && rm -rf /dist /usr/local/bin/kvq-install",
    ]
    text = (IMAGE / "Dockerfile").read_text()
    assert re.search(r"^USER [1-9][0-9]*:[1-9][0-9]*$", text, re.M)
    assert 'ENTRYPOINT ["kvq", "run"]' in text
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11\.\d+-slim-bookworm$", text, re.M)
    assert "images/operator/install.sh" in copies


def test_install_steps_give_a_working_kvq_outside_the_repo(tmp_path: Path) -> None:
    copies, _ = dockerfile_steps()
    src = tmp_path / "src"
    src.mkdir()
    for source in copies:
        if source.startswith("images/"):
            continue  # the install script itself, run from the repository below
        origin = ROOT / source.rstrip("/")
        target = src / source.rstrip("/")
        if origin.is_dir():
            shutil.copytree(
                origin, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy2(origin, target)
    dist, prefix = tmp_path / "dist", tmp_path / "opt" / "kvq"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PYTHON"] = shutil.which("python3") or "python3"
    env["PATH"] = os.pathsep.join(
        p for p in env["PATH"].split(os.pathsep) if ".cache/kvq/venv" not in p
    )
    for step in (["wheel", str(src), str(dist)], ["venv", str(dist), str(prefix)]):
        done = subprocess.run(
            ["sh", str(INSTALL), *step],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    kvq = prefix / "bin" / "kvq"

    def run(*args: str) -> str:
        done = subprocess.run(
            [str(kvq), *args],
            cwd=tmp_path,
            # Wide enough that rich never shortens an option's name in the help table.
            env={**env, "COLUMNS": "250"},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    assert "run" in run("--help")
    # The image ships the operator, not the dev cluster: no dev-cluster or demo command.
    for dev_command in ("dev-cluster", "demo"):
        missing = subprocess.run(
            [str(kvq), dev_command, "--help"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert missing.returncode == 2, missing.stdout[-3000:]
        assert "No such command" in missing.stderr
    help_text = run("run", "--help")
    assert [f for f in CHART_FLAGS if f not in help_text] == []
    # The installed package, not the checkout, with the catalogs `kvq run` loads at start.
    probe = (
        "import kvq\n"
        "from kvq.catalog.engines import load_engine_catalog\n"
        "from kvq.catalog.gpus import load_gpu_catalog\n"
        "from kvq.catalog.models import load_model_catalog\n"
        "load_gpu_catalog(), load_engine_catalog(), load_model_catalog()\n"
        "import importlib.util\n"
        "print(kvq.__file__)\n"
        "dev = ('cryptography', 'e2e', 'kvq.devcluster')\n"
        "print([m for m in dev if importlib.util.find_spec(m)])\n"
    )
    where = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", probe],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert where.returncode == 0, where.stderr[-3000:]
    installed_at, dev_modules = where.stdout.strip().splitlines()
    assert installed_at.startswith(str(prefix))
    # Neither the dev cluster nor its PKI library (cryptography, a dev extra) is installed.
    assert dev_modules == "[]"
    wheel = next(dist.glob("kvq-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        assert [n for n in archive.namelist() if "devcluster" in n or n.startswith("e2e/")] == []
    assert "CustomResourceDefinition" in run("crd")
