"""`spec` of an InferenceService: what the application team asks for."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field

from kvq.api.base import KubeModel
from kvq.api.credentials import (
    CREDENTIAL_ENV_RE,
    CREDENTIAL_FLAG_RE,
    is_credential_env,
    is_credential_flag,
)
from kvq.api.names import dns_subdomain, label_key, label_map, label_value
from kvq.api.pod import (
    Affinity,
    EngineResources,
    EnvFromSource,
    EnvVarSource,
    ModelCacheSpec,
    ObjectKey,
    ObjectName,
    PodSettings,
    Quantity,
    TopologySpreadConstraint,
)
from kvq.api.rules import FieldRule, ListMapKeys, Rule, UniqueItems

KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8"]
FallbackRung = Literal["auto", "awq"]
AttentionKind = Literal["gqa", "mla"]
PoolPreference = Literal["cheapest", "headroom"]

KV_CACHE_DTYPES: tuple[KvCacheDtype, ...] = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")
BLOCK_SIZES = (8, 16, 32, 64, 128, 256)
# Flags kvq renders from spec fields; setting them again in extraArgs would
# silently fight the operator, so the CRD refuses them.
MANAGED_FLAGS = (
    "--model",
    "--kv-cache-dtype",
    "--block-size",
    "--gpu-memory-utilization",
    "--swap-space",
    "--max-model-len",
    "--max-num-seqs",
    "--tensor-parallel-size",
    "-tp",
    "--kv-cache-memory-bytes",
    "--quantization",
    "--calculate-kv-scales",
    "--served-model-name",
    "--port",
    "--host",
    "--revision",
)

_URI_RE = r"^(hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[^/]+)*/?|s3://[a-z0-9][a-z0-9.-]*[a-z0-9](/[^/]+)*/?)$"
_URI_MESSAGE = "must be hf://<org>/<name>, pvc://<claim>[/<path>] or s3://<bucket>[/<path>]"
_VERSION_RE = r"^v?[0-9]+[.][0-9]+([.][0-9]+)?$"


def _uri_ok(value: str) -> bool:
    return re.fullmatch(_URI_RE, value) is not None


ModelUri = Annotated[
    str,
    Field(max_length=512),
    FieldRule(cel=f"self.matches('{_URI_RE}')", message=_URI_MESSAGE, check=_uri_ok),
]


class SecretKeyRef(KubeModel):
    """A key of a Secret in the InferenceService's namespace. kvq passes it by reference only."""

    name: ObjectName
    """Name of the Secret."""
    key: ObjectKey
    """Key within the Secret whose value is the token."""


class AwqSpec(KubeModel):
    """The AWQ-quantized variant of the model, used by the `awq` fallback rung."""

    uri: ModelUri
    """Where the AWQ weights live (same schemes as spec.model.uri)."""


class ArchitectureSpec(KubeModel):
    """Architecture facts for capacity planning when kvq cannot look the model up.

    Copy them from the model's config.json (num_hidden_layers, num_key_value_heads, ...).
    """

    kube_rules = (
        Rule(
            cel="self.attention != 'mla' || (has(self.kvLoraRank) && has(self.ropeHeadDim))",
            message="attention mla needs kvLoraRank and ropeHeadDim (its KV cache holds the "
            "compressed latent, not per-head keys and values)",
            check=lambda a: (
                a.attention != "mla" or (a.kv_lora_rank is not None and a.rope_head_dim is not None)
            ),
        ),
        Rule(
            cel="self.attention != 'gqa' || (has(self.numKvHeads) && has(self.headDim))",
            message="attention gqa needs numKvHeads and headDim",
            check=lambda a: (
                a.attention != "gqa" or (a.num_kv_heads is not None and a.head_dim is not None)
            ),
        ),
        Rule(
            cel="!has(self.numKvHeads) || !has(self.numAttentionHeads) || "
            "self.numAttentionHeads % self.numKvHeads == 0",
            message="numAttentionHeads must be a multiple of numKvHeads",
            check=lambda a: (
                a.num_kv_heads is None
                or a.num_attention_heads is None
                or a.num_attention_heads % a.num_kv_heads == 0
            ),
            field_path=".numKvHeads",
        ),
        Rule(
            cel="has(self.numParams) || (has(self.hiddenSize) && has(self.intermediateSize) "
            "&& has(self.vocabSize))",
            message="give hiddenSize, intermediateSize and vocabSize, or numParams: kvq needs "
            "the weight size to know what memory is left for the KV cache",
            check=lambda a: (
                a.num_params is not None
                or (
                    a.hidden_size is not None
                    and a.intermediate_size is not None
                    and a.vocab_size is not None
                )
            ),
        ),
    )

    num_layers: Annotated[int, Field(ge=1, le=1024)]
    """Number of transformer layers (config.json num_hidden_layers)."""
    attention: AttentionKind = "gqa"
    """gqa (multi-head or grouped-query attention) or mla (DeepSeek-style latent attention)."""
    num_attention_heads: Annotated[int | None, Field(ge=1, le=1024)] = None
    """Query heads (config.json num_attention_heads)."""
    num_kv_heads: Annotated[int | None, Field(ge=1, le=1024)] = None
    """Key/value heads (config.json num_key_value_heads); equals the query heads without GQA."""
    head_dim: Annotated[int | None, Field(ge=1, le=4096)] = None
    """Dimension of one attention head."""
    # Upper bounds far above any model, below int64 (the API server refuses larger integers).
    hidden_size: Annotated[int | None, Field(ge=1, le=1_048_576)] = None
    """Model width (config.json hidden_size)."""
    intermediate_size: Annotated[int | None, Field(ge=1, le=4_194_304)] = None
    """MLP width (config.json intermediate_size)."""
    vocab_size: Annotated[int | None, Field(ge=1, le=16_777_216)] = None
    """Vocabulary size (config.json vocab_size)."""
    num_params: Annotated[int | None, Field(ge=1, le=10**15)] = None
    """Total parameter count; overrides the estimate from the shape."""
    kv_lora_rank: Annotated[int | None, Field(ge=1, le=65_536)] = None
    """MLA only: rank of the compressed KV latent (config.json kv_lora_rank)."""
    rope_head_dim: Annotated[int | None, Field(ge=1, le=4096)] = None
    """MLA only: decoupled RoPE key dimension (config.json qk_rope_head_dim)."""


