"""`kvq plan`: what one replica holds on a GPU, per KV-cache dtype."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from kvq.api.kv_cache import KV_CACHE_DTYPES
from kvq.cli.console import fail

if TYPE_CHECKING:
    from kvq.catalog.engines import EngineCapability
    from kvq.catalog.gpus import GpuModel
    from kvq.catalog.models import ModelArchitecture
    from kvq.planner import CapacityPlan
    from kvq.planner.derived_layout import DerivedLayout
    from kvq.planner.layout import Layout


@dataclass(frozen=True)
class _Asked:
    """What the plan is for: the options, or an InferenceService file with options on top."""

    model: str
    arch: ModelArchitecture
    layout: Layout
    declared: bool  # a layout given (--parallelism or placement.parallelism): show it
    derive: bool  # placement.parallelism without pipeline: kvq picks the stages
    min_concurrency: int | None  # spec.capacity.minConcurrentSequences
    file_dtype: str  # spec.kvCache.dtype: the rung the operator starts with ("" without a file)
    dtypes: tuple[str, ...]
    gpu_memory_utilization: float
    max_model_len: int | None
    max_num_seqs: int | None
    block_size: int
    swap_space_gib: float | None
    hybrid_kv_cache_manager: bool
    kv_cache_dtype_skip_layers: tuple[str, ...]
    engine_version: str | None  # the file's engine (its memory profile and CPU tier)


def plan(
    gpu: Annotated[str, typer.Option(help="GPU product, as a node label spells it")],
    model: Annotated[
        str | None, typer.Option(help="Catalog name, hf:// URI, or config.json path")
    ] = None,
    filename: Annotated[
        str | None,
        typer.Option(
            "-f",
            "--filename",
            help="An InferenceService file: its model, layout (placement), dtype and memory "
            "settings; options given beside it win",
        ),
    ] = None,
    gpus: Annotated[int | None, typer.Option(min=1, max=8, help="GPUs per replica (TP)")] = None,
    gpu_memory_utilization: Annotated[
        float | None, typer.Option(min=0.01, max=1.0, help="default 0.90")
    ] = None,
    kv_cache_dtype: Annotated[
        str | None, typer.Option(help="A dtype, or all (default: all, or the file's)")
    ] = None,
    max_model_len: Annotated[int | None, typer.Option(min=16)] = None,
    block_size: Annotated[int | None, typer.Option(min=1, help="default 16")] = None,
    max_num_seqs: Annotated[
        int | None, typer.Option(min=1, help="vLLM --max-num-seqs (default: what serve picks)")
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None,
        typer.Option(min=1, help="vLLM --max-num-batched-tokens (default: what serve picks)"),
    ] = None,
    engine_version: Annotated[
        str | None, typer.Option(help="Also check each dtype against this vLLM version")
    ] = None,
    swap_space_gib: Annotated[
        float | None,
        typer.Option(
            "--swap-space-gib",
            min=0.0,
            max=1024.0,
            help="spec.memory.swapSpaceGiB: the KV cache's CPU tier, GiB per GPU (V0 swap or "
            "V1 offloading, by --engine-version; kvq's default engine when not given)",
        ),
    ] = None,
    offload_backend: Annotated[
        str, typer.Option(help="spec.memory.offloadBackend: native or lmcache")
    ] = "native",
    engine_image: Annotated[
        str | None,
        typer.Option(
            help="The engine image (whether it ships LMCache); the stock one if not given"
        ),
    ] = None,
    disable_hybrid_kv_cache_manager: Annotated[
        bool,
        typer.Option(
            "--disable-hybrid-kv-cache-manager",
            help="vLLM's flag: sliding and chunked layers keep every token (as full attention)",
        ),
    ] = False,
    kv_cache_dtype_skip_layers: Annotated[
        str,
        typer.Option(
            help="vLLM's --kv-cache-dtype-skip-layers, comma-separated: layer indices or "
            "sliding_window (those layers keep the model dtype)"
        ),
    ] = "",
    parallelism: Annotated[
        str | None,
        typer.Option(
            help="TPxPP, e.g. 8x2: tensor parallel within a node, pipeline stages across "
            "nodes; shows the layout (nodes, layers per stage, each stage's GPUs)"
        ),
    ] = None,
    gpus_per_node: Annotated[
        int,
        typer.Option(
            min=1,
            max=8,
            help="GPUs of one node (with --parallelism, or a file that leaves the pipeline to kvq)",
        ),
    ] = 8,
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
) -> None:
    """What one replica holds on a GPU, per KV-cache dtype, before anything is scheduled."""
    from kvq.catalog.gpus import load_gpu_catalog
    from kvq.planner import plan_capacity
    from kvq.planner.host_tier import host_tier_figures

    if output not in ("table", "json"):
        fail(f"--output must be table or json, not {output!r}")
    if (model is None) == (filename is None):
        fail("give --model or -f FILE (an InferenceService), one of them")
    gpu_model = load_gpu_catalog().lookup(gpu) or fail(
        f"unknown GPU {gpu!r}: see the products in kvq/catalog/gpus.yaml"
    )
    asked = _asked_from_file(filename) if filename is not None else _asked_from_model(model or "")
    asked = _overridden(
        asked,
        parallelism=parallelism,
        gpus=gpus,
        kv_cache_dtype=kv_cache_dtype,
        hybrid_off=disable_hybrid_kv_cache_manager,
        skip_layers=kv_cache_dtype_skip_layers,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
        swap_space_gib=swap_space_gib,
    )
    if offload_backend not in ("native", "lmcache"):
        fail(f"--offload-backend must be native or lmcache, not {offload_backend!r}")
    capability, tier_engine = _engines(engine_version, asked.engine_version)

    def plan_on(dtype: str, layout: Layout) -> CapacityPlan:
        return plan_capacity(
            asked.arch,
            gpu_model,
            dtype,
            tensor_parallel=layout.tensor,
            pipeline_parallel=layout.pipeline,
            gpu_memory_utilization=asked.gpu_memory_utilization,
            max_model_len=asked.max_model_len,
            block_size=asked.block_size,
            max_num_seqs=asked.max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            hybrid_kv_cache_manager=asked.hybrid_kv_cache_manager,
            kv_cache_dtype_skip_layers=asked.kv_cache_dtype_skip_layers,
            memory_profile=tier_engine.memory_profile,
        )

    asked, derived = _derived_layouts(asked, gpus_per_node, plan_on)
    layout, arch = asked.layout, asked.arch
    nodes = _nodes_or_fail(asked, gpus_per_node)
    image = engine_image or f"vllm/vllm-openai:v{tier_engine.version}"
    model_name = asked.model
    rows: dict[str, dict[str, Any]] = {}
    plans: list[CapacityPlan] = []
    for dtype in asked.dtypes:
        result = plan_on(dtype, layout)
        plans.append(result)
        row = _plan_row(result)
        if asked.swap_space_gib is not None:
            tier = host_tier_figures(
                tier_engine,
                result,
                asked.swap_space_gib,
                "lmcache" if offload_backend == "lmcache" else "native",
                image,
            )
            if tier is not None:
                row["cpuTier"] = {**tier, "engineVersion": tier_engine.version}
        if capability is not None:
            row["engine"] = _engine_verdict(capability, dtype, gpu_model)
        names = (filename or "", model_name) if model is None else (model, model_name)
        row |= _accuracy_risks(tier_engine, dtype, gpu_model, arch, names, result)
        rows[dtype] = row
    shape = _layout_document(arch, layout, nodes, gpus_per_node, plans[0])
    if derived:
        shape["derived"] = {
            d: _derived_document(found, gpus_per_node) for d, found in derived.items()
        }
    if output == "json":
        document = {
            "model": model_name,
            "gpu": gpu_model.product,
            "computeCapability": gpu_model.compute_capability_str,
            "gpuMemoryMiB": gpu_model.memory_mib,
            "gpus": layout.gpus,
            "layout": shape,
            "gpuMemoryUtilization": asked.gpu_memory_utilization,
            "engineVersion": engine_version,
            # The engine the accuracy facts were matched for (kvq's default when not given).
            "accuracyEngineVersion": tier_engine.version,
            "dtypes": rows,
        }
        print(json.dumps(document, indent=2))
        return
    if asked.declared or layout.pipeline > 1:
        _print_layout(model_name, arch, shape)
    if derived:
        _print_derived(asked, derived, gpus_per_node)
    _print_plan_table(model_name, gpu_model.product, layout, rows, engine_version)
    if layout.pipeline > 1:
        _print_stages(rows)
    _print_accuracy_risks(rows, tier_engine.version)


def _engine_verdict(capability: EngineCapability, dtype: str, gpu: GpuModel) -> dict[str, Any]:
    """Whether the engine version runs this dtype on this GPU, and a measured slowdown."""
    verdict = capability.kv_dtype_verdict(dtype, gpu.compute_capability)
    found: dict[str, Any] = {
        "ok": verdict.ok,
        "value": verdict.engine_value,
        "reason": verdict.reason,
    }
    slow = capability.slow_warning(dtype, gpu.compute_capability)
    if slow is not None and verdict.ok:
        found["warning"] = slow
    return found


def _accuracy_risks(
    engine: EngineCapability,
    dtype: str,
    gpu: GpuModel,
    arch: ModelArchitecture,
    names: tuple[str, ...],
    result: CapacityPlan,
) -> dict[str, Any]:
    """{"accuracyRisks": [...]}: the catalog's known FP8 accuracy problems that match this
    row (a warning only); {} when none does."""
    from kvq.catalog.fp8_accuracy import AccuracyQuery, load_accuracy_facts, match_accuracy_facts

    query = AccuracyQuery(
        engine_version=engine.version,
        dtype=engine.engine_value(dtype) or dtype,
        compute_capability=gpu.compute_capability,
        architecture=arch.hf_architecture,
        attention=arch.attention,
        model_names=names,
        max_model_len=result.max_model_len,
    )
    risks = [
        {
            "id": fact.id,
            "title": fact.title,
            "severity": fact.severity,
            "symptom": fact.symptom,
            "workaround": fact.workaround,
            "fixedIn": fact.fixed_in or None,
            "reported": fact.reported,
            "sources": list(fact.sources),
        }
        for fact in match_accuracy_facts(load_accuracy_facts(), query)
    ]
    return {"accuracyRisks": risks} if risks else {}


def _print_accuracy_risks(rows: dict[str, dict[str, Any]], engine: str) -> None:
    """Known FP8 accuracy problems for the planned rows: warnings, never a refusal."""
    found = False
    for dtype, row in rows.items():
        for risk in row.get("accuracyRisks", []):
            found = True
            print(
                f"{dtype} accuracy warning on vLLM {engine} ({risk['severity']}): "
                f"{risk['title']} [{risk['id']}]. {risk['symptom']} "
                f"Workaround: {risk['workaround']} Source: {' '.join(risk['sources'])}"
            )
    if found:
        print(
            "These are reported problems, not a verdict on your model: check it with "
            "kvq probe (spec.quality on the operator)."
        )


def _layout_or_fail(value: str) -> Layout:
    tensor, sep, pipeline = value.lower().partition("x")
    if not (sep and tensor.isdigit() and pipeline.isdigit()):
        fail(f"--parallelism must be TPxPP (e.g. 8x2), not {value!r}")
    return _layout_of(int(tensor), int(pipeline))


def _layout_of(tensor: int, pipeline: int) -> Layout:
    from kvq.planner.layout import Layout

    return Layout(tensor=tensor, pipeline=pipeline)


def _dtypes_or_fail(value: str) -> tuple[str, ...]:
    dtypes = KV_CACHE_DTYPES if value == "all" else (value,)
    if any(d not in KV_CACHE_DTYPES for d in dtypes):
        fail(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)} or all")
    return tuple(dtypes)


def _overridden(
    asked: _Asked,
    *,
    parallelism: str | None,
    gpus: int | None,
    kv_cache_dtype: str | None,
    hybrid_off: bool,
    skip_layers: str,
    **given: Any,
) -> _Asked:
    """The options given on the command line win over the file's (and the defaults)."""
    from dataclasses import replace

    changes = {name: value for name, value in given.items() if value is not None}
    if parallelism is not None:
        changes |= {"layout": _layout_or_fail(parallelism), "declared": True, "derive": False}
    elif gpus is not None:
        changes |= {"layout": _layout_of(gpus, 1), "declared": False, "derive": False}
    if kv_cache_dtype is not None:
        changes["dtypes"] = _dtypes_or_fail(kv_cache_dtype)
    if hybrid_off:
        changes["hybrid_kv_cache_manager"] = False
    if skip_layers:
        changes["kv_cache_dtype_skip_layers"] = _skip_layers(skip_layers)
    return replace(asked, **changes)


