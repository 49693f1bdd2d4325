"""What a pass reads before it decides: all the reading of a pass, in one place.

`read_pass` turns one service's copy of the watch caches (`Observed`) into the `Snapshot`
decide() takes, asking what only I/O tells: whether the optional APIs are served
(discovery) and the engines' metrics (Prometheus). decide() reads nothing itself (the
import contracts keep clients out of the pure core). The one read a decision may ask for
afterwards is a crashed engine's previous log (`with_log_tails`), when its termination
message says too little.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kvq.api.resource import InferenceService
from kvq.api.validation import parse_inference_service
from kvq.catalog.engines import EngineVersionError
from kvq.decide.engine_workload import live_engine
from kvq.decide.metrics import EngineReading
from kvq.decide.types import Snapshot
from kvq.k8s.logs import read_log_tails
from kvq.placement.pool import OwnerKey
from kvq.render.autoscaling import SCALED_OBJECT_API, SCALED_OBJECT_KIND
from kvq.render.leaderworkerset import API_VERSION as LWS_API_VERSION
from kvq.render.routing import HTTP_ROUTE_API, INFERENCE_POOL_API
from kvq.render.settings import RenderError, engine_image_and_version

if TYPE_CHECKING:  # the runtime holds the clients this module reads with
    from kvq.handlers.reconcile import Runtime


@dataclass(frozen=True)
class Observed:
    """One service's view of the watch caches, copied out before the reconcile runs (the
    pools come from the runtime's Fleet when the pass decides)."""

    body: Mapping[str, Any]
    """The InferenceService (a detached copy)."""
    pods: Sequence[Mapping[str, Any]]
    owned: Sequence[Mapping[str, Any]]
    """Objects labelled with this service's name (any incarnation: filtered by owner uid)."""


@dataclass(frozen=True)
class Read:
    """Everything a pass read, ready to decide on."""

    owner: OwnerKey
    snapshot: Snapshot
    """What decide() takes (its pools are added from the Fleet when it decides)."""


def read_pass(runtime: Runtime, raw: dict[str, Any], observed: Observed, now: datetime) -> Read:
    """The service as decide() sees it (raises InvalidInferenceServiceError for a bad spec)."""
    isvc = parse_inference_service(raw)
    uid = raw["metadata"]["uid"]
    owned = [obj for obj in observed.owned if _controlled_by(obj, uid)]
    name = isvc.metadata.name
    deployment = live_engine(owned, name)
    routing = isvc.spec.routing
    snapshot = Snapshot(
        isvc=isvc,
        nodes=(),  # the pools are the fleet's (SerialDecisions.decide)
        pods=observed.pods,
        deployment=deployment,
        now=now,
        catalogs=runtime.catalogs,
        config=runtime.config,
        owned=owned,
        engine_metrics=_engine_metrics(runtime, isvc, deployment),
        keda=_needs_keda(isvc) and runtime.serves(SCALED_OBJECT_API, SCALED_OBJECT_KIND),
        # Only a pipeline over several stages can span nodes: others never ask.
        leader_worker_sets=isvc.spec.placement.pipeline_parallel > 1
        and runtime.serves(LWS_API_VERSION, "LeaderWorkerSet"),
        gateway_api=routing is not None and runtime.serves(HTTP_ROUTE_API, "HTTPRoute"),
        inference_pools=routing is not None
        and routing.inference_pool
        and runtime.serves(INFERENCE_POOL_API, "InferencePool"),
    )
    return Read((isvc.metadata.namespace or "", name), snapshot)


def with_log_tails(runtime: Runtime, read: Read, pod_names: Sequence[str]) -> Read:
    """`read` with the previous logs of the pods a decision asked about."""
    snapshot = read.snapshot
    tails = read_log_tails(runtime.clients, read.owner[0], pod_names, snapshot.pods, runtime.config)
    return replace(read, snapshot=replace(snapshot, log_tails=tails))


def _needs_keda(isvc: InferenceService) -> bool:
    return isvc.spec.autoscaling is not None or any(
        t.autoscaling is not None for t in isvc.spec.tiers
    )


def _engine_metrics(
    runtime: Runtime, isvc: InferenceService, deployment: Mapping[str, Any] | None
) -> EngineReading | None:
    """The engines' metrics from Prometheus (rate-limited by the reader); None without
    a Prometheus or before kvq deployed anything."""
    if runtime.metrics_reader is None or deployment is None:
        return None
    try:
        version = engine_image_and_version(isvc)[1]
        names = runtime.catalogs.engines.capability(version).metrics
    except (RenderError, EngineVersionError):
        return None  # decide() reports the version problem in status
    # The engine Service is named after the InferenceService (the scrape label contract).
    return runtime.metrics_reader.read(isvc.metadata.namespace or "", isvc.metadata.name, names)


def _controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Labels name the InferenceService; only the ownerReference says it is this incarnation."""
    references = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("controller") for r in references)