class EnvVar(KubeModel):
    """An environment variable: a plain value, or a value read from a Secret or ConfigMap."""

    kube_rules = (
        Rule(
            cel="!has(self.value) || !has(self.valueFrom)",
            message="set value or valueFrom, not both",
            check=lambda e: e.value is None or e.value_from is None,
        ),
    )

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    """Variable name."""
    value: Annotated[str | None, Field(max_length=4096)] = None
    """Plain value. Never a credential: variables named like one (HF_TOKEN, *_KEY,
    *_SECRET, ...) must use valueFrom."""
    value_from: EnvVarSource | None = None
    """The value of a Secret or ConfigMap key, read by the kubelet (kvq never sees it)."""


def _no_credential_env(env: list[EnvVar]) -> bool:
    return not any(is_credential_env(e.name) and e.value is not None for e in env)


EnvList = Annotated[
    list[EnvVar],
    Field(max_length=64),
    FieldRule(
        cel=f"self.all(e, !e.name.matches('{CREDENTIAL_ENV_RE}') || !has(e.value))",
        message="env must not carry credentials as plain values (HF_TOKEN, *_TOKEN, *_KEY, "
        "*_SECRET, *_PASSWORD): use valueFrom.secretKeyRef or envFrom",
        check=_no_credential_env,
    ),
]
EnvFromList = Annotated[list[EnvFromSource], Field(max_length=16)]


class ModelSpec(KubeModel):
    """Which model to serve."""

    kube_rules = (
        Rule(
            cel="!has(self.revision) || self.uri.startsWith('hf://')",
            message="revision applies only to hf:// models",
            check=lambda m: m.revision is None or m.uri.startswith("hf://"),
            field_path=".revision",
        ),
        Rule(
            cel="!has(self.cache) || !self.uri.startsWith('pvc://')",
            message="cache applies to hf:// and s3:// models: a pvc:// model is read from "
            "its claim as it is",
            check=lambda m: m.cache is None or not m.uri.startswith("pvc://"),
            field_path=".cache",
        ),
    )

    uri: ModelUri
    """hf://<org>/<name> (Hugging Face), pvc://<claim>[/<path>] or s3://<bucket>[/<path>]."""
    revision: Annotated[str | None, Field(min_length=1, max_length=128)] = None
    """Hugging Face revision (branch, tag or commit) to pin."""
    architecture: ArchitectureSpec | None = None
    """Architecture facts; needed when the model is not in kvq's catalog."""
    awq: AwqSpec | None = None
    """AWQ-weight variant of the same model for the awq fallback rung."""
    token_secret_ref: SecretKeyRef | None = None
    """Secret key holding a Hugging Face token; passed as HF_TOKEN by reference, to the
    download step when there is a cache, else to the engine."""
    cache: ModelCacheSpec | None = None
    """Keep the downloaded model in a volume and download it before the engine starts;
    without a cache the engine downloads hf:// models itself at every start and streams
    s3:// models."""
    env: EnvList = Field(default_factory=list)
    """Environment for fetching the model (AWS_REGION, AWS_ENDPOINT_URL, HF_ENDPOINT, ...;
    credentials by valueFrom only): given to the download step, and to the engine when
    there is no cache (the engine then downloads or streams the model itself)."""
    env_from: EnvFromList = Field(default_factory=list)
    """Secrets and ConfigMaps whose keys become that environment (e.g. a Secret with
    AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)."""


def _no_managed_flags(args: list[str]) -> bool:
    return not any(a.split("=", 1)[0] in MANAGED_FLAGS for a in args)


def _no_credential_flags(args: list[str]) -> bool:
    return not any(is_credential_flag(a) for a in args)