def _asked_from_model(model: str) -> _Asked:
    from kvq.catalog.models import load_model_catalog
    from kvq.planner.architecture import UnknownModelError, architecture_for_cli

    try:
        name, arch = architecture_for_cli(model, load_model_catalog())
    except UnknownModelError as error:
        fail(str(error))
    except ValueError as error:  # a config.json kvq cannot size: say why, plan nothing
        fail(f"{model}: {error}")
    return _Asked(
        model=name,
        arch=arch,
        layout=_layout_of(1, 1),
        declared=False,
        derive=False,
        min_concurrency=None,
        file_dtype="",
        dtypes=tuple(KV_CACHE_DTYPES),
        gpu_memory_utilization=0.90,
        max_model_len=None,
        max_num_seqs=None,
        block_size=16,
        swap_space_gib=None,
        hybrid_kv_cache_manager=True,
        kv_cache_dtype_skip_layers=(),
        engine_version=None,
    )


def _asked_from_file(path: str) -> _Asked:
    """The first InferenceService of the file, read as the API server and kvq validate do."""
    from kvq.api.keys import KIND
    from kvq.api.validation import InvalidInferenceServiceError, parse_inference_service
    from kvq.catalog.models import load_model_catalog
    from kvq.cli.console import load_documents
    from kvq.planner.architecture import UnknownModelError, resolve_architecture
    from kvq.planner.kv_layout import kv_manager_flags
    from kvq.render.settings import RenderError, engine_image_and_version

    doc = next((d for d in load_documents(path) if d.get("kind") == KIND), None)
    if doc is None:
        fail(f"{path} holds no {KIND}")
    try:
        isvc = parse_inference_service(doc)
    except InvalidInferenceServiceError as error:
        fail(str(error))
    spec = isvc.spec
    try:
        arch = resolve_architecture(spec.model, load_model_catalog())
        _, version = engine_image_and_version(isvc)
    except (UnknownModelError, RenderError) as error:
        fail(f"{path}: {error}")
    flags = kv_manager_flags(spec.engine.extra_args)
    return _Asked(
        model=spec.model.uri,
        arch=arch,
        layout=_layout_of(spec.placement.tensor_parallel, spec.placement.pipeline_parallel),
        declared=spec.placement.parallelism is not None,
        derive=spec.placement.pipeline_derived,
        min_concurrency=spec.capacity.min_concurrent_sequences,
        file_dtype=spec.kv_cache.dtype,
        dtypes=(spec.kv_cache.dtype,),
        gpu_memory_utilization=spec.memory.gpu_memory_utilization,
        max_model_len=spec.memory.max_model_len,
        max_num_seqs=spec.memory.max_num_seqs,
        block_size=spec.kv_cache.block_size or 16,
        swap_space_gib=spec.memory.swap_space_gib,
        hybrid_kv_cache_manager=flags.hybrid_manager,
        kv_cache_dtype_skip_layers=flags.skip_layers,
        engine_version=version,
    )


