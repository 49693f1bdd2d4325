"""The engine's command line, correct for its vLLM version.

One code path renders the command for the Deployment and for the engine tests that run
it locally, so what the tests prove is what the cluster runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvq.api.engine import MANAGED_FLAGS
from kvq.api.resource import InferenceService
from kvq.catalog.engines import EngineCapability
from kvq.placement.pool import NodePool, nodes_per_replica
from kvq.planner.host_tier import host_tier_gib_per_gpu
from kvq.render.model_source import ModelSource, resolve_model_source
from kvq.render.settings import EffectiveSettings, RenderError

ENGINE_PORT = 8000
WRAPPER_DIR = "/opt/kvq"
WRAPPER_FILE = "evidence_wrapper.py"
WRAPPER_PATH = f"{WRAPPER_DIR}/{WRAPPER_FILE}"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# `vllm serve` as a module: the same Python as the API server, no `vllm` script on PATH needed.
CLI_MODULE = "vllm.entrypoints.cli.main"


@dataclass(frozen=True)
class DroppedFlag:
    """A spec setting not rendered because this engine lacks it (reported in status)."""

    flag: str
    reason: str


@dataclass(frozen=True)
class RenderedArgs:
    args: tuple[str, ...]
    dropped: tuple[DroppedFlag, ...]


def engine_args(
    isvc: InferenceService,
    pool: NodePool,
    effective: EffectiveSettings,
    *,
    port: int = ENGINE_PORT,
    alias: str | None = None,
) -> RenderedArgs:
    """The engine's arguments (model first), refusing what this engine or pool cannot run.

    `port` is for local runs (engine tests) that cannot bind 8000; pods always use 8000.
    `alias`: one more name the engine answers to (a tier's OpenAI model name).
    """
    capability = effective.capability
    spec = isvc.spec
    source = resolve_model_source(
        effective.model_uri,
        _revision_for(isvc, effective),
        cached=spec.model.cache is not None,
    )
    args: list[str] = [*_model_args(capability, source)]
    dropped: list[DroppedFlag] = []

    def add(flag: str, value: str | None = None) -> None:
        if not capability.has_flag(flag):
            raise RenderError(f"vLLM {capability.version} has no {flag}, which kvq needs here")
        args.extend([flag] if value is None else [flag, value])

    if source.revision is not None:
        add("--revision", source.revision)
    if alias is not None and alias != isvc.metadata.name:
        args.extend(["--served-model-name", isvc.metadata.name, alias])
    else:
        add("--served-model-name", isvc.metadata.name)
    add("--port", str(port))
    placement = spec.placement
    # A replica over several nodes gets its launch flags (--nnodes ...) from
    # render.leaderworkerset; one that does not split over whole nodes is refused.
    if not nodes_per_replica(
        placement.tensor_parallel, placement.pipeline_parallel, pool.gpus_per_node
    ):
        raise RenderError(
            f"gpusPerReplica {placement.gpus_per_replica} does not fit on one node of pool "
            f"{pool.name} ({pool.gpus_per_node} GPUs per node)"
        )
    add("--tensor-parallel-size", str(placement.tensor_parallel))
    if placement.pipeline_parallel > 1:  # stages on one node's GPUs
        add("--pipeline-parallel-size", str(placement.pipeline_parallel))

    verdict = capability.kv_dtype_verdict(effective.kv_cache_dtype, pool.gpu.compute_capability)
    if not verdict.ok or verdict.engine_value is None:
        raise RenderError(f"kvCache.dtype {effective.kv_cache_dtype}: {verdict.reason}")
    engine_dtype = verdict.engine_value
    add("--kv-cache-dtype", engine_dtype)

    if spec.kv_cache.block_size is not None:
        backend = capability.likely_backend(engine_dtype, pool.gpu.compute_capability)
        block = capability.block_size_verdict(spec.kv_cache.block_size, backend)
        if not block.ok:
            raise RenderError(f"kvCache.blockSize: {block.reason}")
        add("--block-size", str(spec.kv_cache.block_size))

    add("--gpu-memory-utilization", _number(spec.memory.gpu_memory_utilization))
    _host_tier(isvc, effective, args)
    if spec.memory.max_model_len is not None:
        add("--max-model-len", str(spec.memory.max_model_len))
    if spec.memory.max_num_seqs is not None:
        add("--max-num-seqs", str(spec.memory.max_num_seqs))
    dropped.extend(_calculate_scales(isvc, capability, engine_dtype, args))
    if effective.quantization is not None:
        add("--quantization", effective.quantization)
    if source.load_format is not None:
        if source.load_format not in capability.load_formats:
            raise RenderError(
                f"model uri {effective.model_uri}: vLLM {capability.version} cannot stream "
                f"from object storage (no --load-format {source.load_format})"
            )
        add("--load-format", source.load_format)

    args.extend(
        _checked_extra_args(spec.engine.extra_args, managed_load_format=bool(source.load_format))
    )
    return RenderedArgs(args=tuple(args), dropped=tuple(dropped))


def engine_command(
    isvc: InferenceService,
    pool: NodePool,
    effective: EffectiveSettings,
    *,
    python: str = "python3",
    port: int = ENGINE_PORT,
    alias: str | None = None,
) -> list[str]:
    """The engine's full command line (launcher + arguments)."""
    capability = effective.capability
    rendered = engine_args(isvc, pool, effective, port=port, alias=alias)
    if capability.launcher == "serve":
        return ["vllm", "serve", *rendered.args]
    return [python, "-m", API_SERVER_MODULE, *rendered.args]


def container_command(
    isvc: InferenceService,
    pool: NodePool,
    effective: EffectiveSettings,
    *,
    python: str = "python3",
    wrapper_path: str = WRAPPER_PATH,
    port: int = ENGINE_PORT,
    alias: str | None = None,
) -> list[str]:
    """The container command: the failure-evidence wrapper around the engine command."""
    engine = engine_command(isvc, pool, effective, python=python, port=port, alias=alias)
    return [python, wrapper_path, "--", *engine]


def _revision_for(isvc: InferenceService, effective: EffectiveSettings) -> str | None:
    # The revision pins spec.model.uri; the AWQ variant is another repository.
    return isvc.spec.model.revision if effective.model_uri == isvc.spec.model.uri else None


def _model_args(capability: EngineCapability, source: ModelSource) -> list[str]:
    if capability.launcher == "serve":
        return [source.model_arg]
    return ["--model", source.model_arg]


def _host_tier(isvc: InferenceService, effective: EffectiveSettings, args: list[str]) -> None:
    """The KV cache's CPU tier: --swap-space (V0 swap, GiB per GPU) or KV offloading
    (--kv-offloading-size, GiB in total over the TP ranks, and its backend)."""
    swap = isvc.spec.memory.swap_space_gib
    tier = effective.cpu_tier
    if tier is None:
        if swap == 0 and effective.capability.cpu_tier.mode == "swap":
            args.extend(["--swap-space", "0"])  # no tier, not the engine's 4 GiB default
        return
    gib = host_tier_gib_per_gpu(tier.mode, swap)
    if tier.mode == "swap":
        if swap is not None:  # unset: the engine's own default (4 GiB), as planned
            args.extend(["--swap-space", _number(gib)])
        return
    if any(a.split("=", 1)[0] == "--kv-transfer-config" for a in isvc.spec.engine.extra_args):
        raise RenderError(
            "memory.swapSpaceGiB turns on vLLM's KV offloading, which sets the engine's "
            "--kv-transfer-config itself; engine.extraArgs sets one too: drop one of them"
        )
    total = gib * isvc.spec.placement.gpus_per_replica
    assert tier.backend is not None
    args.extend(["--kv-offloading-size", _number(total), "--kv-offloading-backend", tier.backend])


def _calculate_scales(
    isvc: InferenceService, capability: EngineCapability, engine_dtype: str, args: list[str]
) -> list[DroppedFlag]:
    if not isvc.spec.kv_cache.calculate_scales:
        return []
    if not engine_dtype.startswith("fp8"):
        return [
            DroppedFlag(
                "--calculate-kv-scales",
                f"calculateScales applies to fp8 KV caches; the effective dtype is {engine_dtype}",
            )
        ]
    if not capability.has_flag("--calculate-kv-scales"):
        return [
            DroppedFlag(
                "--calculate-kv-scales",
                f"{capability.dropped_reason('--calculate-kv-scales')}: fp8 scales come from "
                "the checkpoint or default to 1.0",
            )
        ]
    args.append("--calculate-kv-scales")
    return []


def _checked_extra_args(extra: list[str], *, managed_load_format: bool) -> list[str]:
    # The CRD refuses MANAGED_FLAGS already; checked again for objects rendered offline.
    managed = set(MANAGED_FLAGS)
    if managed_load_format:
        managed.add("--load-format")
    clashes = sorted({a.split("=", 1)[0] for a in extra} & managed)
    if clashes:
        raise RenderError(
            f"engine.extraArgs sets {', '.join(clashes)}, which kvq renders from the spec: "
            "use the spec fields instead"
        )
    return list(extra)


def _number(value: float) -> str:
    """`4.0` -> "4", `0.9` -> "0.9": how a person would type it."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
