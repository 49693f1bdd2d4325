"""Kubernetes scheduling shapes for the engine pods: tolerations, affinity, topology spread.

They follow their Kubernetes counterparts, so a platform team can copy them from an
existing pod spec."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field

from kvq.api.base import KubeModel
from kvq.api.names import (
    INTEGER_RE,
    dns_label_items,
    dns_subdomain_items,
    label_key,
    label_map,
    label_value,
    label_values,
)
from kvq.api.rules import Rule


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


_VALUES_FOR_OPERATOR = Rule(
    cel="(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
    message="values: In and NotIn need at least one value; Exists and DoesNotExist take none",
    check=lambda r: (r.operator in ("In", "NotIn")) == bool(r.values),
    field_path=".values",
)


class LabelSelectorRequirement(KubeModel):
    """A label key, an operator and values."""

    kube_rules = (_VALUES_FOR_OPERATOR,)

    key: Annotated[str, Field(min_length=1, max_length=317), label_key("key")]
    """Label key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """In, NotIn, Exists or DoesNotExist."""
    values: Annotated[
        list[Annotated[str, Field(max_length=63)]], Field(max_length=64), label_values("values")
    ] = Field(default_factory=list)
    """Values for In and NotIn."""


class LabelSelector(KubeModel):
    """Selects pods by their labels."""

    match_labels: Annotated[
        dict[str, Annotated[str, Field(max_length=63)]],
        Field(max_length=32),
        label_map("matchLabels"),
    ] = Field(default_factory=dict)
    """Labels a pod must carry."""
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=16)] = Field(
        default_factory=list
    )
    """Expressions a pod's labels must satisfy."""


def _one_integer_for_gt_lt(r: NodeSelectorRequirement) -> bool:
    if r.operator not in ("Gt", "Lt"):
        return True
    return len(r.values) == 1 and re.fullmatch(INTEGER_RE, r.values[0]) is not None


class NodeSelectorRequirement(KubeModel):
    """A node label key, an operator and values."""

    kube_rules = (
        Rule(
            cel="(self.operator in ['In', 'NotIn', 'Gt', 'Lt']) "
            "== (has(self.values) && size(self.values) > 0)",
            message="values: In, NotIn, Gt and Lt need values; Exists and DoesNotExist take none",
            check=lambda r: (r.operator in ("In", "NotIn", "Gt", "Lt")) == bool(r.values),
            field_path=".values",
        ),
        Rule(
            cel="!(self.operator in ['Gt', 'Lt']) || (has(self.values) && size(self.values) == 1 "
            f"&& self.values[0].matches('{INTEGER_RE}'))",
            message="values: Gt and Lt compare with one integer",
            check=_one_integer_for_gt_lt,
            field_path=".values",
        ),
    )

    key: Annotated[str, Field(min_length=1, max_length=317), label_key("key")]
    """Node label key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """In, NotIn, Exists, DoesNotExist, Gt or Lt."""
    values: Annotated[
        list[Annotated[str, Field(max_length=63)]], Field(max_length=64), label_values("values")
    ] = Field(default_factory=list)
    """Values (one integer for Gt and Lt)."""


class NodeFieldSelectorRequirement(KubeModel):
    """A node by name: the only node field Kubernetes selects on."""

    key: Literal["metadata.name"]
    """metadata.name."""
    operator: Literal["In", "NotIn"]
    """In or NotIn."""
    values: Annotated[
        list[Annotated[str, Field(max_length=253)]],
        Field(min_length=1, max_length=1),
        dns_subdomain_items("a node name"),
    ]
    """One node name."""


class NodeSelectorTerm(KubeModel):
    """Requirements that must all hold."""

    match_expressions: Annotated[list[NodeSelectorRequirement], Field(max_length=16)] = Field(
        default_factory=list
    )
    """Requirements on node labels."""
    match_fields: Annotated[list[NodeFieldSelectorRequirement], Field(max_length=16)] = Field(
        default_factory=list
    )
    """Requirements on node fields (metadata.name)."""


class NodeSelector(KubeModel):
    """Terms of which at least one must hold."""

    node_selector_terms: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=16)]
    """The terms (ORed)."""


class PreferredSchedulingTerm(KubeModel):
    """A node preference with a weight."""

    weight: Annotated[int, Field(ge=1, le=100)]
    """Weight, 1-100."""
    preference: NodeSelectorTerm
    """The preferred nodes."""


class NodeAffinity(KubeModel):
    """Which nodes replicas must or should run on (besides the pool kvq chose)."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    """Nodes a replica must run on."""
    preferred_during_scheduling_ignored_during_execution: Annotated[
        list[PreferredSchedulingTerm], Field(max_length=16)
    ] = Field(default_factory=list)
    """Nodes a replica should run on, by weight."""


class PodAffinityTerm(KubeModel):
    """Pods (by label) in a topology domain (by node label)."""

    label_selector: LabelSelector | None = None
    """The pods."""
    namespaces: Annotated[
        list[Annotated[str, Field(max_length=63)]],
        Field(max_length=16),
        dns_label_items("namespaces"),
    ] = Field(default_factory=list)
    """Their namespaces; the InferenceService's own when empty."""
    topology_key: Annotated[str, Field(min_length=1, max_length=317), label_key("topologyKey")]
    """Node label that defines the domain (kubernetes.io/hostname, topology.kubernetes.io/zone)."""


class WeightedPodAffinityTerm(KubeModel):
    """A pod (anti-)affinity preference with a weight."""

    weight: Annotated[int, Field(ge=1, le=100)]
    """Weight, 1-100."""
    pod_affinity_term: PodAffinityTerm
    """The term."""


class PodAffinity(KubeModel):
    """Pods a replica must or should run near (affinity) or away from (anti-affinity)."""

    required_during_scheduling_ignored_during_execution: Annotated[
        list[PodAffinityTerm], Field(max_length=16)
    ] = Field(default_factory=list)
    """Hard terms."""
    preferred_during_scheduling_ignored_during_execution: Annotated[
        list[WeightedPodAffinityTerm], Field(max_length=16)
    ] = Field(default_factory=list)
    """Soft terms, by weight."""


class Affinity(KubeModel):
    """Kubernetes affinity for the engine pods, added to the pool's node selector."""

    node_affinity: NodeAffinity | None = None
    """Node affinity."""
    pod_affinity: PodAffinity | None = None
    """Pod affinity."""
    pod_anti_affinity: PodAffinity | None = None
    """Pod anti-affinity."""


class TopologySpreadConstraint(KubeModel):
    """How replicas spread over a topology (zones, nodes)."""

    kube_rules = (
        Rule(
            cel="!has(self.minDomains) || self.whenUnsatisfiable == 'DoNotSchedule'",
            message="minDomains applies only with whenUnsatisfiable DoNotSchedule",
            check=lambda c: c.min_domains is None or c.when_unsatisfiable == "DoNotSchedule",
            field_path=".minDomains",
        ),
    )

    max_skew: Annotated[int, Field(ge=1, le=1000)] = 1
    """Most replicas one domain may have above the least-loaded one."""
    topology_key: Annotated[str, Field(min_length=1, max_length=317), label_key("topologyKey")]
    """Node label that defines the domains (topology.kubernetes.io/zone, ...)."""
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = "ScheduleAnyway"
    """DoNotSchedule (a hard rule) or ScheduleAnyway (a preference)."""
    label_selector: LabelSelector | None = None
    """Pods counted; this InferenceService's replicas when omitted."""
    min_domains: Annotated[int | None, Field(ge=1, le=1000)] = None
    """Fewest domains to spread over (with DoNotSchedule)."""
