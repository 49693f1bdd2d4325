"""What the engine pod gets besides the engine's arguments.

Environment from Secrets and ConfigMaps (by reference only), CPU and memory, the model
cache, and the pod-level settings a platform team sets (service account, pull secrets,
scheduling extras, labels and annotations). The shapes follow their Kubernetes
counterparts, so a platform team can copy them from an existing pod spec.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field

from kvq.api import keys
from kvq.api.base import KubeModel
from kvq.api.names import (
    INTEGER_RE,
    annotation_keys,
    config_map_key,
    dns_label_items,
    dns_subdomain,
    dns_subdomain_items,
    label_key,
    label_map,
    label_values,
)
from kvq.api.rules import FieldRule, ListMapKeys, Rule

# A Kubernetes quantity as kvq accepts it: a plain decimal with an optional suffix
# (m for milli-cores; k/M/G/T/P/E decimal, Ki/Mi/Gi/Ti/Pi/Ei binary).
QUANTITY_RE = r"^[0-9]+([.][0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
_SUFFIX = {
    "": 1.0,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}


def quantity_value(quantity: str) -> float:
    """A quantity as a number: "16Gi" -> 17179869184.0, "500m" -> 0.5."""
    match = re.fullmatch(QUANTITY_RE, quantity)
    if match is None:
        raise ValueError(f"not a quantity: {quantity!r}")
    number = quantity[: len(quantity) - len(match.group(2) or "")]
    return float(number) * _SUFFIX[match.group(2) or ""]


Quantity = Annotated[
    str,
    Field(max_length=32),
    FieldRule(
        cel=f"self.matches('{QUANTITY_RE}')",
        message='must be a quantity written as a string, such as "16Gi", "500m" or "4"',
        check=lambda v: re.fullmatch(QUANTITY_RE, v) is not None,
    ),
]
ObjectName = Annotated[
    str, Field(min_length=1, max_length=253), dns_subdomain("the name of a Secret or ConfigMap")
]
# A key of a Secret or ConfigMap.
ObjectKey = Annotated[
    str, Field(min_length=1, max_length=253), config_map_key("a Secret or ConfigMap key")
]
# A Kubernetes quantity that must be more than 0 (a volume's size).
PositiveQuantity = Annotated[
    Quantity,
    FieldRule(
        cel="self.matches('[1-9]')",
        message="size must be greater than 0",
        check=lambda v: re.search("[1-9]", v) is not None,
    ),
]

# Pod labels and annotations kvq writes itself: the selector, the spec hash, the ladder.
OWNED_LABEL_KEYS = (
    keys.LABEL_NAME,
    keys.LABEL_INSTANCE,
    keys.LABEL_COMPONENT,
    keys.LABEL_MANAGED_BY,
)
OWNED_KEY_PREFIX = f"{keys.GROUP}/"
_OWNED_LABELS_CEL = "[" + ", ".join(f"'{k}'" for k in OWNED_LABEL_KEYS) + "]"


def _no_owned_labels(labels: dict[str, str]) -> bool:
    return not any(k in OWNED_LABEL_KEYS or k.startswith(OWNED_KEY_PREFIX) for k in labels)


def _no_owned_annotations(annotations: dict[str, str]) -> bool:
    return not any(k.startswith(OWNED_KEY_PREFIX) for k in annotations)


def _one_of(*present: bool) -> bool:
    return sum(present) == 1


# ---------------------------------------------------------------- environment by reference


class KeySelector(KubeModel):
    """One key of a Secret or ConfigMap in the InferenceService's namespace."""

    name: ObjectName
    """Name of the Secret or ConfigMap."""
    key: ObjectKey
    """The key whose value becomes the variable's value."""
    optional: bool | None = None
    """Start the pod even if the object or key is missing (the variable is then unset)."""


class EnvVarSource(KubeModel):
    """Where a variable's value comes from: a Secret key or a ConfigMap key."""

    kube_rules = (
        Rule(
            cel="(has(self.secretKeyRef) ? 1 : 0) + (has(self.configMapKeyRef) ? 1 : 0) == 1",
            message="valueFrom needs exactly one of secretKeyRef and configMapKeyRef",
            check=lambda s: _one_of(s.secret_key_ref is not None, s.config_map_key_ref is not None),
        ),
    )

    secret_key_ref: KeySelector | None = None
    """A key of a Secret (credentials: HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...)."""
    config_map_key_ref: KeySelector | None = None
    """A key of a ConfigMap (settings: HF_ENDPOINT, AWS_REGION, ...)."""


class ObjectRef(KubeModel):
    """A Secret or ConfigMap in the InferenceService's namespace."""

    name: ObjectName
    """Name of the Secret or ConfigMap."""
    optional: bool | None = None
    """Start the pod even if the object is missing."""


