"""`spec.placement`: GPUs per replica and where replicas may run."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kvq.api.base import KubeModel
from kvq.api.names import dns_subdomain, label_map
from kvq.api.rules import FieldRule, ListMapKeys, UniqueItems
from kvq.api.scheduling import Affinity, Toleration, TopologySpreadConstraint

PoolPreference = Literal["cheapest", "headroom"]


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
