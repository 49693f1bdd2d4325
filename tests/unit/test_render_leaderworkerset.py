"""A multi-node replica rendered as a LeaderWorkerSet (kvq.render.leaderworkerset): the
single-node pod's wrapper, volumes and settings on every pod, vLLM's multi-node launch per
rank, the leader-only Service."""

from __future__ import annotations

from typing import Any

import pytest

from kvq.planner.layout import Layout
from kvq.render import render_manifests
from kvq.render.leaderworkerset import LeaderWorkerSetError, leader_service, leader_worker_set
from tests.unit.render_cases import isvc, pool, settings

H100 = "NVIDIA-H100-80GB-HBM3"


def _rendered() -> tuple[dict[str, Any], dict[str, Any]]:
    service = isvc(placement={"gpusPerReplica": 8})
    objects = render_manifests(service, pool(H100), settings(service, H100))
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    svc = next(o for o in objects if o["kind"] == "Service")
    return deployment, svc


def _flag(command: list[str], flag: str) -> str:
    assert command.count(flag) == 1, f"{flag} appears {command.count(flag)} times"
    return command[command.index(flag) + 1]


def test_each_rank_launches_vllm_across_nodes_inside_the_evidence_wrapper() -> None:
    deployment, _ = _rendered()
    group = leader_worker_set(
        deployment, Layout(tensor=8, pipeline=2), nodes=2, engine_version="0.26.0"
    )
    assert group["kind"] == "LeaderWorkerSet"
    assert group["metadata"]["name"] == f"{deployment['metadata']['name']}-group"
    spec = group["spec"]["leaderWorkerTemplate"]
    assert spec["size"] == 2
    single = deployment["spec"]["template"]["spec"]["containers"][0]
    leader = spec["leaderTemplate"]["spec"]["containers"][0]
    worker = spec["workerTemplate"]["spec"]["containers"][0]
    for pod in (leader, worker):
        # The same wrapper and engine invocation as the single-node pod.
        assert pod["command"][:4] == single["command"][:4]
        assert _flag(pod["command"], "--tensor-parallel-size") == "8"
        assert _flag(pod["command"], "--pipeline-parallel-size") == "2"
        assert _flag(pod["command"], "--nnodes") == "2"
        assert _flag(pod["command"], "--master-addr") == "$(LWS_LEADER_ADDRESS)"
        assert pod["volumeMounts"] == single["volumeMounts"]  # /dev/shm, wrapper, model
        assert pod["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert _flag(leader["command"], "--node-rank") == "0"
    assert "--headless" not in leader["command"] and "readinessProbe" in leader
    assert _flag(worker["command"], "--node-rank") == "$(LWS_WORKER_INDEX)"
    assert worker["command"][-1] == "--headless"
    assert "readinessProbe" not in worker and "ports" not in worker
    assert (
        spec["leaderTemplate"]["spec"]["volumes"]
        == deployment["spec"]["template"]["spec"]["volumes"]
    )


def test_the_service_reaches_leaders_only() -> None:
    _, svc = _rendered()
    selector = leader_service(svc)["spec"]["selector"]
    assert selector == {**svc["spec"]["selector"], "leaderworkerset.sigs.k8s.io/worker-index": "0"}


def test_an_engine_without_vllms_own_multinode_launch_is_refused() -> None:
    deployment, _ = _rendered()
    with pytest.raises(LeaderWorkerSetError, match=r"only with Ray.*0\.12 or later"):
        leader_worker_set(
            deployment, Layout(tensor=8, pipeline=2), nodes=2, engine_version="0.11.2"
        )
    with pytest.raises(LeaderWorkerSetError, match="do not split over 3 nodes"):
        leader_worker_set(
            deployment, Layout(tensor=8, pipeline=2), nodes=3, engine_version="0.26.0"
        )
