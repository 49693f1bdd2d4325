"""`kvq render` and `kvq validate --pool` say what the operator does: its decide() on the
fleet given (tiers, routing, autoscaling, rollout, placement checks), not a renderer of
their own."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from kvq.cli import app
from kvq.decide import decide
from kvq.decide.preview import preview, synthetic_fleet
from kvq.decide.types import Snapshot
from tests.unit.render_cases import gpu, isvc
from tests.unit.test_decide import CATALOGS

runner = CliRunner()
NOW = datetime(2026, 12, 4, tzinfo=UTC)

TIERED: dict[str, Any] = {
    "apiVersion": "kvq.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "llama", "namespace": "team-a"},
    "spec": {
        "model": {"uri": "hf://meta-llama/Meta-Llama-3-8B-Instruct"},
        "kvCache": {"dtype": "fp8"},
        "memory": {"maxModelLen": 8192},
        "tiers": [{"name": "critical", "kvCache": {"dtype": "auto"}, "replicas": 1}],
        "routing": {"parentRefs": [{"name": "inference-gateway"}]},
        "autoscaling": {"maxReplicas": 4},
    },
}


def write(tmp_path: Path, *docs: dict[str, Any], name: str = "isvc.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


def kinds_and_names(stdout: str) -> list[tuple[str, str]]:
    return [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(stdout)]


def test_render_prints_every_tier_the_route_and_the_scaled_object(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            *("render", "-f", write(tmp_path, TIERED), "--pool", "H100"),
            *("--prometheus-url", "http://user:secret@prometheus.monitoring:9090"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert kinds_and_names(result.stdout) == [
        ("ConfigMap", "llama-kvq-evidence"),
        ("Deployment", "llama"),
        ("Service", "llama"),
        ("ScaledObject", "llama"),
        ("ConfigMap", "llama-critical-kvq-evidence"),
        ("Deployment", "llama-critical"),
        ("Service", "llama-critical"),
        ("HTTPRoute", "llama"),
    ]
    # KEDA's trigger metadata is not a secret: the credentials stay out, as in kvq run.
    assert "secret" not in result.stdout
    assert "ownerReferences" not in result.stdout
    deployments = {
        d["metadata"]["name"]: d
        for d in yaml.safe_load_all(result.stdout)
        if d["kind"] == "Deployment"
    }
    args = deployments["llama-critical"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert args[args.index("--kv-cache-dtype") + 1] == "auto"


def test_render_says_what_the_cluster_lacks_instead_of_printing_it(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["render", "-f", write(tmp_path, TIERED), "--pool", "H100", "--no-gateway-api"]
    )
    assert result.exit_code == 0, result.output
    kinds = [kind for kind, _ in kinds_and_names(result.stdout)]
    assert "HTTPRoute" not in kinds and "ScaledObject" not in kinds
    assert "PrometheusUnavailable" in result.stderr
    assert "RoutingUnavailable" in result.stderr


def strategy(stdout: str) -> dict[str, Any]:
    (deployment,) = [d for d in yaml.safe_load_all(stdout) if d["kind"] == "Deployment"]
    rolling: dict[str, Any] = deployment["spec"]["strategy"]["rollingUpdate"]
    return rolling


def test_the_rollout_surges_only_where_the_pool_has_a_free_slot(tmp_path: Path) -> None:
    doc = {**TIERED, "spec": {**TIERED["spec"], "replicas": 2}}
    for key in ("tiers", "routing", "autoscaling"):
        del doc["spec"][key]
    path = write(tmp_path, doc)
    full = runner.invoke(app, ["render", "-f", path, "--pool", "H100", "--gpus-per-node", "2"])
    roomy = runner.invoke(
        app, ["render", "-f", path, "--pool", "H100", "--gpus-per-node", "2", "--node-count", "2"]
    )
    assert full.exit_code == roomy.exit_code == 0, full.output + roomy.output
    assert strategy(full.stdout) == {"maxSurge": 0, "maxUnavailable": 1}
    assert strategy(roomy.stdout) == {"maxSurge": 1, "maxUnavailable": 0}


def qwen(tmp_path: Path, gpus: int) -> str:
    doc = {
        "apiVersion": "kvq.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "qwen"},
        "spec": {
            "model": {"uri": "hf://Qwen/Qwen2.5-7B-Instruct"},
            "kvCache": {"dtype": "fp8"},
            "placement": {"gpusPerReplica": gpus},
        },
    }
    return write(tmp_path, doc, name=f"qwen-{gpus}.yaml")


def test_validate_refuses_a_tensor_parallel_size_the_heads_do_not_divide(tmp_path: Path) -> None:
    path = qwen(tmp_path, 8)
    offline = runner.invoke(app, ["validate", "-f", path])
    on_pool = runner.invoke(app, ["validate", "-f", path, "--pool", "H100"])
    render = runner.invoke(app, ["render", "-f", path, "--pool", "H100"])
    assert offline.exit_code == 0  # the API server cannot know the model's heads
    assert on_pool.exit_code == 1
    assert 'The InferenceService "qwen" cannot run on this fleet:' in on_pool.stdout
    assert "does not divide the model's 28 attention heads" in on_pool.stdout
    assert "valid sizes: 1, 2, 4" in on_pool.stdout
    assert render.exit_code == 2 and render.stdout == ""


def test_validate_refuses_more_gpus_per_replica_than_a_node_has(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["validate", "-f", qwen(tmp_path, 4), "--pool", "H100", "--gpus-per-node", "2"]
    )
    assert result.exit_code == 1
    assert "nodes have 2 GPUs, a replica needs 4" in result.stdout
    ok = runner.invoke(app, ["validate", "-f", qwen(tmp_path, 4), "--pool", "H100"])
    assert ok.exit_code == 0, ok.output
    assert "inferenceservice/qwen valid (default tier: rung requested on pool" in ok.stdout


def test_validate_names_the_layouts_the_model_allows_and_what_spans_nodes(
    tmp_path: Path,
) -> None:
    def service(model: str, parallelism: dict[str, int]) -> str:
        doc = {
            "apiVersion": "kvq.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "big"},
            "spec": {"model": {"uri": model}, "placement": {"parallelism": parallelism}},
        }
        return write(tmp_path, doc, name=f"big-{len(parallelism)}-{model[-4:]}.yaml")

    qwen = service("hf://Qwen/Qwen2.5-7B-Instruct", {"tensor": 8, "pipeline": 1})
    refused = runner.invoke(app, ["validate", "-f", qwen, "--pool", "H100"])
    assert refused.exit_code == 1
    assert (
        "parallelism.tensor 8 does not divide the model's 28 attention heads, which vLLM "
        "refuses at start-up; valid sizes: 1, 2, 4"
    ) in refused.stdout
    two_nodes = service("hf://meta-llama/Llama-3.1-405B-Instruct", {"tensor": 8, "pipeline": 2})
    spans = runner.invoke(app, ["validate", "-f", two_nodes, "--pool", "H100", "--node-count", "2"])
    assert spans.exit_code == 0, spans.output
    assert "rung requested on pool" in spans.stdout
    rendered = runner.invoke(
        app, ["render", "-f", two_nodes, "--pool", "H100", "--node-count", "2"]
    )
    assert rendered.exit_code == 0, rendered.output
    assert "kind: LeaderWorkerSet" in rendered.stdout
    assert "kind: Deployment" not in rendered.stdout
    assert runner.invoke(app, ["validate", "-f", two_nodes]).exit_code == 0  # the API allows it


def node(name: str, product: str, gpus: int, pool: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.product": product, "karpenter.sh/nodepool": pool},
        },
        "status": {
            "capacity": {"nvidia.com/gpu": str(gpus)},
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_render_on_a_clusters_nodes_places_as_the_operator_does(tmp_path: Path) -> None:
    # kubectl get nodes -o yaml: a List. The operator picks the cheapest pool that fits.
    nodes = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            node("h100-a", "NVIDIA-H100-80GB-HBM3", 8, "h100"),
            node("l40s-a", "NVIDIA-L40S", 4, "l40s"),
        ],
    }
    path = write(tmp_path, {**TIERED, "spec": {"model": TIERED["spec"]["model"]}})
    result = runner.invoke(
        app, ["render", "-f", path, "--nodes", write(tmp_path, nodes, name="nodes.yaml")]
    )
    assert result.exit_code == 0, result.output
    (deployment,) = [d for d in yaml.safe_load_all(result.stdout) if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["annotations"]["kvq.dev/pool"] == "l40s"
    assert pod["spec"]["nodeSelector"] == {"karpenter.sh/nodepool": "l40s"}


def test_render_with_rung_prints_what_runs_after_the_engine_refused_the_others(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        {**TIERED, "spec": {"model": TIERED["spec"]["model"], "kvCache": {"dtype": "fp8"}}},
    )
    result = runner.invoke(app, ["render", "-f", path, "--pool", "H100", "--rung", "auto"])
    assert result.exit_code == 0, result.output
    (deployment,) = [d for d in yaml.safe_load_all(result.stdout) if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert args[args.index("--kv-cache-dtype") + 1] == "auto"
    assert deployment["spec"]["template"]["metadata"]["annotations"]["kvq.dev/rung"] == "auto"


def test_the_preview_is_the_plan_decide_makes_for_a_new_service() -> None:
    service = isvc(kvCache={"dtype": "fp8"}, replicas=2)
    fleet = synthetic_fleet(gpu("H100"), node_count=2)
    shown = preview(service, fleet, CATALOGS, now=NOW)
    plan = decide(
        Snapshot(
            isvc=service, nodes=fleet.nodes, pods=(), deployment=None, now=NOW, catalogs=CATALOGS
        )
    )
    assert shown.plan.apply == plan.apply
    assert [o["kind"] for o in shown.objects] == [o["kind"] for o in plan.apply]


def test_render_takes_only_node_objects_from_the_nodes_file(tmp_path: Path) -> None:
    path = write(tmp_path, {**TIERED, "spec": {"model": TIERED["spec"]["model"]}})
    profile = write(tmp_path, {"name": "hetero", "pools": []}, name="profile.yaml")
    result = runner.invoke(app, ["render", "-f", path, "--nodes", profile])
    assert result.exit_code == 2
    assert "holds no Node objects" in result.output


def gpu_pods(gpus: int) -> dict[str, Any]:
    """kubectl get pods -A -o yaml: somebody else's pod holding GPUs of node h100-a."""
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "metadata": {"name": "training", "namespace": "ml"},
                "spec": {
                    "nodeName": "h100-a",
                    "containers": [
                        {"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
                    ],
                },
                "status": {"phase": "Running"},
            }
        ],
    }