def _nodes_or_fail(asked: _Asked, gpus_per_node: int) -> int:
    """The nodes one replica spans, refused as vLLM would refuse the layout."""
    from kvq.planner.layout import LayoutError, check_layout, nodes_per_replica

    try:
        check_layout(asked.arch, asked.layout)
        return nodes_per_replica(asked.layout, gpus_per_node)
    except LayoutError as error:
        fail(f"{asked.model}: {error}")


def _derived_layouts(
    asked: _Asked, gpus_per_node: int, plan_on: Callable[[str, Layout], CapacityPlan]
) -> tuple[_Asked, dict[str, DerivedLayout]]:
    """The layout the operator derives for each dtype shown and for auto (the rung a
    fallback runs): planner.derived_layout, the function placement calls on each pool. The
    table is on the layout of the dtype the operator starts with (the file's). Nothing to
    derive when the file declares its layout or an option gives one."""
    from dataclasses import replace
    from functools import partial

    from kvq.planner.derived_layout import derive_layout

    if not asked.derive:
        return asked, {}

    first = asked.file_dtype if asked.file_dtype in asked.dtypes else asked.dtypes[0]
    found = {}
    for dtype in dict.fromkeys((first, *asked.dtypes, "auto")):
        derived = derive_layout(
            asked.arch,
            asked.layout.tensor,
            gpus_per_node,
            partial(plan_on, dtype),
            asked.min_concurrency,
        )
        if derived is None:
            # Not one layout of this tensor size places on such nodes: refused as vLLM would.
            _nodes_or_fail(asked, gpus_per_node)
            fail(
                f"{asked.model}: no pipeline depth places TP {asked.layout.tensor} on "
                f"nodes of {gpus_per_node} GPUs"
            )
        found[dtype] = derived
    return replace(asked, layout=found[first].layout), found


