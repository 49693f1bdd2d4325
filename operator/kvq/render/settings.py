"""What the renderer renders: the settings after placement and fallback decided them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvq.api.models import InferenceService
from kvq.catalog.engines import (
    DEFAULT_IMAGE,
    EngineCapability,
    EngineCatalog,
    EngineVersionError,
    parse_minor,
    version_from_image,
)
from kvq.catalog.gpus import GpuModel

RungName = Literal["requested", "auto", "awq"]

# AWQ-Marlin kernels need Ampere (8.0) or newer; older GPUs run the plain AWQ kernels.
_MARLIN_MIN_CC = (8, 0)
_AWQ_MIN_CC = (7, 5)


class RenderError(ValueError):
    """The InferenceService cannot be rendered for this engine or pool; the message says why."""


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
    isvc: InferenceService, gpu: GpuModel, rung: RungName = "requested", *, engines: EngineCatalog
) -> EffectiveSettings:
    """Settings for one rung of the ladder: as requested, `auto` KV, or AWQ weights + auto KV."""
    image, version = engine_image_and_version(isvc)
    try:
        capability = engines.capability(version)
    except EngineVersionError as error:
        raise RenderError(str(error)) from error
    spec = isvc.spec
    if rung == "requested":
        return EffectiveSettings(
            spec.kv_cache.dtype, spec.model.uri, None, version, image, capability
        )
    if rung == "auto":
        return EffectiveSettings("auto", spec.model.uri, None, version, image, capability)
    if spec.model.awq is None:
        raise RenderError("the awq rung needs spec.model.awq.uri")
    quantization = awq_quantization(gpu.compute_capability)
    if quantization is None:
        raise RenderError(
            f"AWQ kernels need compute capability 7.5 or newer; {gpu.product} has "
            f"{gpu.compute_capability_str}"
        )
    return EffectiveSettings("auto", spec.model.awq.uri, quantization, version, image, capability)