def test_the_gpus_other_pods_hold_are_not_free(tmp_path: Path) -> None:
    path = write(tmp_path, {**TIERED, "spec": {"model": TIERED["spec"]["model"]}})
    nodes = write(tmp_path, node("h100-a", "NVIDIA-H100-80GB-HBM3", 8, "h100"), name="n.yaml")

    def run(held: int) -> Any:
        pods = write(tmp_path, gpu_pods(held), name=f"pods-{held}.yaml")
        return runner.invoke(app, ["render", "-f", path, "--nodes", nodes, "--pods", pods])

    roomy, one_left, full = run(6), run(7), run(8)
    assert strategy(roomy.stdout) == {"maxSurge": 1, "maxUnavailable": 0}
    assert strategy(one_left.stdout) == {"maxSurge": 0, "maxUnavailable": 1}
    # A full pool: the operator still applies the Deployment, whose replica waits for a GPU.
    assert full.exit_code == 0, full.output
    assert "Placed WaitingForCapacity" in full.stderr
    assert "room for 0 of 1 replicas now" in " ".join(full.stderr.split())


def test_a_preview_over_nodes_names_the_leaderworkerset_api_it_needs(tmp_path: Path) -> None:
    """The preview is what the operator applies where LeaderWorkerSet is served; it says
    so, and --no-leader-worker-set shows what the operator does without it."""
    example = str(Path(__file__).parents[2] / "examples" / "llama-3.1-405b-two-nodes.yaml")
    fleet = ["--pool", "H100", "--node-count", "2"]
    rendered = runner.invoke(app, ["render", "-f", example, *fleet])
    assert rendered.exit_code == 0, rendered.output
    assert ("LeaderWorkerSet", "llama-405b-group") in kinds_and_names(rendered.stdout)
    need = (
        "a replica spans 2 nodes and runs as LeaderWorkerSet llama-405b-group: the cluster "
        "must serve leaderworkerset.x-k8s.io/v1"
    )
    assert f"note: llama-405b: {need}" in " ".join(rendered.stderr.split())
    valid = runner.invoke(app, ["validate", "-f", example, *fleet])
    assert valid.exit_code == 0, valid.output
    assert f"* needs: {need}" in valid.stdout
    without = runner.invoke(app, ["render", "-f", example, *fleet, "--no-leader-worker-set"])
    assert without.exit_code != 0
    assert f"{LWS_API} is not served: install LeaderWorkerSet" in " ".join(without.output.split())
    # One node per replica needs nothing more.
    single = runner.invoke(app, ["render", "-f", write(tmp_path, TIERED), "--pool", "H100"])
    assert "note:" not in single.stderr


LWS_API = "leaderworkerset.x-k8s.io/v1"
