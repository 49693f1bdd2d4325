"""Step 3 of decide(): the manifests of the rung in force, rendered once.

The pod template names what it runs (ladder key, rung, pool) so later failures are charged
to the right place. The rollout keeps serving when the pool has a free GPU slot for a surge
replica; the limits are chosen when the pods are about to change and kept otherwise, so a
pool filling up never rewrites the Deployment by itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvq.api import keys
from kvq.api.keys import API_VERSION, KIND
from kvq.api.resource import InferenceService
from kvq.api.tiers import TierSpec
from kvq.catalog.models import ModelArchitecture
from kvq.decide.place import RungPlacement
from kvq.decide.types import DEFAULT_OPERATOR_IMAGE, Catalogs, Manifest
from kvq.fallback.ladder import Rung
from kvq.placement.choice import PoolVerdict
from kvq.placement.claims import GpuClaim, engine_claims
from kvq.planner.host_tier import HostTierPlan, plan_host_tier
from kvq.render import (
    ONE_AT_A_TIME,
    SURGE,
    DroppedFlag,
    EffectiveSettings,
    Rollout,
    effective_settings,
    engine_args,
    render_manifests,
)


@dataclass(frozen=True)
class Rendered:
    """What the rung in force renders to."""

    effective: EffectiveSettings
    args: tuple[str, ...]
    dropped: tuple[DroppedFlag, ...]
    manifests: tuple[Manifest, ...]
    """Namespaced and owned by the InferenceService."""
    pod_hash: str
    host_tier: HostTierPlan | None = None
    """The KV cache's CPU tier on this pool's plan (None: the engine keeps none)."""
    claims: tuple[GpuClaim, ...] | None = ()
    """What the engine Deployment claims of the pool; None: an autoscaler sets its
    replicas, so only the watch knows."""


def render_rung(
    isvc: InferenceService,
    placement: RungPlacement,
    verdict: PoolVerdict,
    *,
    key: str,
    catalogs: Catalogs,
    deployment: Mapping[str, Any] | None,
    tier: TierSpec | None = None,
    arch: ModelArchitecture | None = None,
    operator_image: str = DEFAULT_OPERATOR_IMAGE,
    replicas_owned_elsewhere: bool = False,
) -> Rendered:
    """The objects for `placement`'s rung on the pool of `verdict` (raises RenderError)."""
    pool = verdict.pool
    rung: Rung = placement.rung
    effective = effective_settings(isvc, pool.gpu, rung.value, engines=catalogs.engines, arch=arch)
    rendered = engine_args(isvc, pool, effective, alias=tier.model_alias() if tier else None)
    annotations = {
        keys.ANNOTATION_LADDER_KEY: key,
        keys.ANNOTATION_RUNG: rung.value,
        keys.ANNOTATION_POOL: pool.name,
    }
    manifests = render_manifests(
        isvc,
        pool,
        effective,
        pod_annotations=annotations,
        tier=tier,
        replicas_owned_elsewhere=replicas_owned_elsewhere,
        fetch_image=operator_image,
    )
    pod_hash = _pod_hash(manifests)
    rollout = _rollout(isvc, verdict, deployment, pod_hash)
    manifests = [_with_rollout(m, rollout) for m in manifests]
    host_tier = None
    if effective.cpu_tier is not None and verdict.plan is not None:
        dtype = rendered.args[rendered.args.index("--kv-cache-dtype") + 1]
        host_tier = plan_host_tier(
            effective.cpu_tier, isvc.spec.memory.swap_space_gib, verdict.plan, dtype
        )
    return Rendered(
        effective=effective,
        args=rendered.args,
        dropped=rendered.dropped,
        manifests=tuple(owned_by(isvc, m) for m in manifests),
        pod_hash=pod_hash,
        host_tier=host_tier,
        claims=None
        if replicas_owned_elsewhere
        else engine_claims(
            isvc.metadata.namespace,
            isvc.metadata.name,
            pool.name,
            isvc.spec.desired_replicas(),
            isvc.spec.placement.gpus_per_replica,
        ),
    )


