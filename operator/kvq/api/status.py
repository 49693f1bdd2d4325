"""`status` of an InferenceService: what kvq decided and observed. Written only by kvq."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kvq.api.base import KubeModel

# Every condition kvq writes, in the order status lists them.
ConditionType = Literal[
    "Ready",
    "Reconciling",
    "Stalled",
    "Placed",
    "FallbackActive",
    "Degraded",
    "CapacityMismatch",
    "Autoscaling",
    "Routing",
    "QualityVerified",
    "KnownAccuracyRisk",
]
ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(KubeModel):
    """A kstatus-style condition (`kubectl wait --for=condition=Ready kis/NAME` reads these)."""

    type: Annotated[str, Field(min_length=1, max_length=64)]
    """Ready, Reconciling, Stalled, Placed, FallbackActive, Degraded or CapacityMismatch."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: Annotated[str, Field(max_length=128)] = ""
    """One CamelCase word for programs."""
    message: Annotated[str, Field(max_length=4096)] = ""
    """One or two sentences for people."""
    last_transition_time: str | None = None
    """When status last changed (RFC 3339)."""
    observed_generation: int | None = None
    """The spec generation this condition describes."""


class IgnoredSetting(KubeModel):
    """A spec field the chosen engine version cannot honour, and why."""

    field: str
    """The spec field, e.g. spec.memory.swapSpaceGiB."""
    reason: str
    """Why it was not rendered."""


class EffectiveStatus(KubeModel):
    """What is actually rendered, after placement and fallback."""

    kv_cache_dtype: str | None = None
    """The KV-cache dtype the engine runs with (vLLM's value, e.g. int8_per_token_head)."""
    model_uri: str | None = None
    """The model actually served (the AWQ variant on the awq rung)."""
    quantization: str | None = None
    """Weight quantization passed to vLLM (awq_marlin or awq), if any."""
    engine_version: str | None = None
    """vLLM version the arguments were rendered for."""
    image: str | None = None
    """Engine image."""
    engine_args: list[str] = Field(default_factory=list)
    """The exact `vllm serve` arguments rendered."""
    args_hash: str | None = None
    """Hash of the rendered pod spec; changes roll the Deployment."""
    ignored: list[IgnoredSetting] = Field(default_factory=list)
    """Spec settings the engine version cannot honour (e.g. swap space on vLLM 0.18+)."""


class PlacementStatus(KubeModel):
    """The node pool chosen for the replicas."""

    pool: str | None = None
    """Node pool name."""
    gpu_product: str | None = None
    """GPU product of the pool (catalog name)."""
    compute_capability: str | None = None
    """CUDA compute capability, e.g. 9.0."""
    gpu_memory_mi_b: int | None = Field(default=None, alias="gpuMemoryMiB")
    """Memory of one GPU in MiB, as the driver reports it."""


class GpuTierStatus(KubeModel):
    """The KV cache in GPU memory, one replica (all its GPUs)."""

    tokens: int | None = None
    """KV tokens it holds."""
    bytes: int | None = None
    """Its size in bytes: whole blocks, all GPUs of the replica."""
    dtype: str | None = None
    """What it stores (vLLM's --kv-cache-dtype value)."""


class CpuTierStatus(KubeModel):
    """The KV cache's tier in host memory (spec.memory.swapSpaceGiB), one replica."""

    mode: Literal["swap", "offload"] | None = None
    """swap: vLLM's V0 swap space (a preempted sequence's blocks swapped out and back in);
    offload: V1 KV offloading (blocks kept in host memory and loaded back on a prefix hit
    instead of being recomputed)."""
    backend: str | None = None
    """The offloading backend (native or lmcache)."""
    connector: str | None = None
    """The KV connector vLLM runs for it (named in the engine's log)."""
    tokens: int | None = None
    """KV tokens it holds: whole blocks of the GPU cache's size."""
    bytes: int | None = None
    """Pinned host memory it takes, all GPUs of the replica (in the pod's memory request)."""
    dtype: str | None = None
    """What it stores: the GPU cache's blocks as they are, so the GPU cache's dtype."""
    note: str = ""
    """What to know about it on this engine version."""


