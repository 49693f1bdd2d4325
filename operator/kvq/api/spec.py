"""`spec` of an InferenceService: what the application team asks for.

Each section has its module (`kvq.api.model`, `engine`, `kv_cache`, `memory`, `capacity`,
`placement`, `rollout`, `autoscaling`, `tiers`, `routing`, `quality`, `fallback`, `pod`);
this one holds the whole spec and the rules that span sections (`cpu_tier` builds the one
that ties spec.memory's CPU tier to the engine version).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kvq.api.autoscaling import AutoscalingSpec
from kvq.api.base import KubeModel
from kvq.api.capacity import CapacitySpec
from kvq.api.cpu_tier import cpu_tier_rule
from kvq.api.engine import EngineSpec
from kvq.api.fallback import FallbackSpec
from kvq.api.kv_cache import KvCacheSpec
from kvq.api.memory import MemorySpec
from kvq.api.model import ModelSpec
from kvq.api.placement import PlacementSpec
from kvq.api.pod import PodSettings
from kvq.api.quality import QualitySpec
from kvq.api.rollout import RolloutSpec
from kvq.api.routing import RoutingSpec
from kvq.api.rules import FieldRule, Rule
from kvq.api.tiers import TierList


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
        cpu_tier_rule(),
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
    tiers: TierList = Field(default_factory=list)
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
