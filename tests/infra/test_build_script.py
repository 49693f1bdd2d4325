"""e2e/scripts/build-binaries.sh and its Python driver, with a stand-in `go` (no compiler).

What a person sees during a first build: which component, an estimate, a heartbeat while
`go build` runs, one line naming the log when it fails; and that a built binary is reused
until its recipe changes. The stand-in `go` answers the few subcommands the script uses and
"builds" by sleeping, so these run in seconds.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from e2e.devcluster.binaries import BinaryBuildError, build_components
from e2e.devcluster.waits import wait_until

E2E = Path(__file__).resolve().parents[2] / "e2e"

FAKE_GO = r"""#!/usr/bin/env bash
# go mod init|download|edit and go build, just enough for build-binaries.sh.
set -euo pipefail
case "$1" in
  mod)
    case "$2" in
      init) echo "module $3" >go.mod ;;
      download) echo "{\"GoMod\": \"$FAKE_GO_DIR/dep.mod\"}" ;;
      edit) if [ "${3:-}" = -json ]; then echo '{"Replace": null}'; fi ;;
    esac ;;
  build)
    out=""; prev=""
    for a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done
    echo "compiling $out" >&2
    echo $$ >"$FAKE_GO_DIR/build.pid"
    sleep "${FAKE_GO_BUILD_S:-0}"
    [ -z "${FAKE_GO_FAIL:-}" ] || { echo "fake compile error: $FAKE_GO_FAIL" >&2; exit 1; }
    printf '#!/bin/sh\necho fake\n' >"$out"; chmod +x "$out" ;;
esac
"""


@pytest.fixture
def fake_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout's e2e/ copy (the real script) and a stand-in `go` first on PATH."""
    e2e = tmp_path / "e2e"
    (e2e / "scripts").mkdir(parents=True)
    shutil.copy(E2E / "scripts" / "build-binaries.sh", e2e / "scripts")
    shutil.copy(E2E / "versions.env", e2e)
    tools = tmp_path / "tools"
    tools.mkdir()
    go = tools / "go"
    go.write_text(FAKE_GO)
    go.chmod(go.stat().st_mode | stat.S_IXUSR)
    (tools / "dep.mod").write_text("module example.com/dep\n")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GO_DIR", str(tools))
    monkeypatch.setenv("KVQ_E2E_DIR", str(e2e))
    monkeypatch.setenv("KVQ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVQ_BUILD_HEARTBEAT_S", "1")
    return tmp_path


def run_script(*components: str) -> subprocess.CompletedProcess[str]:
    script = Path(os.environ["KVQ_E2E_DIR"]) / "scripts" / "build-binaries.sh"
    return subprocess.run(
        ["bash", str(script), *components],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_long_build_shows_component_estimate_and_heartbeat(
    fake_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_GO_BUILD_S", "3")

    done = run_script("kwok")

    lines = done.stderr.splitlines()
    assert done.returncode == 0, done.stderr
    assert lines[0].startswith("[build-binaries] 1/1 kwok v0.8.0: building kwok")
    assert "(cold build: about 2:14)" in lines[0]
    heartbeats = [line for line in lines if "still building" in line]
    assert len(heartbeats) >= 2, done.stderr
    assert "elapsed (cold build: about 2:14)" in heartbeats[0]
    assert "compiling" not in done.stderr  # the go command's output goes to the log
    log = (fake_go / "cache" / "logs" / "build-binaries.log").read_text()
    assert "compiling" in log
    assert (fake_go / "cache" / "bin" / "kwok-v0.8.0" / "kwok").is_file()


def test_a_built_binary_is_reused_until_its_recipe_changes(fake_go: Path) -> None:
    first = run_script("helm")
    again = run_script("helm")
    versions = Path(os.environ["KVQ_E2E_DIR"]) / "versions.env"
    # Helm is linked with the control plane's Kubernetes version: a new one relinks it.
    versions.write_text(
        versions.read_text().replace("KUBERNETES_VERSION=v1.", "KUBERNETES_VERSION=v9.")
    )
    changed = run_script("helm")

    assert "built helm" in first.stderr
    assert again.stderr.strip() == "[build-binaries] cached: helm"
    assert "built helm" in changed.stderr
    recipe = (fake_go / "cache" / "bin" / "helm-v3.22.0" / ".recipe").read_text()
    assert "pkg/chartutil.k8sVersionMajor=9" in recipe


def test_a_failed_build_ends_in_one_line_naming_the_log(
    fake_go: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAKE_GO_FAIL", "undefined: x")

    with pytest.raises(BinaryBuildError) as failed:
        build_components(["etcd"])

    log = fake_go / "cache" / "logs" / "build-binaries.log"
    assert str(failed.value) == f"building etcd v3.6.16 failed (exit 1); read {log}"
    assert "fake compile error: undefined: x" in log.read_text()
    relayed = capsys.readouterr().err
    assert "[build-binaries] 1/1 etcd v3.6.16: building etcd" in relayed
    assert "error:" not in relayed  # the caller prints the error once


def test_a_build_past_its_budget_is_stopped_and_says_so(
    fake_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_GO_BUILD_S", "30")

    with pytest.raises(BinaryBuildError, match=r"ran past its budget of 0 min.*; read "):
        build_components(["etcd"], timeout=2)

    # The whole process group went: no go command keeps running after the budget.
    go_pid = int((fake_go / "tools" / "build.pid").read_text())
    wait_until(lambda: not Path(f"/proc/{go_pid}").exists(), what="the go command gone", timeout=10)
    assert not (fake_go / "cache" / "bin" / "etcd-v3.6.16").exists()