class EnvFromSource(KubeModel):
    """Every key of a Secret or ConfigMap as an environment variable."""

    kube_rules = (
        Rule(
            cel="(has(self.secretRef) ? 1 : 0) + (has(self.configMapRef) ? 1 : 0) == 1",
            message="envFrom needs exactly one of secretRef and configMapRef",
            check=lambda s: _one_of(s.secret_ref is not None, s.config_map_ref is not None),
        ),
    )

    secret_ref: ObjectRef | None = None
    """A Secret whose keys become variables (e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)."""
    config_map_ref: ObjectRef | None = None
    """A ConfigMap whose keys become variables."""
    prefix: Annotated[str | None, Field(max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = None
    """Prepended to every key's name."""


# ---------------------------------------------------------------- resources


class ResourceAmounts(KubeModel):
    """CPU and memory."""

    cpu: Quantity | None = None
    """CPU cores, e.g. "8" or "7500m"."""
    memory: Quantity | None = None
    """Memory, e.g. "64Gi"."""


class EngineResources(KubeModel):
    """CPU and memory of the engine container; the GPUs come from spec.placement.

    Omitted values are derived from the model: memory = 2 GiB + 3 GiB per GPU (the engine's
    processes) + the weights (they pass through host memory while loading) + /dev/shm +
    swap space per GPU on engines that have --swap-space (4 GiB per GPU when swapSpaceGiB
    is omitted); CPU = 2 + 2 per GPU. The memory limit defaults to the request; no CPU
    limit is set unless given here (a throttled engine stalls its scheduling loop).
    """

    requests: ResourceAmounts | None = None
    """What the scheduler reserves."""
    limits: ResourceAmounts | None = None
    """The most the container may use (memory beyond it is an OOM kill)."""


# ---------------------------------------------------------------- model cache


class CacheVolumeClaim(KubeModel):
    """A PersistentVolumeClaim kvq creates for this InferenceService (deleted with it).

    Its name carries a hash of its size, class and access mode: changing one of them makes
    a new claim (and a new download) instead of an edit the API server would refuse.
    """

    storage_class_name: Annotated[
        str | None, Field(min_length=1, max_length=253), dns_subdomain("storageClassName")
    ] = None
    """Storage class; the cluster's default class when omitted."""
    size: PositiveQuantity | None = None
    """Capacity; by default the weights of every model the cache may hold (spec.model.uri
    and spec.model.awq.uri) x 1.2 + 1 GiB, rounded up to GiB."""
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"] = "ReadWriteOnce"
    """ReadWriteOnce shares the cache between replicas on one node; replicas on several
    nodes need a ReadWriteMany class (NFS, EFS, Filestore, CephFS)."""


class CacheEmptyDir(KubeModel):
    """A cache that lives as long as the pod: container restarts reuse it, new pods download."""

    size_limit: Quantity | None = None
    """Most node disk the cache may take (the pod is evicted beyond it); by default the
    model's weights x 1.2 + 1 GiB, rounded up to GiB."""


class ModelCacheSpec(KubeModel):
    """Where the downloaded model is kept, so a restart or another replica skips the download.

    With a cache, an init container (`kvq fetch`, the operator's image) downloads the model
    before the engine starts: hf:// with huggingface_hub at the pinned revision, s3:// with
    boto3; files already in the cache are verified once and then skipped. The engine then
    reads the local copy and never calls the Hub. A download that fails is reported as
    ModelUnavailable, never as a KV-cache problem.
    """

    kube_rules = (
        Rule(
            cel="(has(self.claimName) ? 1 : 0) + (has(self.volumeClaim) ? 1 : 0) "
            "+ (has(self.emptyDir) ? 1 : 0) == 1",
            message="cache needs exactly one of claimName (an existing claim), volumeClaim "
            "(a claim kvq creates) and emptyDir",
            check=lambda c: _one_of(
                c.claim_name is not None, c.volume_claim is not None, c.empty_dir is not None
            ),
        ),
    )

    claim_name: Annotated[
        str | None, Field(min_length=1, max_length=253), dns_subdomain("claimName")
    ] = None
    """An existing PersistentVolumeClaim in the namespace (may be shared by services)."""
    volume_claim: CacheVolumeClaim | None = None
    """A claim kvq creates and owns."""
    empty_dir: CacheEmptyDir | None = None
    """A per-pod emptyDir on the node's disk."""


# ---------------------------------------------------------------- scheduling


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


# ---------------------------------------------------------------- pod settings


class LocalObjectReference(KubeModel):
    """An object in the InferenceService's namespace, by name."""

    name: ObjectName
    """Its name."""


class PodSettings(KubeModel):
    """Pod-level settings of the engine pods: identity, pull secrets, labels, annotations."""

    service_account_name: Annotated[
        str | None, Field(min_length=1, max_length=253), dns_subdomain("serviceAccountName")
    ] = None
    """The pods' ServiceAccount: cloud credentials by workload identity (IRSA on EKS, GKE
    Workload Identity) for s3:// models. The Kubernetes API token is never mounted."""
    image_pull_secrets: Annotated[
        list[LocalObjectReference], Field(max_length=16), ListMapKeys(("name",))
    ] = Field(default_factory=list)
    """Secrets for pulling the engine image (and the operator image the download runs in)."""
    labels: Annotated[
        dict[str, Annotated[str, Field(max_length=63)]],
        Field(max_length=64),
        FieldRule(
            cel=f"self.all(k, !(k in {_OWNED_LABELS_CEL}) && !k.startsWith('{OWNED_KEY_PREFIX}'))",
            message="pod.labels must not set keys kvq owns ("
            + ", ".join(OWNED_LABEL_KEYS)
            + f" or any {OWNED_KEY_PREFIX} key)",
            check=_no_owned_labels,
        ),
        label_map("pod.labels"),
    ] = Field(default_factory=dict)
    """Extra labels on the engine pods."""
    annotations: Annotated[
        dict[str, Annotated[str, Field(max_length=4096)]],
        Field(max_length=64),
        FieldRule(
            cel=f"self.all(k, !k.startsWith('{OWNED_KEY_PREFIX}'))",
            message=f"pod.annotations must not set keys kvq owns (any {OWNED_KEY_PREFIX} key)",
            check=_no_owned_annotations,
        ),
        annotation_keys("pod.annotations"),
    ] = Field(default_factory=dict)
    """Extra annotations on the engine pods (a change rolls the pods)."""