class LayoutStatus(KubeModel):
    """How one replica's GPUs split the model, as planned."""

    tensor: int
    """Tensor parallel size: GPUs that shard every layer, within one node."""
    pipeline: int
    """Pipeline stages: each holds a run of layers on its own tensor-parallel GPUs."""
    nodes_per_replica: int
    """Nodes one replica spans."""
    layers_per_stage: list[int]
    """Layers of each stage, first to last, as vLLM splits them."""
    bounding_stage: int | None = None
    """The stage (1-based) whose GPUs have room for the fewest KV blocks: vLLM gives every
    stage that count (only with more than one stage)."""


class CapacityStatus(KubeModel):
    """What each replica holds, computed before anything is scheduled."""

    kv_bytes_per_token: int | None = None
    """KV-cache bytes per token for the whole model at the effective dtype."""
    kv_tokens: int | None = None
    """Tokens that fit in the KV cache of one replica."""
    max_concurrent_sequences: float | None = None
    """Sequences of maxModelLen tokens that fit at once: vLLM's "Maximum concurrency" (for
    sliding-window and Mamba hybrids more than kvTokens / maxModelLen would say)."""
    kv_layout: str | None = None
    """How vLLM's KV-cache manager groups the layers (full, sliding, chunked, state), when
    there is more than one kind; padding layers it adds are counted."""
    ratio_vs_auto: float | None = None
    """KV tokens relative to the uncompressed (auto) cache on the same GPUs."""
    max_model_len: int | None = None
    """Context length the concurrency is counted at."""
    gpu_tier: GpuTierStatus | None = None
    """The KV cache in GPU memory (the figures above are its)."""
    cpu_tier: CpuTierStatus | None = None
    """The KV cache's tier in host memory, when the engine keeps one."""
    layout: LayoutStatus | None = None
    """Tensor x pipeline parallel of one replica, and the layers of each stage."""


FallbackCause = Literal[
    "Refused",
    "Suspect",
    "Incompatible",
    "Capacity",
    "Retry",
    "Recovered",
    "QualityRegression",
    "Cleared",
]


class FallbackAttempt(KubeModel):
    """One move on the fallback ladder (down, or back up), as kvq decided it."""

    from_: str = Field(alias="from")
    """The rung moved from: requested, auto or awq."""
    to: str
    """The rung moved to: requested, auto or awq; none when no rung was left."""
    cause: FallbackCause
    """Refused (the engine refused the dtype), Suspect (an unknown start-up crash repeated),
    Incompatible (no pool can run the rung), Capacity (no pool can run it now, past the grace
    period), Retry (back to a suspect rung after its back-off, or by hand), Recovered (back
    up: the rung can run again), QualityRegression, Cleared (back from a Suspect fallback: the
    same crash happened on the fallback rung, so the dtype was not the cause)."""
    reason: str
    """Why, in one sentence."""
    evidence: Annotated[str, Field(max_length=2048)] = ""
    """Excerpt of the engine's error that triggered the move (credentials redacted)."""
    evidence_from: Annotated[str, Field(max_length=320)] | None = None
    """Whose engine the evidence is from when a replica spans nodes: the rank and pod of
    its group, e.g. `worker 1 (pod llama-group-0-1)` or `leader (pod llama-group-0)`
    (the group's ranks fail together; the most actionable rank's verdict moves it)."""
    time: str
    """When (RFC 3339)."""
    generation: int
    """Spec generation when the move was made."""
    key: str = ""
    """The ladder key: a hash of what decides whether the engine accepts the dtype (model,
    AWQ model, kvCache, engine image, args and env, GPUs per replica, context length). Moves
    of another key do not bind the current spec; replicas, labels and annotations are not
    part of it."""
    pool: str | None = None
    """The pool the rung moved from ran on (a refusal binds that pool only)."""
    retry_after: str | None = None
    """Suspect moves: when the rung moved from is tried again (RFC 3339)."""
    signature: Annotated[str, Field(max_length=256)] | None = None
    """Suspect and Cleared moves: the crash's normalised root-cause line. A Suspect move's crash
    seen again on the rung it fell back to clears the dtype (a Cleared move), and that crash
    never moves the ladder again for this key."""


