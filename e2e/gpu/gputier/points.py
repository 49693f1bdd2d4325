"""One point of the tier: a model shape and a KV dtype, the InferenceService a user would
write for it, the command kvq renders for the GPU's pool, and what kvq predicts.

The command is kvq's own (`kvq.render.container_command`, wrapper included) for the pool
that matches the GPU; the harness only "mounts" what a pod would get: the wrapper at
/opt/kvq (the ConfigMap) and the model directory at /models/<claim>/<shape> (the PVC).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Any

from gputier.shapes import config_json
from kvq.api.resource import InferenceService
from kvq.catalog.engines import EngineCapability, load_engine_catalog, version_from_image
from kvq.catalog.gpus import GpuModel
from kvq.catalog.models import ModelArchitecture, architecture_from_hf_config
from kvq.placement.pool import NodePool
from kvq.planner import CapacityPlan, plan_capacity
from kvq.planner.layout import Layout, LayoutError, check_layout
from kvq.render import EffectiveSettings, RenderError, container_command, effective_settings
from kvq.render.args import ENGINE_PORT
from kvq.render.model_source import MODELS_ROOT

ENGINE_IMAGE = "vllm/vllm-openai:v0.26.0"
MODEL_CLAIM = "gpu-tier"
DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")
GPU_MEMORY_UTILIZATION = 0.90
# The default: room for the load (3,000 + 256 tokens) on every shape; phi-3-mini-4k allows
# 4,096. A hybrid model's point sets its own (8x its window, run.py --max-model-len).
MAX_MODEL_LEN = 4096
# What the InferenceService adds for a model-free run; kvq renders these from spec.
DUMMY_ARGS = ("--load-format", "dummy", "--skip-tokenizer-init")
# FlashInfer is not in the bundle: keep vLLM's sampler off it (a pod would set the same).
ENGINE_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
# Per model_type, what the InferenceService adds to run without FlashInfer. Gated DeltaNet
# prefill on Hopper defaults to FlashInfer's JIT kernel ("auto"; vLLM 0.26
# model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py `_resolve_gdn_prefill_backend`);
# `--gdn-prefill-backend triton` picks vLLM's own Triton/FLA kernel.
FAMILY_ARGS: dict[str, tuple[str, ...]] = {"qwen3_next": ("--gdn-prefill-backend", "triton")}


PointKey = tuple[str, str, int, int | None, int, int]


class PointError(ValueError):
    """A point this machine or vLLM cannot run as asked (said before anything starts)."""


@dataclass(frozen=True)
class ShapeSpec:
    """One `--shapes` entry: `llama-3.1-70b:tp=4`, `qwen3-next-80b-a3b:len=8192:layers=24`."""

    shape: str
    max_model_len: int = MAX_MODEL_LEN
    layers: int | None = None
    tensor: int = 1
    pipeline: int = 1


@dataclass(frozen=True)
class Point:
    shape: str
    dtype: str
    max_model_len: int = MAX_MODEL_LEN
    layers: int | None = None
    """Fewer layers of the same pattern (a model too big for the GPU); None: all."""
    tensor: int = 1
    """spec.placement.parallelism.tensor (vLLM --tensor-parallel-size)."""
    pipeline: int = 1
    """spec.placement.parallelism.pipeline (vLLM --pipeline-parallel-size)."""

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline

    @property
    def layout(self) -> str:
        """`tp4`, `tp2-pp2`; empty for one GPU."""
        parts = [f"tp{self.tensor}"] if self.tensor > 1 else []
        parts += [f"pp{self.pipeline}"] if self.pipeline > 1 else []
        return "-".join(parts)

    @property
    def variant(self) -> str:
        """The served model: `qwen3-next-80b-a3b-l24` (its first 24 layers) or the shape."""
        return self.shape if self.layers is None else f"{self.shape}-l{self.layers}"

    @property
    def key(self) -> PointKey:
        """What identifies a measured point across runs (--skip-done, report)."""
        return (
            self.shape,
            self.dtype,
            self.max_model_len,
            self.layers,
            self.tensor,
            self.pipeline,
        )

    @property
    def name(self) -> str:
        """The InferenceService name (a DNS label): `qwen2-5-7b-fp8-e4m3`,
        `gemma-3-1b-32768-fp8` (a max model length of its own), `llama-3-1-70b-tp4-fp8`."""
        length = "" if self.max_model_len == MAX_MODEL_LEN else f"-{self.max_model_len}"
        layout = f"-{self.layout}" if self.layout else ""
        name = f"{self.variant}{length}{layout}-{self.dtype}"
        return name.replace(".", "-").replace("_", "-")


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


def parse_shape(spec: str, max_model_len: int, layers: int | None) -> ShapeSpec:
    """`gemma-3-1b:len=32768`, `qwen3-next-80b-a3b:len=8192:layers=24`,
    `llama-3.1-70b:tp=4`, `llama-3.1-70b:tp=2:pp=2`; what a spec leaves out comes from
    run.py's --max-model-len / --layers (and one GPU)."""
    shape, *options = spec.split(":")
    given: dict[str, int] = {}
    for option in options:
        key, _, value = option.partition("=")
        if key not in ("len", "layers", "tp", "pp") or not value.isdigit() or int(value) < 1:
            raise ValueError(
                f"{spec!r}: expected SHAPE[:len=N][:layers=N][:tp=N][:pp=N], got {option!r}"
            )
        given[key] = int(value)
    return ShapeSpec(
        shape,
        given.get("len", max_model_len),
        given.get("layers", layers),
        tensor=given.get("tp", 1),
        pipeline=given.get("pp", 1),
    )


