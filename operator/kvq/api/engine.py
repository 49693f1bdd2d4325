"""`spec.engine`: the vLLM image, its version, extra arguments, environment and resources."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

from kvq.api.base import KubeModel
from kvq.api.credentials import CREDENTIAL_FLAG_RE, is_credential_flag
from kvq.api.environment import EnvFromList, EnvList
from kvq.api.quantity import Quantity
from kvq.api.rules import FieldRule, Rule

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
    "--pipeline-parallel-size",
    "-pp",
    "--kv-cache-memory-bytes",
    "--kv-offloading-size",
    "--kv-offloading-backend",
    "--quantization",
    "--calculate-kv-scales",
    "--served-model-name",
    "--port",
    "--host",
    "--revision",
)

_VERSION_RE = r"^v?[0-9]+[.][0-9]+([.][0-9]+)?$"


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