class FailureTally(KubeModel):
    """Unknown start-up crashes under a quantized dtype, counted until they repeat enough to
    fall back (one crash proves nothing: a flaky hub or node looks the same)."""

    key: str
    """The ladder key the crashes belong to."""
    rung: str
    """The rung that crashed."""
    pool: str | None = None
    """The pool it crashed on."""
    signature: str
    """The crash's normalised root-cause line; a different one starts a new count."""
    count: int
    """Crashes with this signature seen so far."""
    seen: Annotated[list[str], Field(max_length=32)] = Field(default_factory=list)
    """Which terminations were counted (pod/finish time), so none is counted twice."""


class FallbackStatus(KubeModel):
    """The fallback ladder's history for this InferenceService."""

    active_rung: str | None = None
    """The rung in force: requested, auto or awq; none when no rung can run."""
    key: str | None = None
    """The ladder key of the current spec (see attempts[].key)."""
    attempts: Annotated[list[FallbackAttempt], Field(max_length=64)] = Field(default_factory=list)
    """Every move, oldest first (the newest 20 are kept)."""
    tally: FailureTally | None = None
    """Unknown crashes being counted before a suspect fallback."""
    retry_token: str | None = None
    """The last value of the kvq.dev/retry-requested annotation kvq acted on."""
    reset_at: str | None = None
    """When the ladder was last reset by hand: earlier moves no longer bind (RFC 3339)."""


class MetricsStatus(KubeModel):
    """Engine metrics read from Prometheus."""

    kv_cache_usage: float | None = None
    """Fraction of the KV cache in use (vllm:kv_cache_usage_perc)."""
    requests_running: float | None = None
    """Requests being decoded (vllm:num_requests_running)."""
    requests_waiting: float | None = None
    """Requests queued (vllm:num_requests_waiting)."""
    engine_kv_cache_dtype: str | None = None
    """cache_dtype reported by the engine (vllm:cache_config_info)."""
    engine_kv_tokens: int | None = None
    """KV capacity in tokens reported by the engine."""
    observed_at: str | None = None
    """When the stored figures were read (RFC 3339). kvq reads more often but rewrites
    status only when a figure moved, at most once a minute."""


class AutoscalingSignals(KubeModel):
    """The engine signals behind the last scaling decision (from Prometheus)."""

    kv_cache_usage: float | None = None
    """KV-cache usage of the fullest replica."""
    requests_waiting: float | None = None
    """Queued requests, all replicas."""
    requests_running: float | None = None
    """Running requests, all replicas."""
    observed_at: str | None = None
    """When they were read (RFC 3339)."""


class AutoscalingStatus(KubeModel):
    """What the autoscaler asks for and what limits it."""

    current_replicas: int | None = None
    """Engine pods that exist."""
    desired_replicas: int | None = None
    """spec.replicas (the autoscaler's), within [minReplicas, maxReplicas]."""
    pool_max_replicas: int | None = None
    """Replicas the chosen pool can hold now (its free GPUs and the service's own)."""
    limited_by: str | None = None
    """pool when the pool, not the load, caps the replicas; load otherwise."""
    signals: AutoscalingSignals | None = None
    replicas_with_auto_cache: int | None = None
    """Replicas the same KV-bound load would need with the uncompressed (auto) cache:
    desired replicas times the planner's ratio (an fp8 cache holds twice the tokens)."""
    scaled_object: str | None = None
    """The KEDA ScaledObject kvq renders (same name as the InferenceService)."""
    signals_used: list[str] = Field(default_factory=list)
    """The targets it scales on (kvCacheUsage, requestsWaiting, runningFraction): with KV
    offloading kvCacheUsage is left out (status.effective.ignored says why)."""