_MANAGED_CEL = "[" + ", ".join(f"'{f}'" for f in MANAGED_FLAGS) + "]"


class EngineSpec(KubeModel):
    """The vLLM engine: image, version and extra arguments."""

    kube_rules = (
        Rule(
            cel="!has(self.version) || self.version.matches('" + _VERSION_RE + "')",
            message="version must look like 0.26.0 or v0.26",
            check=lambda e: e.version is None or re.fullmatch(_VERSION_RE, e.version) is not None,
            field_path=".version",
        ),
    )

    image: Annotated[str | None, Field(min_length=1, max_length=512)] = None
    """Engine image; defaults to the pinned vllm/vllm-openai tag of this kvq release."""
    version: Annotated[str | None, Field(min_length=1, max_length=32)] = None
    """vLLM version of the image (e.g. 0.26.0); derived from the image tag when omitted."""
    extra_args: Annotated[
        list[Annotated[str, Field(max_length=1024)]],
        Field(max_length=64),
        FieldRule(
            cel=f"self.all(a, !({_MANAGED_CEL}.exists(f, a == f || a.startsWith(f + '='))))",
            message="extraArgs must not set flags kvq manages (--kv-cache-dtype, --block-size, "
            "--gpu-memory-utilization, --swap-space, --max-model-len, ...): use the spec fields",
            check=_no_managed_flags,
        ),
        FieldRule(
            cel=f"self.all(a, !a.matches('{CREDENTIAL_FLAG_RE}'))",
            message="extraArgs must not carry credentials (--hf-token, --api-key, or any "
            "flag named *token*, *key*, *secret* or *password*): they would be stored in the "
            "spec and shown in status; reference a Secret with spec.model.tokenSecretRef",
            check=_no_credential_flags,
        ),
    ] = Field(default_factory=list)
    """Extra `vllm serve` arguments, appended after the ones kvq renders."""
    env: EnvList = Field(default_factory=list)
    """Extra environment variables for the engine container (credentials by valueFrom)."""
    env_from: EnvFromList = Field(default_factory=list)
    """Secrets and ConfigMaps whose keys become the engine's environment."""
    resources: EngineResources | None = None
    """CPU and memory requests and limits; derived from the model when omitted."""
    shm_size: Quantity | None = None
    """Size of /dev/shm (a memory-backed emptyDir, counted in the memory request); 1 GiB per
    GPU of the replica when omitted (NCCL and the engine's workers exchange tensors there)."""
    run_as_user: Annotated[
        int | None,
        FieldRule(
            cel="self >= 1 && self <= 2147483647",
            message="runAsUser must be a non-root user ID: 1 or more (0 is root)",
            check=lambda v: 1 <= v <= 2_147_483_647,
        ),
    ] = None
    """Run the engine as this non-root user ID (with runAsNonRoot, and HOME on a writable
    emptyDir). vllm/vllm-openai is built to run as root and writes its caches under /root:
    this works with it only because kvq moves HOME; an image with its own non-root user
    should set that user's ID. As root (the default) every capability is dropped."""


class KvCacheSpec(KubeModel):
    """How vLLM stores the KV cache."""

    kube_rules = (
        Rule(
            # has(): the API server checks this rule against the bare default {} as well.
            cel="!has(self.calculateScales) || !self.calculateScales || "
            "(has(self.dtype) && self.dtype.startsWith('fp8'))",
            message="calculateScales applies only to fp8 dtypes",
            check=lambda k: not k.calculate_scales or k.dtype.startswith("fp8"),
            field_path=".calculateScales",
        ),
    )

    dtype: KvCacheDtype = "auto"
    """auto (model dtype, no compression), fp8 / fp8_e4m3 / fp8_e5m2 (half the KV memory on
    Ada, Hopper and later) or int8 (int8_per_token_head on vLLM 0.22+)."""
    block_size: Annotated[
        int | None,
        FieldRule(
            cel="self in [8, 16, 32, 64, 128, 256]",
            message="blockSize must be one of 8, 16, 32, 64, 128, 256 (tokens per "
            "PagedAttention block)",
            check=lambda v: v in BLOCK_SIZES,
        ),
    ] = None
    """Tokens per PagedAttention block; the engine's default (16) when omitted."""
    calculate_scales: bool = False
    """Compute fp8 KV scales from the first batches (engines that still have the flag)."""


