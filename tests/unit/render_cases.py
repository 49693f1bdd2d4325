"""InferenceServices and pools shared by the render tests and goldens."""

from __future__ import annotations

from typing import Any

from kvq.api.resource import InferenceService
from kvq.catalog.engines import load_engine_catalog
from kvq.catalog.gpus import GpuModel, load_gpu_catalog
from kvq.catalog.models import ModelArchitecture, load_model_catalog
from kvq.placement.pool import NodePool, pool_for_gpu
from kvq.planner.architecture import UnknownModelError, resolve_architecture
from kvq.render import EffectiveSettings, effective_settings

ENGINES = load_engine_catalog()
MODELS = load_model_catalog()


def isvc(name: str = "llama", namespace: str | None = "team-a", **spec: Any) -> InferenceService:
    body: dict[str, Any] = {
        "apiVersion": "kvq.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
        "spec": {"model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct"}, **spec},
    }
    return InferenceService.model_validate(body)


def gpu(product: str) -> GpuModel:
    found = load_gpu_catalog().lookup(product)
    assert found is not None, product
    return found


def pool(product: str, gpus_per_node: int = 8) -> NodePool:
    return pool_for_gpu(gpu(product), gpus_per_node)


def settings(service: InferenceService, product: str, rung: str = "requested") -> EffectiveSettings:
    """The effective settings of a rung on a GPU, with kvq's engine catalog and, as the
    operator does, the model's architecture (which sizes the pod) when kvq knows it."""
    return effective_settings(
        service,
        gpu(product),
        rung,  # type: ignore[arg-type]
        engines=ENGINES,
        arch=architecture(service),
    )


def architecture(service: InferenceService) -> ModelArchitecture | None:
    try:
        return resolve_architecture(service.spec.model, MODELS)
    except UnknownModelError:
        return None