def _derived_document(found: DerivedLayout, gpus_per_node: int) -> dict[str, Any]:
    from kvq.planner.layout import nodes_per_replica

    return {
        "tensorParallel": found.layout.tensor,
        "pipelineParallel": found.layout.pipeline,
        "nodes": nodes_per_replica(found.layout, gpus_per_node),
        "holds": found.holds,
        "maxConcurrency": round(found.plan.max_concurrency, 2) if found.plan.fits else None,
    }


def _print_derived(asked: _Asked, derived: dict[str, DerivedLayout], gpus_per_node: int) -> None:
    """The stages kvq picks per dtype, as the operator's placement picks them."""
    from kvq.planner.layout import describe, nodes_per_replica

    what = "the weights" + (
        f" and {asked.min_concurrency} sequences of {derived['auto'].plan.max_model_len:,} tokens"
        if asked.min_concurrency is not None
        else ""
    )
    parts = []
    for dtype, found in derived.items():
        shape = describe(found.layout, nodes_per_replica(found.layout, gpus_per_node))
        if not found.holds:
            parts.append(f"{dtype}: none holds them, even {shape} (the most stages kvq tries)")
            continue
        seqs = f"{found.plan.max_concurrency:.2f} sequences"
        fallback = ", what a fallback to auto runs" if dtype == "auto" != asked.file_dtype else ""
        parts.append(f"{dtype}: {shape}, {seqs}{fallback}")
    print(
        f"parallelism.pipeline left to kvq: per dtype, the fewest stages on nodes of "
        f"{gpus_per_node} GPUs (--gpus-per-node) that hold {what}, as the operator picks them "
        "(it also needs a pod's host memory on one node); the table is on "
        f"{next(iter(derived))}'s layout:"
    )
    for part in parts:
        print(f"  {part}")


