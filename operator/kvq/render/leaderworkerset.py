"""A replica over several nodes as a `leaderworkerset.x-k8s.io/v1` LeaderWorkerSet.

Built from the single-node render (the Deployment and its Service), so every pod of a group
keeps what a single-node pod has: the failure-evidence wrapper around the engine command,
the model source and cache volumes, /dev/shm, tolerations and node selector. What changes:

- One group per replica, `size` = the layout's nodes; each pod takes the node's GPUs
  (tensor x pipeline / nodes).
- vLLM's own multiprocessing launch across nodes (vLLM 0.26.0, vllm/engine/arg_utils.py:
  `--nnodes`, `--node-rank`, `--master-addr`). It exists from vLLM 0.12; older versions
  only launch across nodes with Ray, which kvq does not render.
- The leader runs kvq's usual engine command; the workers run `vllm serve MODEL ...
  --headless` (as `python3 -m vllm.entrypoints.cli.main serve`), because only `vllm serve`
  acts on `--headless`. vLLM 0.26.0's source: vllm/entrypoints/openai/cli_args.py:346-358
  (make_arg_parser) gives every entry point a positional `model_tag` and `--headless`, but
  vllm/entrypoints/openai/api_server.py:787-799 (`__main__`) always runs
  `uvloop.run(run_server(args))`, an API server with a whole engine; it is
  vllm/entrypoints/cli/serve.py that reads it: :52-53 `args.model = args.model_tag`,
  :61-69 `--headless` sets `api_server_count = 0`, :141-142 `run_headless(args)`, and
  :206-224 a rank with `node_rank_within_dp > 0` runs only its MultiprocExecutor workers.
  The model is the positional argument right after `serve`: vllm/utils/argparse_utils.py:
  251-295 only warns for `--model` (and moves it first), but refuses
  `--served-model-name` when the model is not positional.
- The addresses come from LeaderWorkerSet's pod webhook: `LWS_LEADER_ADDRESS` (the
  leader's stable DNS name) and `LWS_WORKER_INDEX` in every container's environment, which
  Kubernetes substitutes for `$(VAR)` in the command.
- Workers serve no HTTP, so they carry no HTTP probes; the leader keeps them.
- The Service selects the leader only (worker index 0): the OpenAI endpoint is the leader's.
- A rank lost breaks the whole NCCL world: the group is recreated when any pod restarts.

render.manifests renders it in place of the Deployment when a replica spans nodes
(placement.pool.nodes_per_replica); decide.engine_workload reads its status (issue 24).
"""

from __future__ import annotations

import copy
from typing import Any

from kvq.planner.layout import Layout
from kvq.render.args import API_SERVER_MODULE, CLI_MODULE

API_VERSION = "leaderworkerset.x-k8s.io/v1"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# The LeaderWorkerSet and the group a pod belongs to (set by LWS's pod webhook).
SET_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
# One value per group, on every pod of it (LWS v0.9.0: pkg/webhooks/pod_webhook.go sets it on
# the leader, pkg/controllers/pod_controller.go copies it to the workers' StatefulSet).
GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
# How strongly a group's pods prefer one topology domain (the scheduler's weights: 1-100).
TOPOLOGY_WEIGHT = 100
# vLLM's first version with --nnodes/--node-rank/--master-addr for its multiprocessing backend.
MULTINODE_MP_SINCE = (0, 12)
GPU = "nvidia.com/gpu"


class LeaderWorkerSetError(ValueError):
    """A layout this engine version cannot launch across nodes."""


def group_name(workload: str) -> str:
    # The LeaderWorkerSet cannot share the workload's name (its leader StatefulSet and
    # headless Service take the LWS's name); "-group" keeps them apart.
    return f"{workload}-group"