def _rollout(
    isvc: InferenceService,
    verdict: PoolVerdict,
    deployment: Mapping[str, Any] | None,
    pod_hash: str,
) -> Rollout:
    asked = isvc.spec.rollout
    if asked is not None and (asked.max_surge is not None or asked.max_unavailable is not None):
        # A limit left out is 0, or 1 where the other is 0: both 0 could never progress.
        surge, unavailable = asked.max_surge, asked.max_unavailable
        if surge is None:
            surge = 1 if unavailable == 0 else 0
        if unavailable is None:
            unavailable = 1 if surge == 0 else 0
        return Rollout(surge, unavailable)
    live = _live_rollout(deployment)
    # Nothing serves (the pods crash, or never started): a surge replica could wait for
    # ever for a GPU the failing pods hold, so they are all replaced at once; that also
    # frees a rollout already stuck that way.
    serving = deployment is None or _available(deployment) > 0
    everything = Rollout(max_surge=0, max_unavailable=max(isvc.spec.desired_replicas(), 1))
    if live is not None and _live_hash(deployment) == pod_hash:
        if not serving and _old_pods_left(deployment) and live.max_unavailable == 0:
            return everything
        return live  # the pods are not changing: keep what is there
    if not serving:
        return everything
    # A surge replica needs a slot beyond the ones the service's replicas take.
    return SURGE if verdict.slots > isvc.spec.desired_replicas() else ONE_AT_A_TIME


def _live_rollout(deployment: Mapping[str, Any] | None) -> Rollout | None:
    rolling = ((deployment or {}).get("spec") or {}).get("strategy", {}).get("rollingUpdate")
    if not isinstance(rolling, Mapping):
        return None
    surge, unavailable = rolling.get("maxSurge"), rolling.get("maxUnavailable")
    if isinstance(surge, int) and isinstance(unavailable, int):
        return Rollout(surge, unavailable)
    return None


def _available(deployment: Mapping[str, Any]) -> int:
    available = (deployment.get("status") or {}).get("availableReplicas")
    return available if isinstance(available, int) else 0


def _old_pods_left(deployment: Mapping[str, Any] | None) -> bool:
    """Pods of an earlier template still run: a rollout is under way."""
    status = (deployment or {}).get("status") or {}
    return int(status.get("replicas") or 0) > int(status.get("updatedReplicas") or 0)


def _live_hash(deployment: Mapping[str, Any] | None) -> str | None:
    template = ((deployment or {}).get("spec") or {}).get("template") or {}
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(keys.ANNOTATION_SPEC_HASH)
    return str(value) if value else None


def _with_rollout(manifest: Manifest, rollout: Rollout) -> Manifest:
    if manifest["kind"] != "Deployment":
        return manifest
    strategy = {
        "type": "RollingUpdate",
        "rollingUpdate": {
            "maxSurge": rollout.max_surge,
            "maxUnavailable": rollout.max_unavailable,
        },
    }
    return {**manifest, "spec": {**manifest["spec"], "strategy": strategy}}


def _pod_hash(manifests: list[Manifest]) -> str:
    engine = next(m for m in manifests if m["kind"] in ("Deployment", "LeaderWorkerSet"))
    spec = engine["spec"]
    template = (
        spec["template"] if "template" in spec else spec["leaderWorkerTemplate"]["leaderTemplate"]
    )
    return str(template["metadata"]["annotations"][keys.ANNOTATION_SPEC_HASH])


def owned_by(isvc: InferenceService, manifest: Manifest) -> Manifest:
    """The manifest with namespace and a controller ownerReference (GC deletes children)."""
    metadata = dict(manifest["metadata"])
    metadata["namespace"] = isvc.metadata.namespace
    metadata["ownerReferences"] = [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": isvc.metadata.name,
            "uid": isvc.metadata.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    return {**manifest, "metadata": metadata}
