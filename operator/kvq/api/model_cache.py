"""`spec.model.cache`: where the downloaded model is kept (a claim, a claim kvq creates, or
an emptyDir)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kvq.api.base import KubeModel
from kvq.api.names import dns_subdomain
from kvq.api.quantity import PositiveQuantity, Quantity
from kvq.api.rules import Rule, exactly_one


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
            check=lambda c: exactly_one(
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