class TierStatus(KubeModel):
    """One extra tier: its own placement, ladder, capacity and readiness."""

    name: str
    """The tier's name (spec.tiers[].name)."""
    conditions: Annotated[
        list[Condition],
        Field(
            json_schema_extra={
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
        ),
    ] = Field(default_factory=list)
    """The tier's Ready, Reconciling, Stalled, Placed, FallbackActive and Degraded."""
    effective: EffectiveStatus | None = None
    placement: PlacementStatus | None = None
    capacity: CapacityStatus | None = None
    fallback: FallbackStatus | None = None
    autoscaling: AutoscalingStatus | None = None
    replicas: int | None = None
    """The tier's engine pods."""
    ready_replicas: int | None = None
    """The tier's ready engine pods."""


class QualityStatus(KubeModel):
    """The last quality probe of a quantized rollout (kvq probe)."""

    probed_hash: str | None = None
    """The rendering that was probed (status.effective.argsHash at the time)."""
    kv_cache_dtype: str | None = None
    """The KV cache the engine ran (as the engine reported it)."""
    verdict: Literal["Pass", "Fail", "Unknown"] | None = None
    """Pass, Fail, or Unknown (the probe could not judge: never counted as a failure)."""
    reason: str = ""
    """Why, in one sentence."""
    scores: dict[str, float] = Field(default_factory=dict)
    """The probe's scores (needle.accuracy, json.validRate, ...)."""
    checks: list[str] = Field(default_factory=list)
    """Each threshold with its value, e.g. needle.accuracy>=0.9: 0.95 (pass)."""
    time: str | None = None
    """When the probe finished (RFC 3339)."""
    job: str | None = None
    """The probe Job."""


class AccuracyRisk(KubeModel):
    """A known FP8 KV-cache accuracy problem that matches what runs (kvq's catalog,
    operator/kvq/catalog/fp8_accuracy.yaml): a warning, never a refusal."""

    id: str
    """The fact's id in kvq's catalog."""
    severity: Literal["high", "low"]
    """high: wrong or unusable answers were reported; low: a modest, consistent drop."""
    summary: str
    """What was reported, and the workaround."""
    sources: list[str] = Field(default_factory=list)
    """Where the fact comes from (issue, pull request or documentation URLs)."""


class RoutingStatus(KubeModel):
    """The HTTPRoute kvq renders, and how the Gateway took it."""

    route: str | None = None
    """The HTTPRoute's name."""
    backends: list[str] = Field(default_factory=list)
    """Where each match goes, e.g. `x-kvq-tier: critical -> Service llama-critical`."""


class InferenceServiceStatus(KubeModel):
    """Observed state, decisions and their reasons."""

    observed_generation: int | None = None
    """The spec generation last reconciled."""
    conditions: Annotated[
        list[Condition],
        Field(
            json_schema_extra={
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
        ),
    ] = Field(default_factory=list)
    """Ready, Reconciling, Stalled (kstatus), Placed, FallbackActive, Degraded,
    CapacityMismatch, Autoscaling."""
    effective: EffectiveStatus | None = None
    """What is actually rendered."""
    placement: PlacementStatus | None = None
    """The chosen node pool."""
    capacity: CapacityStatus | None = None
    """Planned KV capacity per replica."""
    fallback: FallbackStatus | None = None
    """Fallback history."""
    metrics: MetricsStatus | None = None
    """Latest engine metrics."""
    autoscaling: AutoscalingStatus | None = None
    """Autoscaling: desired replicas, signals and limits (with spec.autoscaling)."""
    tiers: Annotated[
        list[TierStatus],
        Field(
            json_schema_extra={
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
        ),
    ] = Field(default_factory=list)
    """The extra tiers (spec.tiers), each decided on its own."""
    tiers_ready: str | None = None
    """Tiers ready of all tiers, the default included (e.g. 2/2)."""
    routing: RoutingStatus | None = None
    """The route through the Gateway (with spec.routing)."""
    quality: QualityStatus | None = None
    """The quality gate's last probe (with spec.quality)."""
    known_accuracy_risks: list[AccuracyRisk] | None = None
    """Reported FP8 KV-cache accuracy problems for this engine, GPU, model and dtype
    (condition KnownAccuracyRisk); check the model itself with spec.quality."""
    replicas: int | None = None
    """Engine pods that exist (the scale subresource's status.replicas)."""
    selector: str | None = None
    """Label selector of the engine pods (the scale subresource's status.selector)."""
    ready_replicas: int | None = None
    """Engine pods that are ready."""