class MemorySpec(KubeModel):
    """GPU memory budget and context length."""

    gpu_memory_utilization: Annotated[
        float,
        FieldRule(
            cel="self > 0.0 && self <= 1.0",
            message="gpuMemoryUtilization is the fraction of each GPU's memory vLLM may use: "
            "it must be greater than 0 and at most 1",
            check=lambda v: 0.0 < v <= 1.0,
        ),
    ] = 0.90
    """Fraction of each GPU's memory vLLM may use (0.90-0.95 dedicated, 0.6-0.8 shared)."""
    swap_space_gib: Annotated[
        float | None,
        Field(alias="swapSpaceGiB"),
        FieldRule(
            cel="self >= 0.0 && self <= 1024.0",
            message="swapSpaceGiB must be between 0 and 1024 (GiB of CPU memory per GPU)",
            check=lambda v: 0.0 <= v <= 1024.0,
        ),
    ] = None
    """CPU swap space for KV overflow, GiB per GPU; the engine's default (4 GiB up to vLLM
    0.17) when omitted. Engines from vLLM 0.18 have no swap: a value set here is then not
    rendered, and status says so. Latency-sensitive services should use 0."""
    max_model_len: Annotated[
        int | None,
        FieldRule(
            cel="self >= 16 && self <= 10485760",
            message="maxModelLen must be between 16 and 10485760 tokens",
            check=lambda v: 16 <= v <= 10_485_760,
        ),
    ] = None
    """Context length per request; the model's own maximum when omitted."""
    max_num_seqs: Annotated[
        int | None,
        FieldRule(
            cel="self >= 1 && self <= 65536",
            message="maxNumSeqs must be between 1 and 65536",
            check=lambda v: 1 <= v <= 65_536,
        ),
    ] = None
    """Most sequences the engine batches at once."""


class CapacitySpec(KubeModel):
    """What the service must hold; placement and fallback keep it."""

    min_concurrent_sequences: Annotated[
        int | None,
        FieldRule(
            cel="self >= 1 && self <= 65536",
            message="minConcurrentSequences must be between 1 and 65536 (the most sequences "
            "an engine batches)",
            check=lambda v: 1 <= v <= 65_536,
        ),
    ] = None
    """Concurrent sequences of spec.memory.maxModelLen tokens each replica must fit in KV."""


class Toleration(KubeModel):
    """A Kubernetes toleration added to the engine pods."""

    kube_rules = (
        Rule(
            cel="(has(self.key) && self.key != '') || self.operator == 'Exists'",
            message="a toleration without a key tolerates every taint: its operator must be Exists",
            check=lambda t: bool(t.key) or t.operator == "Exists",
            field_path=".operator",
        ),
        Rule(
            cel="self.operator != 'Exists' || !has(self.value) || self.value == ''",
            message="a toleration with operator Exists takes no value",
            check=lambda t: t.operator != "Exists" or not t.value,
            field_path=".value",
        ),
        Rule(
            cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            message="tolerationSeconds applies only to effect NoExecute",
            check=lambda t: t.toleration_seconds is None or t.effect == "NoExecute",
            field_path=".tolerationSeconds",
        ),
    )

    key: Annotated[str | None, Field(max_length=317), label_key("toleration key")] = None
    """Taint key to tolerate; empty with operator Exists tolerates everything."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists or Equal."""
    value: Annotated[str | None, Field(max_length=63), label_value("toleration value")] = None
    """Taint value for operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; all effects when omitted."""
    toleration_seconds: Annotated[int | None, Field(ge=0, le=31_536_000)] = None
    """For NoExecute: how long the pod stays bound after the taint appears (at most a year;
    leave it out to stay bound)."""


class PlacementSpec(KubeModel):
    """Where replicas may run."""

    gpus_per_replica: Annotated[
        int,
        FieldRule(
            cel="self >= 1 && self <= 8",
            message="gpusPerReplica (tensor parallel size) must be between 1 and 8: one node",
            check=lambda v: 1 <= v <= 8,
        ),
    ] = 1
    """GPUs per replica; vLLM shards the model over them (tensor parallel)."""
    pools: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=63)]],
        Field(max_length=32, json_schema_extra={"x-kubernetes-list-type": "set"}),
        UniqueItems(),
    ] = Field(default_factory=list)
    """Allow-list of node pool names; every discovered pool when empty."""
    node_selector: Annotated[
        dict[str, Annotated[str, Field(max_length=63)]],
        Field(max_length=64),
        label_map("placement.nodeSelector"),
    ] = Field(default_factory=dict)
    """Extra node labels every replica's node must carry."""
    tolerations: Annotated[list[Toleration], Field(max_length=32)] = Field(default_factory=list)
    """Taints the replicas may run on besides the GPU taint (nvidia.com/gpu), which kvq always
    tolerates. A pool whose nodes all carry another taint is not used unless it is tolerated
    here; kvq never copies a pool's taints into the pod on its own."""
    prefer: PoolPreference = "cheapest"
    """Among fitting pools: cheapest (lowest GPU cost) or headroom (most KV capacity)."""
    affinity: Affinity | None = None
    """Kubernetes affinity of the engine pods, on top of the pool's node selector (kvq does
    not read it when choosing a pool; a contradiction leaves the pods unschedulable, which
    status reports)."""
    topology_spread_constraints: Annotated[
        list[TopologySpreadConstraint],
        Field(max_length=8),
        ListMapKeys(("topologyKey", "whenUnsatisfiable")),
    ] = Field(default_factory=list)
    """How replicas spread over zones or nodes; a constraint without labelSelector counts
    this InferenceService's replicas."""
    priority_class_name: Annotated[
        str | None, Field(min_length=1, max_length=253), dns_subdomain("priorityClassName")
    ] = None
    """PriorityClass of the engine pods (preemption order when GPUs are short)."""


