"""What the renderer renders: the settings after placement and fallback decided them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvq.api.resource import InferenceService
from kvq.catalog.engines import (
    DEFAULT_IMAGE,
    CpuTierVerdict,
    EngineCapability,
    EngineCatalog,
    EngineVersionError,
    parse_minor,
    version_from_image,
)
from kvq.catalog.gpus import GpuModel
from kvq.catalog.models import ModelArchitecture
from kvq.planner.host_tier import cpu_tier_verdict
from kvq.planner.weights import weight_bytes_per_gpu

RungName = Literal["requested", "auto", "awq"]

# AWQ-Marlin kernels need Ampere (8.0) or newer; older GPUs run the plain AWQ kernels.
_MARLIN_MIN_CC = (8, 0)
_AWQ_MIN_CC = (7, 5)


class RenderError(ValueError):
    """The InferenceService cannot be rendered for this engine or pool; the message says why."""


@dataclass(frozen=True)
class ModelFootprint:
    """Sizes the pod is derived from: host memory, cache size, start-up budget."""

    served_weight_bytes: int
    """Weights of the model this rung serves (bf16, or AWQ on the awq rung), all GPUs."""
    cached_weight_bytes: int
    """Weights of every model the cache may hold (spec.model.uri and spec.model.awq.uri
    when they are downloaded), so the cache's size does not change with the rung."""


def model_footprint(isvc: InferenceService, arch: ModelArchitecture, rung: str) -> ModelFootprint:
    """The footprint of `isvc`'s model on `rung`, from its architecture (catalog or spec)."""
    full = weight_bytes_per_gpu(arch, "bf16", 1)
    awq = weight_bytes_per_gpu(arch, "awq", 1)
    model = isvc.spec.model
    cached = full if not model.uri.startswith("pvc://") else 0
    if model.awq is not None and not model.awq.uri.startswith("pvc://"):
        cached += awq
    return ModelFootprint(awq if rung == "awq" else full, cached)


@dataclass(frozen=True)
class EffectiveSettings:
    """The decisions rendering follows (and status reports as `effective`)."""

    kv_cache_dtype: str
    """API dtype after fallback (auto, fp8, fp8_e4m3, fp8_e5m2, int8)."""
    model_uri: str
    """The model actually served: spec.model.uri, or spec.model.awq.uri on the awq rung."""
    quantization: str | None
    """Weight quantization passed to the engine (awq_marlin / awq on the awq rung)."""
    engine_version: str
    image: str
    capability: EngineCapability
    """What this engine version accepts (flags, dtypes, launcher), from the catalog."""
    footprint: ModelFootprint | None = None
    """The model's sizes; None when the caller gave no architecture (then nothing is derived
    from the model's size: no memory default, a fixed start-up budget, no default cache size)."""
    cpu_tier: CpuTierVerdict | None = None
    """The KV cache's host-memory tier (spec.memory.swapSpaceGiB) on this engine; None when
    there is none. Never a refused one: effective_settings raises instead."""


def awq_quantization(compute_capability: tuple[int, int]) -> str | None:
    """The `--quantization` value for an AWQ model on a GPU, None if AWQ cannot run there.

    vLLM's awq_marlin kernels need compute capability 8.0 (AWQMarlinConfig min capability
    80); the plain AWQ kernel needs Turing, 7.5 (AWQConfig: 75).
    """
    if compute_capability >= _MARLIN_MIN_CC:
        return "awq_marlin"
    if compute_capability >= _AWQ_MIN_CC:
        return "awq"
    return None


def engine_image_and_version(isvc: InferenceService) -> tuple[str, str]:
    """The image to run and the vLLM version it holds (spec.engine.version wins over the tag)."""
    image = isvc.spec.engine.image or DEFAULT_IMAGE
    version = isvc.spec.engine.version or version_from_image(image)
    if version is None:
        raise RenderError(
            f"cannot tell the vLLM version of image {image!r} from its tag: set spec.engine.version"
        )
    try:
        parse_minor(version)
    except EngineVersionError as error:
        raise RenderError(str(error)) from error
    return image, version.removeprefix("v")


def effective_settings(
    isvc: InferenceService,
    gpu: GpuModel,
    rung: RungName = "requested",
    *,
    engines: EngineCatalog,
    arch: ModelArchitecture | None = None,
) -> EffectiveSettings:
    """Settings for one rung of the ladder: as requested, `auto` KV, or AWQ weights + auto KV.

    `arch` (the model's architecture, as placement resolved it) sizes the pod: memory, the
    model cache and the start-up probe's budget.
    """
    footprint = None if arch is None else model_footprint(isvc, arch, rung)
    image, version = engine_image_and_version(isvc)
    try:
        capability = engines.capability(version)
    except EngineVersionError as error:
        raise RenderError(str(error)) from error
    spec = isvc.spec
    tier = host_tier_of(isvc, capability, image)
    if rung == "requested":
        return EffectiveSettings(
            spec.kv_cache.dtype, spec.model.uri, None, version, image, capability, footprint, tier
        )
    if rung == "auto":
        return EffectiveSettings(
            "auto", spec.model.uri, None, version, image, capability, footprint, tier
        )
    if spec.model.awq is None:
        raise RenderError("the awq rung needs spec.model.awq.uri")
    quantization = awq_quantization(gpu.compute_capability)
    if quantization is None:
        raise RenderError(
            f"AWQ kernels need compute capability 7.5 or newer; {gpu.product} has "
            f"{gpu.compute_capability_str}"
        )
    return EffectiveSettings(
        "auto", spec.model.awq.uri, quantization, version, image, capability, footprint, tier
    )


def host_tier_of(
    isvc: InferenceService, capability: EngineCapability, image: str
) -> CpuTierVerdict | None:
    """The CPU tier the spec asks of this engine (None: none); RenderError when the engine
    cannot keep it, with the reason (the CRD refuses it already where the version is known
    from the spec; this catches the rest, e.g. an object applied under an older CRD)."""
    memory = isvc.spec.memory
    verdict = cpu_tier_verdict(capability, memory.swap_space_gib, memory.offload_backend, image)
    if verdict is not None and not verdict.ok:
        raise RenderError(f"memory.swapSpaceGiB: {verdict.reason}")
    return verdict