def _engines(
    engine_version: str | None, file_version: str | None
) -> tuple[EngineCapability | None, EngineCapability]:
    """The engine --engine-version checks against (None: not asked), and the one whose
    CPU tier and memory profile the plan uses: that one, the file's, or kvq's default."""
    from kvq.catalog.engines import (
        DEFAULT_IMAGE,
        EngineVersionError,
        load_engine_catalog,
        version_from_image,
    )

    catalog = load_engine_catalog()
    try:
        capability = None if engine_version is None else catalog.capability(engine_version)
        default = file_version or version_from_image(DEFAULT_IMAGE) or ""
        return capability, capability or catalog.capability(default)
    except EngineVersionError as error:
        fail(str(error))


def _layout_document(
    arch: ModelArchitecture, layout: Layout, nodes: int, gpus_per_node: int, plan: CapacityPlan
) -> dict[str, Any]:
    from kvq.planner.kv import kv_heads_per_gpu

    stages = [s.layers for s in plan.stages] or [arch.num_layers]
    return {
        "tensorParallel": layout.tensor,
        "pipelineParallel": layout.pipeline,
        "gpus": layout.gpus,
        "nodes": nodes,
        "gpusPerNode": min(gpus_per_node, layout.gpus),
        "stageLayers": stages,
        # MLA's one latent per token is on every GPU.
        "kvHeadsPerGpu": 1 if arch.attention == "mla" else kv_heads_per_gpu(arch, layout.tensor),
    }