class RolloutSpec(KubeModel):
    """How the engine Deployment replaces pods when what they run changes.

    By default kvq surges (one new replica first, no replica taken down) when the pool has a
    free GPU slot for it, and otherwise replaces one replica at a time (a single-replica
    service is briefly down: no spare GPU means no second replica can start).
    """

    kube_rules = (
        Rule(
            cel="!has(self.maxSurge) || !has(self.maxUnavailable) "
            "|| self.maxSurge > 0 || self.maxUnavailable > 0",
            message="maxSurge and maxUnavailable cannot both be 0: the rollout could never "
            "make progress",
            check=lambda r: (
                r.max_surge is None
                or r.max_unavailable is None
                or r.max_surge + r.max_unavailable > 0
            ),
        ),
    )

    max_surge: Annotated[int | None, Field(ge=0, le=1000)] = None
    """Replicas started above spec.replicas during a rollout (needs free GPUs); with only
    maxUnavailable given, 0 (1 when maxUnavailable is 0)."""
    max_unavailable: Annotated[int | None, Field(ge=0, le=1000)] = None
    """Replicas that may be down during a rollout; with only maxSurge given, 0 (1 when
    maxSurge is 0)."""


class AutoscalingTargets(KubeModel):
    """What one replica should carry; the autoscaler adds replicas when the load asks for more.

    Each target is per replica, averaged over the replicas (KEDA's AverageValue): a target
    of 0.7 KV-cache usage with two replicas at 0.9 asks for three.
    """

    kube_rules = (
        Rule(
            cel="has(self.kvCacheUsage) || has(self.requestsWaiting) || has(self.runningFraction)",
            message="give at least one target: kvCacheUsage, requestsWaiting or runningFraction",
            check=lambda t: (
                t.kv_cache_usage is not None
                or t.requests_waiting is not None
                or t.running_fraction is not None
            ),
        ),
    )

    kv_cache_usage: Annotated[
        float | None,
        FieldRule(
            cel="self > 0.0 && self <= 1.0",
            message="kvCacheUsage is a fraction of the KV cache: greater than 0, at most 1",
            check=lambda v: 0.0 < v <= 1.0,
        ),
    ] = None
    """KV-cache usage per replica (vllm:kv_cache_usage_perc, 0-1)."""
    requests_waiting: Annotated[
        float | None,
        FieldRule(
            cel="self > 0.0 && self <= 10000.0",
            message="requestsWaiting must be greater than 0 (queued requests per replica)",
            check=lambda v: 0.0 < v <= 10_000.0,
        ),
    ] = None
    """Requests queued per replica (vllm:num_requests_waiting)."""
    running_fraction: Annotated[
        float | None,
        FieldRule(
            cel="self > 0.0 && self <= 1.0",
            message="runningFraction is a fraction of the concurrency kvq planned per "
            "replica: greater than 0, at most 1",
            check=lambda v: 0.0 < v <= 1.0,
        ),
    ] = None
    """Running requests per replica as a fraction of the sequences one replica holds at
    maxModelLen (status.capacity.maxConcurrentSequences): 0.8 adds a replica when each is
    80% full. The figure follows the KV dtype that runs: fp8 holds twice the sequences."""


class AutoscalingSpec(KubeModel):
    """Scale the replicas on the engine's own signals, with KEDA (its ScaledObject is kvq's).

    The autoscaler owns spec.replicas (through the scale subresource); kvq runs what it
    asks, within [minReplicas, maxReplicas]. Needs KEDA in the cluster and a Prometheus
    that scrapes the engines (`kvq run --prometheus-url`).
    """

    kube_rules = (
        Rule(
            cel="self.minReplicas <= self.maxReplicas",
            message="minReplicas must not be above maxReplicas",
            check=lambda a: a.min_replicas <= a.max_replicas,
            field_path=".minReplicas",
        ),
        Rule(
            cel="self.minReplicas > 0 || has(self.idleSeconds)",
            message="minReplicas 0 (scale to zero) needs idleSeconds: how long without a "
            "request before the last replica goes",
            check=lambda a: a.min_replicas > 0 or a.idle_seconds is not None,
            field_path=".idleSeconds",
        ),
    )

    min_replicas: Annotated[int, Field(ge=0, le=1000)] = 1
    """Fewest replicas; 0 scales to zero after idleSeconds without requests."""
    max_replicas: Annotated[int, Field(ge=1, le=1000)]
    """Most replicas (also bounded by the GPUs the pool can offer: status says when)."""
    targets: AutoscalingTargets = Field(
        default_factory=lambda: AutoscalingTargets(kv_cache_usage=0.8, requests_waiting=2),
        json_schema_extra={"default": {"kvCacheUsage": 0.8, "requestsWaiting": 2}},
    )
    """Per-replica targets; a replica is added when any is exceeded."""
    scale_down_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 300
    """How long the load must stay low before replicas are removed (HPA behaviour)."""
    cooldown_seconds: Annotated[int, Field(ge=0, le=86400)] = 300
    """After the last activity, how long before scaling to zero (KEDA cooldownPeriod)."""
    idle_seconds: Annotated[int | None, Field(ge=60, le=86400)] = None
    """Scale to zero only when no request arrived in this window (with minReplicas 0)."""
    polling_seconds: Annotated[int, Field(ge=5, le=600)] = 15
    """How often KEDA reads the signals."""