def check_point(point: Point, gpu_count: int, gpu_name: str) -> None:
    """PointError when the point needs more GPUs than this machine has, or a layout vLLM
    refuses for the model (the sizes it accepts named)."""
    if point.gpus > gpu_count:
        raise PointError(
            f"{point.name}: TP {point.tensor} x PP {point.pipeline} = {point.gpus} GPUs is "
            f"wider than this machine's {gpu_count} {gpu_name} GPU(s); run it on a machine "
            f"with {point.gpus} or more (--gpu-count with --dry-run)"
        )
    try:
        check_layout(
            architecture(config_json(point.shape, point.layers)),
            Layout(tensor=point.tensor, pipeline=point.pipeline),
        )
    except LayoutError as error:
        raise PointError(f"{point.name}: vLLM refuses this layout: {error}") from None


def model_path(variant: str) -> str:
    return f"{MODELS_ROOT}/{MODEL_CLAIM}/{variant}"


def inference_service(
    point: Point, *, name: str | None = None, max_num_seqs: int | None = None
) -> InferenceService:
    memory: dict[str, object] = {
        "gpuMemoryUtilization": GPU_MEMORY_UTILIZATION,
        "maxModelLen": point.max_model_len,
    }
    if max_num_seqs is not None:
        memory["maxNumSeqs"] = max_num_seqs
    # What a user writes for several GPUs per replica (gpusPerReplica follows it).
    placement = (
        {"parallelism": {"tensor": point.tensor, "pipeline": point.pipeline}}
        if point.gpus > 1
        else {}
    )
    return InferenceService.model_validate(
        {
            "apiVersion": "kvq.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": name or point.name, "namespace": "gpu-tier"},
            "spec": {
                "model": {"uri": f"pvc://{MODEL_CLAIM}/{point.variant}"},
                "engine": {
                    "image": ENGINE_IMAGE,
                    "extraArgs": [*DUMMY_ARGS, *family_args(point.shape)],
                    "env": [{"name": k, "value": v} for k, v in ENGINE_ENV.items()],
                },
                "kvCache": {"dtype": point.dtype},
                "memory": memory,
                **({"placement": placement} if placement else {}),
            },
        }
    )


def family_args(shape: str) -> tuple[str, ...]:
    return FAMILY_ARGS.get(str(config_json(shape).get("model_type")), ())


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
        auto = inference_service(replace(point, dtype="auto"), name=point.name)
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
        point, isvc, tuple(command), env, model_path(point.variant), rendered_for, substitution
    )