def _print_layout(model: str, arch: ModelArchitecture, shape: dict[str, Any]) -> None:
    """The replica's layout: what vLLM splits, over how many nodes."""
    print(
        f"{model}: TP {shape['tensorParallel']} x PP {shape['pipelineParallel']} = "
        f"{shape['gpus']} GPUs on {shape['nodes']} node(s) of {shape['gpusPerNode']} GPUs"
    )
    layers = ", ".join(str(n) for n in shape["stageLayers"])
    heads = (
        "one latent per token (MLA), on every GPU"
        if arch.attention == "mla"
        else f"KV heads per GPU: {shape['kvHeadsPerGpu']}"
    )
    print(f"layers per stage: {layers}; {heads}")


def _print_stages(rows: dict[str, dict[str, Any]]) -> None:
    """Each stage's GPUs for the first dtype (weights are the same for all; the KV memory
    may differ with the attention backend a dtype gets), and which stage bounds the cache."""
    dtype, first = next(iter(rows.items()))
    for number, stage in enumerate(first["stages"], start=1):
        end = stage["firstLayer"] + stage["layers"] - 1
        print(
            f"stage {number} (layers {stage['firstLayer']}-{end}): weights "
            f"{stage['weightBytesPerGpu'] / 2**30:.2f} GiB, KV memory "
            f"{stage['availableKvBytes'] / 2**30:.2f} GiB per GPU ({dtype})"
            + (f"; does not fit: {stage['reason']}" if stage["reason"] else "")
        )
    fitting = [row for row in rows.values() if row["fits"]]
    if not fitting:
        return
    if all(len({stage["numBlocks"] for stage in row["stages"]}) == 1 for row in fitting):
        print("every stage has room for the same number of KV blocks")
        return
    bounds = {row["boundingStage"] for row in fitting}
    which = f"stage {bounds.pop()}" if len(bounds) == 1 else "the stage named per dtype (-o json)"
    print(
        f"{which} has room for the fewest KV blocks: vLLM gives every stage that many, so it "
        "bounds the replica's tokens"
    )