TIER_HEADER = "x-kvq-tier"
# The Gateway API Inference Extension's body-based router copies the request's OpenAI
# `model` into this header, so a route can match on the model name.
MODEL_HEADER = "x-gateway-model-name"
_TIER_NAME_RE = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class HeaderMatch(KubeModel):
    """An exact request-header match."""

    name: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[a-z0-9!#$%&'*+.^_`|~-]+$")]
    """Header name, in lower case (header names are case-insensitive on the wire)."""
    value: Annotated[str, Field(min_length=1, max_length=4096)]
    """Exact header value."""


class TierMatch(KubeModel):
    """Which requests go to a tier (any of the matches)."""

    header: HeaderMatch | None = None
    """A header and value; default `x-kvq-tier: <tier name>`."""
    model: Annotated[str | None, Field(min_length=1, max_length=256)] = None
    """An OpenAI model name that means this tier: the engine serves under it too, and the
    route matches the x-gateway-model-name header the gateway's body-based router sets."""


class TierSpec(KubeModel):
    """Another tier of the same model, with its own KV cache and replicas (e.g. an
    uncompressed `auto` cache for requests that need the highest accuracy)."""

    name: Annotated[
        str,
        Field(min_length=1, max_length=20),
        FieldRule(
            cel=f"self.matches('{_TIER_NAME_RE}') && self != 'default'",
            message="tier names are short DNS labels (lowercase letters, digits and '-'), "
            "not 'default' (the main spec is the default tier)",
            check=lambda v: re.fullmatch(_TIER_NAME_RE, v) is not None and v != "default",
        ),
    ]
    """Tier name; its objects are named <InferenceService>-<name>."""
    kv_cache: KvCacheSpec = Field(default_factory=KvCacheSpec, json_schema_extra={"default": {}})
    """The tier's KV cache (default auto: no compression)."""
    replicas: Annotated[int, Field(ge=0, le=1000)] = 1
    """The tier's replicas."""
    autoscaling: AutoscalingSpec | None = None
    """The tier's autoscaling (KEDA scales the tier's Deployment)."""
    match: TierMatch | None = None
    """The requests that reach this tier; default the header x-kvq-tier: <name>."""

    def header(self) -> tuple[str, str]:
        """The (lower-cased name, value) of the tier's header match."""
        found = self.match.header if self.match else None
        return (found.name, found.value) if found else (TIER_HEADER, self.name)

    def model_alias(self) -> str | None:
        return self.match.model if self.match else None


class ParentRef(KubeModel):
    """A Gateway (or a listener of one) the route attaches to."""

    name: Annotated[str, Field(min_length=1, max_length=253)]
    """The Gateway's name."""
    namespace: Annotated[str | None, Field(min_length=1, max_length=63)] = None
    """Defaults to the InferenceService's namespace."""
    section_name: Annotated[str | None, Field(min_length=1, max_length=253)] = None
    """A listener of the Gateway."""


class RoutingSpec(KubeModel):
    """A Gateway API HTTPRoute for the service: each tier's match to that tier, the rest to
    the default tier."""

    parent_refs: Annotated[list[ParentRef], Field(min_length=1, max_length=8)]
    """The Gateways to attach to."""
    hostnames: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=253)]], Field(max_length=16)
    ] = Field(default_factory=list)
    """Host names the route answers for; all of the Gateway's when empty."""
    inference_pool: bool = False
    """Also render one inference.networking.k8s.io/v1 InferencePool per tier and route to
    them (for gateways that implement the Gateway API Inference Extension)."""


def _tier_keys_unique(tiers: list[TierSpec]) -> bool:
    headers = [t.header() for t in tiers]
    aliases = [a for t in tiers if (a := t.model_alias()) is not None]
    return len(set(headers)) == len(headers) and len(set(aliases)) == len(aliases)


_TIER_HEADER_NAME_CEL = (
    f"(has(%s.match) && has(%s.match.header) ? %s.match.header.name : '{TIER_HEADER}')"
)
_TIER_HEADER_VALUE_CEL = "(has(%s.match) && has(%s.match.header) ? %s.match.header.value : %s.name)"


def _tier_header_cel(var: str) -> str:
    return (
        _TIER_HEADER_NAME_CEL % (var, var, var)
        + " + ':' + "
        + _TIER_HEADER_VALUE_CEL % (var, var, var, var)
    )


