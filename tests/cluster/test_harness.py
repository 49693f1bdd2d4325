"""The harness itself: a second cluster comes up beside the session's and goes away cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvq.devcluster import cluster

pytestmark = pytest.mark.cluster


def test_up_status_down_leaves_no_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVQ_RUN_DIR", str(tmp_path / "run"))
    kubeconfig = tmp_path / "admin.kubeconfig"

    state = cluster.up(name="harness", profile="single", kubeconfig=kubeconfig, timeout=180)
    status = cluster.status("harness")
    stopped = cluster.down("harness")

    assert status["ready"] is True
    assert set(status["components"]) == {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    }
    assert (
        yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"] == state.server
    )
    assert stopped is True
    assert not [p.pid for p in state.processes if Path(f"/proc/{p.pid}").exists()]
    assert cluster.status("harness")["running"] is False
    assert (tmp_path / "run" / "logs" / "kube-apiserver.log").stat().st_size > 0