def swap_kv_dtype(command: list[str], engine_value: str) -> list[str]:
    out = list(command)
    at = out.index("--kv-cache-dtype")
    out[at + 1] = engine_value
    return out


def architecture(config: dict[str, Any]) -> ModelArchitecture:
    """What `kvq plan --model config.json` reads from the config the engine was given."""
    return architecture_from_hf_config(config)


@dataclass(frozen=True)
class PlanSettings:
    """The spec's settings `kvq plan` needs besides the model and GPU (saved per point, so
    `run.py report` can plan a saved point again with the current planner)."""

    kv_cache_dtype: str
    max_model_len: int = MAX_MODEL_LEN
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    tensor_parallel: int = 1
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    pipeline_parallel: int = 1


def settings_of(point: Point) -> PlanSettings:
    return PlanSettings(
        point.dtype,
        point.max_model_len,
        tensor_parallel=point.tensor,
        pipeline_parallel=point.pipeline,
    )


def plan_config(config: dict[str, Any], gpu: GpuModel, settings: PlanSettings) -> CapacityPlan:
    """`kvq plan` for a config.json and settings (vLLM's serve defaults where none set)."""
    return plan_capacity(
        architecture(config),
        gpu,
        settings.kv_cache_dtype,
        tensor_parallel=settings.tensor_parallel,
        pipeline_parallel=settings.pipeline_parallel,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        max_model_len=settings.max_model_len,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
    )


def plan_record(plan: CapacityPlan) -> dict[str, Any]:
    """The plan's figures a point keeps (and `run.py report` recomputes); byte figures are
    per GPU (of the bounding stage), `stages` each stage's on one of its GPUs."""
    return {
        "tensor_parallel": plan.tensor_parallel,
        "pipeline_parallel": plan.pipeline_parallel,
        "kv_tokens": plan.kv_tokens,
        "max_concurrency": plan.max_concurrency,
        "num_blocks": plan.num_blocks,
        "available_kv_bytes": plan.available_kv_bytes,
        "weight_bytes": plan.weight_bytes_per_gpu,
        "activation_bytes": plan.activation_bytes,
        "non_torch_bytes": plan.non_torch_bytes,
        "requested_bytes": plan.requested_bytes_per_gpu,
        "kv_bytes_per_token": plan.kv_bytes_per_token,
        "kv_bytes_per_token_per_gpu": plan.kv_bytes_per_token_per_gpu,
        "max_num_batched_tokens": plan.max_num_batched_tokens,
        "max_num_seqs": plan.max_num_seqs,
        "fits": plan.fits,
        "reason": plan.reason,
        "bounding_stage": plan.bounding_stage,
        "stages": [
            {
                "first_layer": stage.first_layer,
                "layers": stage.layers,
                "weight_bytes": stage.weight_bytes_per_gpu,
                "activation_bytes": stage.activation_bytes,
                "available_kv_bytes": stage.available_kv_bytes,
                "num_blocks": stage.num_blocks,
            }
            for stage in plan.stages
        ],
    }


def plan_point(
    point: Point,
    pool: NodePool,
    *,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> CapacityPlan:
    """`kvq plan` for the point's config.json and settings."""
    settings = replace(
        settings_of(point),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    return plan_config(config_json(point.shape, point.layers), pool.gpu, settings)


def plan_command(point: Point, pool: NodePool) -> str:
    """The `kvq plan` command line that reproduces the point's figure (with fewer layers:
    the config.json the engine was given, saved in the result as `config`)."""
    model = point.shape if point.layers is None else f"{point.variant}/config.json"
    if point.pipeline > 1:
        layout = (
            f"--parallelism {point.tensor}x{point.pipeline} --gpus-per-node {pool.gpus_per_node} "
        )
    else:
        layout = f"--gpus {point.tensor} " if point.tensor > 1 else ""
    return (
        f"kvq plan --model {model} --gpu {pool.gpu.product} {layout}"
        f"--kv-cache-dtype {point.dtype} "
        f"--gpu-memory-utilization {GPU_MEMORY_UTILIZATION} "
        f"--max-model-len {point.max_model_len} "
        f"--engine-version {engine_capability().version} -o json"
    )