QualitySuite = Literal["needle", "json", "repetition", "agreement"]
_REQUIREMENT_RE = (
    r"^[A-Za-z][A-Za-z0-9_.]*(>=|<=|>|<)(baseline([+-][0-9]+([.][0-9]+)?)?|-?[0-9]+([.][0-9]+)?)$"
)


class QualitySpec(KubeModel):
    """Check the answers after each rollout of a quantized KV cache (`kvq probe` in a Job):
    needles retrieved from long contexts, valid JSON, no repetition loops, and agreement with
    an uncompressed tier. A failure can fall back to the next rung (QualityRegression)."""

    kube_rules = (
        Rule(
            cel="!self.suites.exists(s, s == 'agreement') || has(self.baselineTier)",
            message="the agreement suite compares with a baseline: set baselineTier (a tier "
            "of this service with the auto cache)",
            check=lambda q: "agreement" not in q.suites or q.baseline_tier is not None,
            field_path=".suites",
        ),
    )

    suites: Annotated[
        list[QualitySuite],
        Field(
            min_length=1,
            max_length=4,
            json_schema_extra={
                "x-kubernetes-list-type": "set",
                "default": ["needle", "json", "repetition"],
            },
        ),
        UniqueItems(),
    ] = Field(default_factory=lambda: list[QualitySuite](["needle", "json", "repetition"]))
    """Which checks run."""
    require: Annotated[
        list[
            Annotated[
                str,
                Field(max_length=128),
                FieldRule(
                    cel=f"self.matches('{_REQUIREMENT_RE}')",
                    message="a requirement is SCORE OP THRESHOLD without spaces, e.g. "
                    "needle.accuracy>=0.9 or agreement.tokenAgreement>=baseline-0.1",
                    check=lambda v: re.fullmatch(_REQUIREMENT_RE, v) is not None,
                ),
            ]
        ],
        Field(max_length=16),
    ] = Field(default_factory=list)
    """Thresholds on the probe's scores; the probe's defaults when empty (see kvq probe)."""
    baseline_tier: Annotated[str | None, Field(min_length=1, max_length=20)] = None
    """A tier of this service to compare with (agreement; thresholds relative to it)."""
    on_failure: Literal["fallback", "report"] = "report"
    """fallback: a failed check moves the ladder to the next rung (QualityRegression);
    report: status and an Event only."""
    period_hours: Annotated[int | None, Field(ge=1, le=8760)] = None
    """Also run every this many hours (besides after each rollout)."""
    timeout_seconds: Annotated[int, Field(ge=60, le=86400)] = 1800
    """Longest a probe may run; it is then Unknown (never a failure)."""
    tolerations: Annotated[list[Toleration], Field(max_length=16)] = Field(default_factory=list)
    """Where the probe Job's pod may run (it needs no GPU)."""
    env: Annotated[list[EnvVar], Field(max_length=16)] = Field(default_factory=list)
    """Extra environment of the probe (e.g. a proxy)."""


class FallbackSpec(KubeModel):
    """What kvq may do when the requested KV-cache dtype cannot run."""

    enabled: bool = True
    """Fall back at all; when false, kvq reports the failure and changes nothing."""
    rungs: Annotated[
        list[FallbackRung],
        Field(
            min_length=1,
            max_length=2,
            json_schema_extra={"x-kubernetes-list-type": "set", "default": ["auto"]},
        ),
        UniqueItems(),
    ] = Field(default_factory=lambda: list[FallbackRung](["auto"]))
    """Ordered rungs: auto (same model, uncompressed KV) and awq (spec.model.awq with auto KV).
    Each is tried at most once per spec generation."""