def _skip_layers(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _plan_row(result: CapacityPlan) -> dict[str, Any]:
    row: dict[str, Any] = {
        "kvBytesPerToken": result.kv_bytes_per_token,
        "availableKvBytes": result.available_kv_bytes,
        "kvTokens": result.kv_tokens,
        "maxConcurrency": round(result.max_concurrency, 2),
        "maxModelLen": result.max_model_len,
        "maxNumSeqs": result.max_num_seqs,
        "maxNumBatchedTokens": result.max_num_batched_tokens,
        "ratioVsAuto": round(result.ratio_vs_auto, 3),
        "fits": result.fits,
        "kvLayout": result.kv_layout,
        "kvCacheGroups": result.kv_cache_groups,
        "paddingLayers": result.padding_layers,
        "modelRunner": result.model_runner,
        "activationBytes": result.activation_bytes,
    }
    if result.stages:
        row["boundingStage"] = result.bounding_stage + 1
        row["stages"] = [
            {
                "firstLayer": stage.first_layer,
                "layers": stage.layers,
                "weightBytesPerGpu": stage.weight_bytes_per_gpu,
                "availableKvBytes": stage.available_kv_bytes,
                "numBlocks": stage.num_blocks,
                "reason": stage.reason,
            }
            for stage in result.stages
        ]
    if result.warnings:
        row["warnings"] = list(result.warnings)
    if result.reason:
        row["reason"] = result.reason
    return row


def _print_plan_table(
    model: str, gpu: str, layout: Layout, rows: dict[str, dict[str, Any]], engine: str | None
) -> None:
    any_row = next(iter(rows.values()))
    split = f" (TP {layout.tensor} x PP {layout.pipeline})" if layout.pipeline > 1 else ""
    title = f"{model} on {layout.gpus}x {gpu}{split}, maxModelLen {any_row['maxModelLen']:,}"
    table = Table(title=title)
    for column in ("dtype", "bytes/token", "KV memory", "KV tokens", "max seqs", "vs auto"):
        table.add_column(column, justify="left" if column == "dtype" else "right")
    tiered = any("cpuTier" in row for row in rows.values())
    if tiered:
        table.add_column("CPU tier", justify="right")
        table.add_column("CPU tier tokens", justify="right")
    if engine:
        table.add_column(f"vLLM {engine}")
    notes: list[str] = []
    for dtype, row in rows.items():
        fits = row["fits"]
        cells = [
            dtype,
            f"{row['kvBytesPerToken']:,}",
            f"{row['availableKvBytes'] / 2**30:.2f} GiB" if fits else "-",
            f"{row['kvTokens']:,}" if fits else "-",
            f"{row['maxConcurrency']:.2f}" if fits else "does not fit",
            f"{row['ratioVsAuto']:.2f}x",
        ]
        if row.get("reason"):
            notes.append(f"{dtype}: {row['reason']}")
        if row["kvCacheGroups"] > 1 or row.get("warnings"):
            notes.append(f"{dtype}: KV-cache groups {row['kvLayout']}")
            notes += [f"{dtype}: {w}" for w in row.get("warnings", [])]
        if tiered:
            cells += _tier_cells(dtype, row.get("cpuTier"), notes)
        if engine:
            verdict = row["engine"]
            cells.append("ok" if verdict["ok"] else "refused")
            if not verdict["ok"]:
                notes.append(f"{dtype} refused: {verdict['reason']}")
            if verdict.get("warning"):
                notes.append(f"{dtype} warning: {verdict['warning']}")
        table.add_row(*cells)
    Console(width=120).print(table)
    for note in dict.fromkeys(notes):
        print(note)


def _tier_cells(dtype: str, tier: dict[str, Any] | None, notes: list[str]) -> list[str]:
    """The CPU tier's columns (size, tokens) and what the notes say about it."""
    if tier is None:
        return ["-", "-"]
    if not tier["ok"]:
        notes.append(f"CPU tier refused: {tier['reason']}")
        return ["refused", "-"]
    how = f"{tier['mode']} {tier['backend']}" if tier.get("backend") else tier["mode"]
    connector = f", {tier['connector']}" if tier.get("connector") else ""
    notes.append(
        f"CPU tier on vLLM {tier['engineVersion']}: {how}{connector}, "
        f"{tier['gibPerGpu']:g} GiB per GPU of pinned host memory in the pod's request, "
        "the GPU cache's blocks as they are" + (f"; {tier['note']}" if tier.get("note") else "")
    )
    return [f"{tier['bytes'] / 2**30:.2f} GiB", f"{tier['tokens']:,}"]
