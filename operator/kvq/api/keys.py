"""Every label, annotation, resource and field-manager name kvq reads or writes."""

from __future__ import annotations

# The InferenceService resource.
GROUP = "kvq.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ("kis",)
CATEGORIES = ("kvq",)

# Labels on everything kvq renders.
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_INFERENCESERVICE = f"{GROUP}/inferenceservice"

NAME_VALUE = "vllm"
# Extra tiers' pods: another name, so the default tier's (immutable) selector never takes them.
TIER_NAME_VALUE = "vllm-tier"
LABEL_TIER = f"{GROUP}/tier"
COMPONENT_ENGINE = "engine"
MANAGED_BY_VALUE = "kvq"

# Pod-template annotation: sha256 of the rendered pod inputs; a change rolls the pods.
ANNOTATION_SPEC_HASH = f"{GROUP}/spec-hash"
# Pod-template annotations naming what a pod runs, so its failures are charged to the right
# rung of the right ladder on the right pool.
ANNOTATION_LADDER_KEY = f"{GROUP}/ladder-key"
ANNOTATION_RUNG = f"{GROUP}/rung"
ANNOTATION_POOL = f"{GROUP}/pool"
# On a quality probe's Job and pod: the rendering it probes (the spec hash's first 16).
LABEL_PROBED_HASH = f"{GROUP}/probed-hash"
# On an InferenceService: set (or change) to any value to try the requested dtype again.
ANNOTATION_RETRY = f"{GROUP}/retry-requested"

FINALIZER = f"{GROUP}/finalizer"
FIELD_MANAGER = "kvq"

# NVIDIA: the extended resource, the GPU Feature Discovery product label, the usual taint.
GPU_RESOURCE = "nvidia.com/gpu"
GFD_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_TAINT_KEY = "nvidia.com/gpu"
