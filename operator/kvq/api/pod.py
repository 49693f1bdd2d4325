"""`spec.pod`: pod-level settings a platform team sets on the engine pods (service
account, image pull secrets, labels and annotations), and the keys kvq keeps for itself."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kvq.api import keys
from kvq.api.base import KubeModel
from kvq.api.names import ObjectName, annotation_keys, dns_subdomain, label_map
from kvq.api.rules import FieldRule, ListMapKeys

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