class InferenceServiceSpec(KubeModel):
    """What to serve and how: model, engine, KV-cache dtype, memory, capacity, placement."""

    kube_rules = (
        Rule(
            cel="!has(self.fallback) || !self.fallback.rungs.exists(r, r == 'awq') "
            "|| has(self.model.awq)",
            message="the awq fallback rung needs spec.model.awq.uri",
            check=lambda s: "awq" not in s.fallback.rungs or s.model.awq is not None,
            field_path=".fallback.rungs",
        ),
        Rule(
            cel="!has(self.capacity) || !has(self.capacity.minConcurrentSequences) "
            "|| (has(self.memory) && has(self.memory.maxModelLen))",
            message="capacity.minConcurrentSequences needs memory.maxModelLen: concurrency "
            "is counted at that context length",
            check=lambda s: (
                s.capacity.min_concurrent_sequences is None or s.memory.max_model_len is not None
            ),
            field_path=".capacity.minConcurrentSequences",
        ),
        Rule(
            cel="!has(self.quality) || !has(self.quality.baselineTier) || (has(self.tiers) "
            "&& self.tiers.exists(t, t.name == self.quality.baselineTier))",
            message="quality.baselineTier names no tier in spec.tiers",
            check=lambda s: (
                s.quality is None
                or s.quality.baseline_tier is None
                or any(t.name == s.quality.baseline_tier for t in s.tiers)
            ),
            field_path=".quality.baselineTier",
        ),
        Rule(
            cel="!has(self.tiers) || self.tiers.all(t, t.kvCache.dtype != self.kvCache.dtype "
            "|| t.kvCache.calculateScales != self.kvCache.calculateScales "
            "|| (has(t.kvCache.blockSize) ? t.kvCache.blockSize : 0) "
            "!= (has(self.kvCache.blockSize) ? self.kvCache.blockSize : 0))",
            message="a tier with the default tier's kvCache would run the same engine twice: "
            "give it another kvCache (typically dtype auto)",
            check=lambda s: all(t.kv_cache != s.kv_cache for t in s.tiers),
            field_path=".tiers",
        ),
        Rule(
            cel="!has(self.autoscaling) || !has(self.replicas) "
            "|| self.replicas <= self.autoscaling.maxReplicas",
            message="spec.replicas is above autoscaling.maxReplicas: with autoscaling the "
            "autoscaler sets spec.replicas within [minReplicas, maxReplicas]; leave it out",
            check=lambda s: s.autoscaling is None or s.replicas <= s.autoscaling.max_replicas,
            field_path=".replicas",
        ),
        Rule(
            cel="!has(self.capacity) || !has(self.capacity.minConcurrentSequences) "
            "|| !has(self.memory) || !has(self.memory.maxNumSeqs) "
            "|| self.memory.maxNumSeqs >= self.capacity.minConcurrentSequences",
            message="memory.maxNumSeqs is below capacity.minConcurrentSequences: the engine "
            "could never run that many sequences at once",
            check=lambda s: (
                s.capacity.min_concurrent_sequences is None
                or s.memory.max_num_seqs is None
                or s.memory.max_num_seqs >= s.capacity.min_concurrent_sequences
            ),
            field_path=".memory.maxNumSeqs",
        ),
    )

    model: ModelSpec
    """The model to serve."""
    engine: EngineSpec = Field(default_factory=EngineSpec, json_schema_extra={"default": {}})
    """The vLLM engine image, version and extra arguments."""
    pod: PodSettings = Field(default_factory=PodSettings, json_schema_extra={"default": {}})
    """Pod-level settings: service account, image pull secrets, labels, annotations."""
    kv_cache: KvCacheSpec = Field(default_factory=KvCacheSpec, json_schema_extra={"default": {}})
    """KV-cache dtype and block size."""
    memory: MemorySpec = Field(default_factory=MemorySpec, json_schema_extra={"default": {}})
    """GPU memory utilization, swap space and context length."""
    capacity: CapacitySpec = Field(default_factory=CapacitySpec, json_schema_extra={"default": {}})
    """What each replica must hold."""
    placement: PlacementSpec = Field(
        default_factory=PlacementSpec, json_schema_extra={"default": {}}
    )
    """GPUs per replica and where replicas may run."""
    fallback: FallbackSpec = Field(default_factory=FallbackSpec, json_schema_extra={"default": {}})
    """The fallback ladder when the requested dtype cannot run."""
    rollout: RolloutSpec | None = None
    """Rolling-update limits; kvq picks them from the pool's free GPUs when omitted."""
    autoscaling: AutoscalingSpec | None = None
    """Scale on KV-cache usage and queue length (KEDA); spec.replicas is then the
    autoscaler's."""
    tiers: Annotated[
        list[TierSpec],
        Field(max_length=4),
        ListMapKeys(("name",)),
        FieldRule(
            cel=f"self.all(a, self.filter(b, {_tier_header_cel('b')} == "
            f"{_tier_header_cel('a')}).size() == 1) && "
            "self.all(a, !has(a.match) || !has(a.match.model) || self.filter(b, "
            "has(b.match) && has(b.match.model) && b.match.model == a.match.model).size() == 1)",
            message="two tiers have the same match (header and value, or model name): each "
            "request must reach one tier",
            check=_tier_keys_unique,
        ),
    ] = Field(default_factory=list)
    """Extra tiers of the same model (the main spec is the default tier), each with its own
    KV cache, replicas and request match."""
    routing: RoutingSpec | None = None
    """Route requests through a Gateway: each tier's match to it, the rest to the default."""
    quality: QualitySpec | None = None
    """A quality gate after each rollout of a quantized KV cache (kvq probe in a Job)."""
    replicas: Annotated[
        int,
        FieldRule(
            cel="self >= 0 && self <= 1000",
            message="replicas must be between 0 and 1000",
            check=lambda v: 0 <= v <= 1000,
        ),
    ] = 1
    """Engine replicas (each with gpusPerReplica GPUs). `kubectl scale` writes this field
    (the scale subresource); editing it never restarts running replicas. With autoscaling
    the autoscaler writes it, and kvq runs it within [minReplicas, maxReplicas]."""

    def desired_replicas(self) -> int:
        """The replicas kvq runs: spec.replicas, within the autoscaling bounds if any."""
        if self.autoscaling is None:
            return self.replicas
        return max(self.autoscaling.min_replicas, min(self.replicas, self.autoscaling.max_replicas))
