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
    wrapper = single["command"][: single["command"].index("--") + 1]
    assert wrapper == ["python3", "/opt/kvq/evidence_wrapper.py", "--"]
    for pod in (leader, worker):
        # The same failure-evidence wrapper as the single-node pod, around every rank.
        assert pod["command"][: len(wrapper)] == wrapper
        assert _flag(pod["command"], "--tensor-parallel-size") == "8"
        assert _flag(pod["command"], "--pipeline-parallel-size") == "2"
        assert _flag(pod["command"], "--nnodes") == "2"
        assert _flag(pod["command"], "--master-addr") == "$(LWS_LEADER_ADDRESS)"
        assert pod["volumeMounts"] == single["volumeMounts"]  # /dev/shm, wrapper, model
        assert pod["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # The leader runs the single-node pod's engine: the API server and rank 0.
    api_server = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    model = ["--model", "meta-llama/Llama-3.1-8B-Instruct"]
    assert leader["command"][3:8] == single["command"][3:8] == [*api_server, *model]
    assert _flag(leader["command"], "--node-rank") == "0"
    assert "--headless" not in leader["command"] and "readinessProbe" in leader
    # A worker is a headless rank: only `vllm serve` acts on --headless (the API server's
    # __main__ would start a whole engine), with the model as its positional argument.
    assert worker["command"][3:8] == [
        "python3",
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
    ]
    assert "--model" not in worker["command"]
    assert _flag(worker["command"], "--node-rank") == "$(LWS_WORKER_INDEX)"
    assert worker["command"][-1] == "--headless"
    # Every other engine flag is the leader's (both end with `--node-rank RANK`).
    assert leader["command"][-2] == worker["command"][-3] == "--node-rank"
    assert worker["command"][8:-3] == leader["command"][8:-2]
    assert "--served-model-name" in worker["command"][8:]
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


def test_an_engine_command_without_a_known_vllm_launch_is_refused_for_workers() -> None:
    deployment, _ = _rendered()
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["command"] = ["python3", "/opt/kvq/evidence_wrapper.py", "--", "my-engine"]
    with pytest.raises(LeaderWorkerSetError, match=r"only through `vllm serve --headless`"):
        leader_worker_set(
            deployment, Layout(tensor=8, pipeline=2), nodes=2, engine_version="0.26.0"
        )


def test_every_rank_of_a_group_gets_the_same_cpu_tier_and_holds_its_own_share() -> None:
    """spec.memory.swapSpaceGiB on a replica over two nodes (vLLM 0.26's KV offloading).
    --kv-offloading-size is the engine's total over every rank of the replica: vLLM's
    CPUOffloadingSpec divides it by the world size into each rank's blocks, and the
    leader's scheduler counts the CPU blocks every worker allocates, so every pod of the
    group must carry the same value (a per-node size would shrink each rank's share and
    disagree across ranks). Each pod's memory request holds its own GPUs' share."""
    service = isvc(
        model={"uri": "hf://meta-llama/Llama-3.1-405B-Instruct"},
        placement={"parallelism": {"tensor": 8, "pipeline": 2}},
        memory={"swapSpaceGiB": 8, "maxModelLen": 8192},
    )
    objects = render_manifests(service, pool(H100), settings(service, H100))
    group = next(o for o in objects if o["kind"] == "LeaderWorkerSet")
    spec = group["spec"]["leaderWorkerTemplate"]
    pods = [spec[t]["spec"]["containers"][0] for t in ("leaderTemplate", "workerTemplate")]
    single = isvc(
        model={"uri": "hf://meta-llama/Llama-3.1-405B-Instruct"},
        placement={"parallelism": {"tensor": 8, "pipeline": 2}},
        memory={"maxModelLen": 8192},
    )
    bare = render_manifests(single, pool(H100), settings(single, H100))
    bare_group = next(o for o in bare if o["kind"] == "LeaderWorkerSet")
    bare_leader = bare_group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    without = bare_leader["spec"]["containers"][0]["resources"]["requests"]["memory"]
    for pod in pods:
        assert _flag(pod["command"], "--kv-offloading-size") == "128"  # 8 GiB x 16 GPUs
        assert _flag(pod["command"], "--kv-offloading-backend") == "native"
        # 8 GiB for each of the pod's own 8 GPUs on top of the pod without a CPU tier.
        asked = _gib(pod["resources"]["requests"]["memory"]) - _gib(without)
        assert asked == 64


def _gib(quantity: str) -> int:
    assert quantity.endswith("Gi"), quantity
    return int(quantity.removesuffix("Gi"))
