"""What the operator applies for an InferenceService on a fleet, decided without a cluster.

`kvq render` and `kvq validate --pool` call this: a snapshot as the operator sees a service
created now (no status, no pods of its own, nothing deployed yet), on the nodes given (a
synthetic pool, or Node objects read from a cluster, with the GPU pods bound to them),
decided by the same `decide()` the operator runs. The objects are `Plan.apply`; nothing
here renders on its own, so the preview cannot drift from what the operator does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvq.api import keys
from kvq.api.resource import InferenceService
from kvq.api.status import Condition, FallbackAttempt, FallbackStatus, InferenceServiceStatus
from kvq.catalog.gpus import GpuModel
from kvq.decide.decide import decide
from kvq.decide.types import Catalogs, Manifest, OperatorConfig, Plan, Snapshot
from kvq.fallback.key import ladder_key
from kvq.fallback.ladder import Rung, rfc3339
from kvq.placement.discovery import GpuPod, discover_pools
from kvq.placement.pool import gfd_product_value
from kvq.render.leaderworkerset import API_VERSION as LWS_API_VERSION

# Conditions that say something the spec asks for is not applied (or not as asked), or that
# the replicas applied wait for room on their pool.
_WARN_WHEN_FALSE = ("Placed", "Autoscaling", "Routing")


@dataclass(frozen=True)
class Fleet:
    """The cluster the preview places on: its Node objects and the GPU pods bound to them."""

    nodes: tuple[Mapping[str, Any], ...]
    gpu_pods: tuple[GpuPod, ...] = ()


@dataclass(frozen=True)
class ServedApis:
    """The optional APIs the cluster serves (the operator asks API discovery)."""

    keda: bool = True
    gateway_api: bool = True
    inference_pools: bool = True
    leader_worker_sets: bool = True


@dataclass(frozen=True)
class Preview:
    name: str
    objects: tuple[Manifest, ...]
    """`Plan.apply`, as a person can apply it: without the ownerReferences (they name the
    live InferenceService's uid, which only the cluster knows) and without an empty
    namespace."""
    plan: Plan
    refusal: str | None
    """Why the operator applies nothing for this service (None: it applies `objects`)."""
    stalled: str | None
    """Why a part of the service cannot run (a tier no pool fits) while the rest is applied."""
    warnings: tuple[str, ...]
    """What the spec asks for and the operator does not apply (autoscaling, routing), and
    replicas that wait for room on a full pool."""
    decision: str
    """The rung and pool in force, in one line."""
    requires: tuple[str, ...] = ()
    """APIs the objects need that a cluster may not serve (a LeaderWorkerSet's): the
    preview assumes them, as the operator finds them served."""


def synthetic_fleet(
    gpu: GpuModel,
    *,
    gpus_per_node: int = 8,
    node_count: int = 1,
    pool: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> Fleet:
    """`node_count` free, Ready nodes of `gpu` as GPU Feature Discovery labels them (and
    labelled `kvq.dev/pool: <pool>` when a pool is named), tainted nvidia.com/gpu."""
    node_labels = {keys.GFD_PRODUCT_LABEL: gfd_product_value(gpu), **(labels or {})}
    if pool:
        node_labels["kvq.dev/pool"] = pool
    stem = (pool or gpu.product).lower()
    nodes = tuple(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": f"{stem}-{index}", "labels": dict(node_labels)},
            "spec": {"taints": [{"key": keys.GPU_TAINT_KEY, "effect": "NoSchedule"}]},
            "status": {
                "capacity": {keys.GPU_RESOURCE: str(gpus_per_node)},
                "allocatable": {keys.GPU_RESOURCE: str(gpus_per_node)},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        for index in range(node_count)
    )
    return Fleet(nodes)


def preview(
    isvc: InferenceService,
    fleet: Fleet,
    catalogs: Catalogs,
    *,
    now: datetime,
    config: OperatorConfig | None = None,
    apis: ServedApis | None = None,
    rung: Rung | None = None,
) -> Preview:
    """The operator's plan for `isvc` created now on `fleet`.

    `rung`: the plan once the engine has refused every other rung at start-up (the ladder
    then runs this one): what the operator applies after a runtime fallback.
    """
    config = config or OperatorConfig()
    apis = apis or ServedApis()
    meta = isvc.metadata
    live = isvc.model_copy(
        update={
            "metadata": meta.model_copy(update={"generation": meta.generation or 1}),
            "status": _refused_but(isvc, fleet, catalogs, config, rung, now),
        }
    )
    plan = decide(
        Snapshot(
            isvc=live,
            nodes=fleet.nodes,
            pods=(),
            deployment=None,
            now=now,
            catalogs=catalogs,
            gpu_pods=fleet.gpu_pods,
            config=config,
            keda=apis.keda,
            gateway_api=apis.gateway_api,
            inference_pools=apis.inference_pools,
            leader_worker_sets=apis.leader_worker_sets,
        )
    )
    status = plan.service_status
    refusal = None if plan.apply else _why_nothing(status)
    in_force = status.fallback.active_rung if status.fallback else None
    if refusal is None and rung is not None and in_force != rung.value:
        refusal = f"the operator runs the {in_force} rung, not {rung.value}: " + (
            "spec.fallback.enabled is false" if not isvc.spec.fallback.enabled else "see status"
        )
    stalled = _condition(status.conditions, "Stalled")
    return Preview(
        name=meta.name,
        objects=tuple(_appliable(m) for m in plan.apply),
        plan=plan,
        refusal=refusal,
        stalled=stalled.message
        if refusal is None and stalled and stalled.status == "True"
        else None,
        warnings=tuple(_warnings(status)),
        decision=_decision(status),
        requires=tuple(_requires(plan.apply)),
    )


def _refused_but(
    isvc: InferenceService,
    fleet: Fleet,
    catalogs: Catalogs,
    config: OperatorConfig,
    rung: Rung | None,
    now: datetime,
) -> InferenceServiceStatus | None:
    """A status whose ladder history says the engine refused every rung but `rung`, on
    every pool of the fleet (a refusal binds its pool only)."""
    if rung is None:
        return None
    key = ladder_key(isvc.spec)
    pools = discover_pools(fleet.nodes, catalogs.gpus, config.pool_labels).pools
    attempts = [
        FallbackAttempt.model_validate(
            {
                "from": other.value,
                "to": rung.value,
                "cause": "Refused",
                "reason": f"Previewed on the {rung.value} rung (kvq render --rung).",
                "time": rfc3339(now),
                "generation": isvc.metadata.generation or 1,
                "key": key,
                "pool": pool.name,
            }
        )
        for other in Rung
        if other is not rung
        for pool in pools
    ]
    return InferenceServiceStatus(
        fallback=FallbackStatus(active_rung=rung.value, key=key, attempts=attempts[-64:])
    )


def _appliable(manifest: Manifest) -> Manifest:
    metadata = {
        k: v
        for k, v in manifest["metadata"].items()
        if k != "ownerReferences" and not (k == "namespace" and not v)
    }
    return {**manifest, "metadata": metadata}


def _why_nothing(status: InferenceServiceStatus) -> str:
    """The sentence the operator writes when it applies nothing: Stalled's, else Placed's,
    else Ready's."""
    for kind, bad in (("Stalled", "True"), ("Placed", "False"), ("Ready", "False")):
        found = _condition(status.conditions, kind)
        if found is not None and found.status == bad and found.message:
            return found.message
    return "the operator applies nothing for this service"


def _requires(objects: Sequence[Manifest]) -> list[str]:
    """What the cluster must serve for `objects` beyond Kubernetes itself (kvq's own CRD
    aside; KEDA's and the Gateway API's objects are previewed by their own flags)."""
    found = []
    for group in (m for m in objects if m["kind"] == "LeaderWorkerSet"):
        size = group["spec"]["leaderWorkerTemplate"]["size"]
        found.append(
            f"a replica spans {size} nodes and runs as LeaderWorkerSet "
            f"{group['metadata']['name']}: the cluster must serve {LWS_API_VERSION} (install "
            "LeaderWorkerSet, its controller and CRD; without it the operator applies nothing "
            "and says so: kvq render --no-leader-worker-set previews that)"
        )
    return found


def _warnings(status: InferenceServiceStatus) -> list[str]:
    found: list[str] = []
    for kind in _WARN_WHEN_FALSE:
        cond = _condition(status.conditions, kind)
        if cond is not None and cond.status == "False" and cond.message:
            found.append(f"{kind} {cond.reason}: {cond.message}")
    return found


def _decision(status: InferenceServiceStatus) -> str:
    parts = []
    for tier, conditions, fallback, placement in [
        (None, status.conditions, status.fallback, status.placement),
        *((t.name, t.conditions, t.fallback, t.placement) for t in status.tiers),
    ]:
        rung = fallback.active_rung if fallback else None
        pool = placement.pool if placement else None
        fell = _condition(conditions, "FallbackActive")
        why = f" ({fell.message})" if fell is not None and fell.status == "True" else ""
        where = f"tier {tier}" if tier else "default tier"
        parts.append(f"{where}: rung {rung or 'none'} on pool {pool or 'none'}{why}")
    return "; ".join(parts)


def _condition(conditions: Sequence[Condition], kind: str) -> Condition | None:
    return next((c for c in conditions if c.type == kind), None)


__all__ = ["Fleet", "Preview", "ServedApis", "preview", "synthetic_fleet"]
