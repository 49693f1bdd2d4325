"""What the reconcile observes (Snapshot) and what it must carry out (Plan)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, Literal

from kvq.api.resource import InferenceService
from kvq.api.status import InferenceServiceStatus
from kvq.catalog.engines import EngineCatalog
from kvq.catalog.fp8_accuracy import AccuracyFact, load_accuracy_facts
from kvq.catalog.gpus import GpuCatalog
from kvq.catalog.models import ModelCatalog
from kvq.decide.metrics import EngineReading
from kvq.fallback.ladder import LadderPolicy
from kvq.placement.claims import GpuClaim
from kvq.placement.discovery import DEFAULT_POOL_LABELS, GpuPod, Inventory
from kvq.render.autoscaling import PrometheusAccess

Manifest = dict[str, Any]
DEFAULT_OPERATOR_IMAGE = "kvq/operator:0.1.0"


@dataclass(frozen=True)
class Catalogs:
    """The data kvq decides with, loaded once at start-up."""

    gpus: GpuCatalog
    engines: EngineCatalog
    models: ModelCatalog
    accuracy: tuple[AccuracyFact, ...] = field(default_factory=load_accuracy_facts)
    """Known FP8 accuracy problems (fp8_accuracy.yaml): warnings in status, never refusals."""


@dataclass(frozen=True)
class OperatorConfig:
    """Operator-wide settings (chart values / CLI flags), passed in, never read from env here."""

    pool_labels: tuple[str, ...] = DEFAULT_POOL_LABELS
    # Evidence the executor may fetch when a termination message is not enough.
    log_tail_lines: int = 200
    log_tail_bytes: int = 64 * 1024
    # Engine metrics are written to status at most this often (and only when they moved).
    metrics_min_interval: timedelta = timedelta(seconds=60)
    ladder: LadderPolicy = field(default_factory=LadderPolicy)
    """Repeats, back-offs and the grace period of the fallback ladder and placement."""
    autoscaling_prometheus: PrometheusAccess | None = None
    """Where KEDA reads the engine signals; None: the operator has no Prometheus."""
    operator_image: str = DEFAULT_OPERATOR_IMAGE
    """kvq's own image: the model download (`kvq fetch`, an init container) and the quality
    probe (`kvq probe`, a Job) run it."""


@dataclass(frozen=True)
class Snapshot:
    """Everything one reconcile looks at, read before deciding."""

    isvc: InferenceService
    """The resource as the API server returned it, status included."""
    nodes: Sequence[Mapping[str, Any]]
    """Every Node (from the operator's index)."""
    pods: Sequence[Mapping[str, Any]]
    """Engine pods of this InferenceService (label kvq.dev/inferenceservice=<name>)."""
    deployment: Mapping[str, Any] | None
    """The live engine Deployment, if any."""
    now: datetime
    catalogs: Catalogs
    gpu_pods: Sequence[GpuPod] = ()
    """Every pod bound to a node that holds GPUs (whose ever it is): what fills a pool."""
    claims: Sequence[GpuClaim] = ()
    """What every engine Deployment of kvq's claims of its pool (replicas not bound yet)."""
    inventory: Inventory | None = None
    """The pools with their usage, already counted (the operator keeps them from the
    watches); None: found from `nodes`, `gpu_pods` and `claims`."""
    config: OperatorConfig = field(default_factory=OperatorConfig)
    log_tails: Mapping[str, str] = field(default_factory=dict)
    """Pod name -> bounded tail of its previous container's log, when the executor fetched it."""
    engine_metrics: EngineReading | None = None
    """The engines' latest metrics from Prometheus, when the operator has a Prometheus."""
    keda: bool = False
    """KEDA's ScaledObject API is served (autoscaling can be rendered)."""
    leader_worker_sets: bool = False
    """LeaderWorkerSet's API is served (a replica over several nodes can be rendered)."""
    gateway_api: bool = False
    """The Gateway API's HTTPRoute is served (routing can be rendered)."""
    inference_pools: bool = False
    """The Gateway API Inference Extension's InferencePool is served."""
    owned: Sequence[Mapping[str, Any]] = ()
    """Live objects this InferenceService controls (ConfigMap, Deployment, Service, PDB);
    the ones kvq no longer renders are deleted."""


EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class EventSpec:
    """An Event about the InferenceService: a decision a person should see in `describe`."""

    type: EventType
    reason: str
    message: str


@dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    namespace: str
    name: str


@dataclass(frozen=True)
class NextCheck:
    """When to decide again without a change to the service or its pods."""

    after: timedelta | None = None
    """After this long (a grace period or back-off ends); None: only when something changes."""
    on_gpus: bool = False
    """When GPUs are taken or freed on any pool: the service waits for room (not placed, a
    fallback for lack of room, or the pool caps its autoscaling)."""
    on_nodes: bool = False
    """When nodes come or change: the service runs a fallback a new pool may end."""


@dataclass(frozen=True)
class Plan:
    """What to carry out; the executor decides nothing."""

    apply: tuple[Manifest, ...]
    """Desired objects in full (namespace and ownerReference set); server-side applied."""
    delete: tuple[ObjectRef, ...]
    """Objects kvq rendered before and no longer wants (e.g. the PDB at one replica)."""
    service_status: InferenceServiceStatus
    """The desired `status`; written only when it differs from the stored one."""
    events: tuple[EventSpec, ...]
    """Events for decisions that changed in this reconcile (none when nothing changed)."""
    fetch_log_tails: tuple[str, ...] = ()
    """Pods whose previous-container log the executor should read, then decide again."""
    next_check: NextCheck = field(default_factory=NextCheck)
    pool: str | None = None
    """The pool the service's engines run on or were last placed on (status.placement)."""
    claims: tuple[GpuClaim, ...] | None = None
    """The GPUs the engines this plan applies claim of their pools (placement's assume
    cache counts them before the watch shows them); None: the watch knows best (nothing
    rendered, or an autoscaler sets some engine's replicas)."""
    status_first: bool = False
    """Write status before applying: the plan moves the ladder, and the move must be on
    record before anything acts on it (a crash in between then resumes the move instead
    of undoing it)."""
    keep_live: bool = False
    """Apply nothing and delete nothing: the decision waits on a pool that is gone for now,
    and what runs stays as it is."""

    @cached_property
    def status(self) -> Manifest:
        """`service_status` in wire form: what the executor writes and compares."""
        return self.service_status.to_kube()
