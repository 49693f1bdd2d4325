"""`spec.placement`: GPUs per replica, their parallel layout, and where replicas may run."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from kvq.api.base import KubeModel
from kvq.api.names import dns_subdomain, label_map
from kvq.api.rules import FieldRule, ListMapKeys, Rule, UniqueItems
from kvq.api.scheduling import Affinity, Toleration, TopologySpreadConstraint

PoolPreference = Literal["cheapest", "headroom"]


# vLLM's tensor parallel stays within one node's NVLink domain (1-8 GPUs); pipeline stages
# split the layers across nodes. 16 stages of 8 GPUs: the largest replica kvq describes.
MAX_TENSOR = 8
MAX_PIPELINE = 16
MAX_GPUS_PER_REPLICA = MAX_TENSOR * MAX_PIPELINE


class ParallelismSpec(KubeModel):
    """How one replica's GPUs split the model: tensor parallel x pipeline parallel."""

    tensor: Annotated[
        int,
        FieldRule(
            cel=f"self >= 1 && self <= {MAX_TENSOR}",
            message=f"parallelism.tensor (tensor parallel size, within one node) must be "
            f"between 1 and {MAX_TENSOR}",
            check=lambda v: 1 <= v <= MAX_TENSOR,
        ),
    ] = 1
    """GPUs that shard every layer (vLLM --tensor-parallel-size); they stay within a node."""
    pipeline: Annotated[
        int,
        FieldRule(
            cel=f"self >= 1 && self <= {MAX_PIPELINE}",
            message=f"parallelism.pipeline (pipeline stages) must be between 1 and {MAX_PIPELINE}",
            check=lambda v: 1 <= v <= MAX_PIPELINE,
        ),
        Field(json_schema_extra={"default": None}),
    ] = 1
    """Stages that split the layers (vLLM --pipeline-parallel-size). When tensor x pipeline
    is more than one node's GPUs, each node runs whole stages: the replica spans nodes.
    Omitted: kvq picks the fewest stages whose replica holds the weights and
    spec.capacity.minConcurrentSequences at maxModelLen, on each pool and for each rung of
    the fallback ladder (a fallback to a larger KV cache may take more nodes; status says so)."""

    @property
    def pipeline_derived(self) -> bool:
        """parallelism.pipeline is left to kvq (omitted)."""
        return "pipeline" not in self.model_fields_set

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline


# The CRD keeps no default for gpusPerReplica (it follows parallelism when that is given), and
# the API server checks `placement: {}` before any field default: the rules spell the defaults.
_TENSOR = "(has(self.parallelism.tensor) ? self.parallelism.tensor : 1)"
_PIPELINE = "(has(self.parallelism.pipeline) ? self.parallelism.pipeline : 1)"


class PlacementSpec(KubeModel):
    """Where replicas may run."""

    kube_rules = (
        Rule(
            cel=f"!has(self.gpusPerReplica) || self.gpusPerReplica <= {MAX_TENSOR} || "
            "has(self.parallelism)",
            message=f"gpusPerReplica above {MAX_TENSOR} spans nodes: set placement.parallelism "
            "(tensor within a node x pipeline stages, e.g. tensor 8 x pipeline 2 for 16 GPUs "
            "on two 8-GPU nodes)",
            check=lambda p: p.gpus_per_replica <= MAX_TENSOR or p.parallelism is not None,
            field_path=".gpusPerReplica",
        ),
        Rule(
            cel=f"!has(self.parallelism) || !has(self.gpusPerReplica) || "
            f"self.gpusPerReplica == {_TENSOR} * {_PIPELINE}",
            message="gpusPerReplica must equal parallelism.tensor x parallelism.pipeline "
            "(or be omitted: it follows parallelism)",
            check=lambda p: p.parallelism is None or p.gpus_per_replica == p.parallelism.gpus,
            field_path=".gpusPerReplica",
        ),
    )

    gpus_per_replica: Annotated[
        int,
        FieldRule(
            cel=f"self >= 1 && self <= {MAX_GPUS_PER_REPLICA}",
            message=f"gpusPerReplica must be between 1 and {MAX_GPUS_PER_REPLICA} (more than "
            f"{MAX_TENSOR} only with placement.parallelism)",
            check=lambda v: 1 <= v <= MAX_GPUS_PER_REPLICA,
        ),
        Field(json_schema_extra={"default": None}),
    ] = 1
    """GPUs per replica; vLLM shards the model over them (tensor parallel within a node).
    Omitted: parallelism.tensor x parallelism.pipeline, or 1."""
    parallelism: ParallelismSpec | None = None
    """Tensor x pipeline parallel (gpusPerReplica = tensor x pipeline). A replica larger
    than one node spans nodes with pipeline stages. Omitted: tensor parallel over
    gpusPerReplica GPUs of one node."""

    @property
    def pipeline_derived(self) -> bool:
        """parallelism is given without pipeline (nor gpusPerReplica): kvq picks the stages."""
        return self.parallelism is not None and self.parallelism.pipeline_derived

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

    @property
    def tensor_parallel(self) -> int:
        """vLLM's --tensor-parallel-size: parallelism.tensor, or every GPU of the replica."""
        return self.parallelism.tensor if self.parallelism else self.gpus_per_replica

    @property
    def pipeline_parallel(self) -> int:
        """vLLM's --pipeline-parallel-size: parallelism.pipeline, or 1."""
        return self.parallelism.pipeline if self.parallelism else 1

    @model_validator(mode="before")
    @classmethod
    def _gpus_follow_parallelism(cls, data: Any) -> Any:
        """gpusPerReplica omitted beside a valid parallelism is tensor x pipeline (the API
        server stores no default for it); anything invalid is left to the field checks."""
        if not isinstance(data, dict) or "gpusPerReplica" in data or "gpus_per_replica" in data:
            return data
        parallelism = data.get("parallelism")
        if isinstance(parallelism, ParallelismSpec):
            return {**data, "gpusPerReplica": parallelism.gpus}
        if not isinstance(parallelism, dict):
            return data
        tensor, pipeline = parallelism.get("tensor", 1), parallelism.get("pipeline", 1)
        if _in_range(tensor, MAX_TENSOR) and _in_range(pipeline, MAX_PIPELINE):
            return {**data, "gpusPerReplica": tensor * pipeline}
        return data


def _in_range(value: Any, top: int) -> bool:
    return type(value) is int and 1 <= value <= top
