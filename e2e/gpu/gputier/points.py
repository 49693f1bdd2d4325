"""One point of the tier: a model shape and a KV dtype, the InferenceService a user would
write for it, the command kvq renders for the GPU's pool, and what kvq predicts.

The command is kvq's own (`kvq.render.container_command`, wrapper included) for the pool
that matches the GPU; the harness only "mounts" what a pod would get: the wrapper at
/opt/kvq (the ConfigMap) and the model directory at /models/<claim>/<shape> (the PVC).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from kvq.api.resource import InferenceService
from kvq.catalog.engines import EngineCapability, load_engine_catalog, version_from_image
from kvq.catalog.models import ModelArchitecture, load_model_catalog
from kvq.placement.pool import NodePool
from kvq.planner import CapacityPlan, plan_capacity
from kvq.render import EffectiveSettings, RenderError, container_command, effective_settings
from kvq.render.args import ENGINE_PORT
from kvq.render.model_source import MODELS_ROOT

ENGINE_IMAGE = "vllm/vllm-openai:v0.26.0"
MODEL_CLAIM = "gpu-tier"
DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")
GPU_MEMORY_UTILIZATION = 0.90
# Room for the load (3,000 + 256 tokens) on every shape: phi-3-mini-4k allows 4,096.
MAX_MODEL_LEN = 4096
# What the InferenceService adds for a model-free run; kvq renders these from spec.
DUMMY_ARGS = ("--load-format", "dummy", "--skip-tokenizer-init")
# FlashInfer is not in the bundle: keep vLLM's sampler off it (a pod would set the same).
ENGINE_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}


@dataclass(frozen=True)
class Point:
    shape: str
    dtype: str

    @property
    def name(self) -> str:
        """The InferenceService name (a DNS label): `qwen2-5-7b-fp8-e4m3`."""
        return f"{self.shape}-{self.dtype}".replace(".", "-").replace("_", "-")


@dataclass(frozen=True)
class Prediction:
    """What kvq's catalog says the engine does with this dtype on this GPU."""

    runs: bool
    engine_value: str | None
    reason: str
    slow_warning: str | None


@dataclass(frozen=True)
class RenderedPoint:
    point: Point
    isvc: InferenceService
    command: tuple[str, ...]
    env: dict[str, str]
    model_dir: str
    rendered_for: str
    """The dtype kvq rendered: the point's own, or `auto` when kvq refuses the point's
    dtype on this GPU (the harness then swaps in the dtype to see what vLLM does)."""
    substitution: str | None


def model_path(shape: str) -> str:
    return f"{MODELS_ROOT}/{MODEL_CLAIM}/{shape}"


def inference_service(
    point: Point, *, name: str | None = None, max_num_seqs: int | None = None
) -> InferenceService:
    memory: dict[str, object] = {
        "gpuMemoryUtilization": GPU_MEMORY_UTILIZATION,
        "maxModelLen": MAX_MODEL_LEN,
    }
    if max_num_seqs is not None:
        memory["maxNumSeqs"] = max_num_seqs
    return InferenceService.model_validate(
        {
            "apiVersion": "kvq.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": name or point.name, "namespace": "gpu-tier"},
            "spec": {
                "model": {"uri": f"pvc://{MODEL_CLAIM}/{point.shape}"},
                "engine": {
                    "image": ENGINE_IMAGE,
                    "extraArgs": list(DUMMY_ARGS),
                    "env": [{"name": k, "value": v} for k, v in ENGINE_ENV.items()],
                },
                "kvCache": {"dtype": point.dtype},
                "memory": memory,
            },
        }
    )


def engine_capability() -> EngineCapability:
    version = version_from_image(ENGINE_IMAGE)
    assert version is not None
    return load_engine_catalog().capability(version)


def predict(point: Point, pool: NodePool) -> Prediction:
    capability = engine_capability()
    cc = pool.gpu.compute_capability
    verdict = capability.kv_dtype_verdict(point.dtype, cc)
    return Prediction(
        runs=verdict.ok,
        engine_value=verdict.engine_value,
        reason=verdict.reason,
        slow_warning=capability.slow_warning(point.dtype, cc),
    )


def settings_for(isvc: InferenceService, pool: NodePool) -> EffectiveSettings:
    """`kvq.render.effective_settings` for the requested rung (it takes the engine catalog
    as an argument in newer kvq, loaded it itself before)."""
    if "engines" in inspect.signature(effective_settings).parameters:
        return effective_settings(isvc, pool.gpu, engines=load_engine_catalog())
    return effective_settings(isvc, pool.gpu)


def render_point(
    point: Point, pool: NodePool, *, python: str = "python3", port: int = ENGINE_PORT
) -> RenderedPoint:
    """kvq's container command for the point; for a dtype kvq refuses to render here, the
    command kvq renders for `auto` with only the KV dtype swapped (recorded as such)."""
    isvc = inference_service(point)
    try:
        settings = settings_for(isvc, pool)
        command = container_command(isvc, pool, settings, python=python, port=port)
        rendered_for, substitution = point.dtype, None
    except RenderError as refusal:
        auto = inference_service(Point(point.shape, "auto"), name=point.name)
        settings = settings_for(auto, pool)
        base = container_command(auto, pool, settings, python=python, port=port)
        engine_value = engine_capability().engine_value(point.dtype) or point.dtype
        command = swap_kv_dtype(base, engine_value)
        rendered_for = "auto"
        substitution = (
            f"kvq refuses to render {point.dtype} here ({refusal}); ran the command kvq renders "
            f"for auto with --kv-cache-dtype {engine_value}"
        )
    env = {e.name: e.value for e in isvc.spec.engine.env}
    return RenderedPoint(
        point, isvc, tuple(command), env, model_path(point.shape), rendered_for, substitution
    )


def swap_kv_dtype(command: list[str], engine_value: str) -> list[str]:
    out = list(command)
    at = out.index("--kv-cache-dtype")
    out[at + 1] = engine_value
    return out


def architecture(shape: str) -> ModelArchitecture:
    found = load_model_catalog().lookup(shape)
    if found is None:
        raise ValueError(f"kvq's model catalog has no {shape!r}")
    return found.architecture


def plan_point(
    point: Point,
    pool: NodePool,
    *,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> CapacityPlan:
    """`kvq plan` for the point's settings (vLLM's serve defaults where the spec sets none)."""
    return plan_capacity(
        architecture(point.shape),
        pool.gpu,
        point.dtype,
        tensor_parallel=1,
        gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )


def plan_command(point: Point, pool: NodePool) -> str:
    """The `kvq plan` command line that reproduces the point's figure."""
    return (
        f"kvq plan --model {point.shape} --gpu {pool.gpu.product} --kv-cache-dtype {point.dtype} "
        f"--gpu-memory-utilization {GPU_MEMORY_UTILIZATION} --max-model-len {MAX_MODEL_LEN} "
        f"--engine-version {engine_capability().version} -o json"
    )