def leader_worker_set(
    deployment: dict[str, Any],
    layout: Layout,
    nodes: int,
    engine_version: str,
    topology_key: str | None = None,
) -> dict[str, Any]:
    """The Deployment's replicas as groups of `nodes` pods running one engine each.

    `topology_key` (placement.topology): each pod prefers the domain of that node label
    where the other pods of its group run (a preferred podAffinity whose matchLabelKeys
    takes the pod's own group-key label: Kubernetes 1.33+, MatchLabelKeysInPodAffinity).
    LWS's exclusive-topology annotation is not used: it requires the domain (and one group
    per domain), where kvq only prefers it."""
    if _version(engine_version) < MULTINODE_MP_SINCE:
        raise LeaderWorkerSetError(
            f"vLLM {engine_version} launches across nodes only with Ray; kvq renders vLLM's"
            " own multi-node launch (--nnodes, --node-rank), vLLM 0.12 or later"
        )
    if nodes < 2 or layout.gpus % nodes:
        raise LeaderWorkerSetError(f"{layout.gpus} GPUs do not split over {nodes} nodes")
    template = deployment["spec"]["template"]
    group = {"--nnodes": str(nodes), "--master-addr": "$(LWS_LEADER_ADDRESS)"}
    leader = _pod(template, layout, nodes, {**group, "--node-rank": "0"}, headless=False)
    worker = _pod(
        template, layout, nodes, {**group, "--node-rank": "$(LWS_WORKER_INDEX)"}, headless=True
    )
    meta = deployment["metadata"]
    if topology_key is not None:
        for pod in (leader, worker):
            _prefer_domain(pod, group_name(meta["name"]), topology_key)
    return {
        "apiVersion": API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": {**meta, "name": group_name(meta["name"])},
        "spec": {
            "replicas": deployment["spec"]["replicas"],
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }


def leader_service(service: dict[str, Any]) -> dict[str, Any]:
    """The Service of the OpenAI endpoint, selecting each group's leader only."""
    found = copy.deepcopy(service)
    found["spec"]["selector"] = {**found["spec"]["selector"], WORKER_INDEX_LABEL: "0"}
    return found


def _pod(
    template: dict[str, Any], layout: Layout, nodes: int, flags: dict[str, str], headless: bool
) -> dict[str, Any]:
    pod = copy.deepcopy(template)
    engine = pod["spec"]["containers"][0]
    command = _with_flags(
        engine["command"],
        {
            "--tensor-parallel-size": str(layout.tensor),
            "--pipeline-parallel-size": str(layout.pipeline),
            **flags,
        },
    )
    engine["command"] = _headless(command) if headless else command
    per_pod = str(layout.gpus // nodes)
    for kind in ("requests", "limits"):
        if GPU in engine.get("resources", {}).get(kind, {}):
            engine["resources"][kind][GPU] = per_pod
    if headless:
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            engine.pop(probe, None)
        engine.pop("ports", None)
    return dict(pod)


def _prefer_domain(pod: dict[str, Any], group_set: str, topology_key: str) -> None:
    """Add the preferred term beside any affinity the spec gives."""
    term = {
        "weight": TOPOLOGY_WEIGHT,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": {SET_NAME_LABEL: group_set}},
            "matchLabelKeys": [GROUP_KEY_LABEL],
            "topologyKey": topology_key,
        },
    }
    affinity = pod["spec"].setdefault("affinity", {}).setdefault("podAffinity", {})
    affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(term)


def _headless(command: list[str]) -> list[str]:
    """The same engine command started as `vllm serve MODEL ... --headless`, behind the
    same wrapper: the wrapper's arguments and every engine flag unchanged."""
    for start in range(len(command)):
        if command[start + 1 : start + 3] == ["-m", API_SERVER_MODULE]:
            python, rest = command[start], command[start + 3 :]
            model, rest = _pop_model(rest)
            return [*command[:start], python, "-m", CLI_MODULE, "serve", model, *rest, "--headless"]
        if command[start : start + 2] == ["vllm", "serve"]:  # the `serve` launcher
            return [*command, "--headless"]
    raise LeaderWorkerSetError(
        f"no vLLM launch kvq knows in the engine command {command!r}: a worker rank starts"
        " only through `vllm serve --headless`"
    )


def _pop_model(args: list[str]) -> tuple[str, list[str]]:
    """`--model M` (or `--model=M`) taken out of the arguments."""
    for i, arg in enumerate(args):
        if arg == "--model" and i + 1 < len(args):
            return args[i + 1], [*args[:i], *args[i + 2 :]]
        if arg.startswith("--model="):
            return arg.removeprefix("--model="), [*args[:i], *args[i + 1 :]]
    raise LeaderWorkerSetError(f"the engine command {args!r} names no --model")


def _with_flags(command: list[str], flags: dict[str, str]) -> list[str]:
    """The command with each flag's value replaced (`--f v` or `--f=v`), or appended."""
    out: list[str] = []
    skip = False
    for arg in command:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in flags:
            skip = "=" not in arg
            continue
        out.append(arg)
    for flag, value in flags.items():
        out += [flag, value]
    return out


def _version(text: str) -> tuple[int, int]:
    parts = text.lstrip("v").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise LeaderWorkerSetError(f"engine version {text!r} is not MAJOR.MINOR[.PATCH]") from None
