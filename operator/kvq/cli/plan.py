"""`kvq plan`: what one replica holds on a GPU, per KV-cache dtype."""

from __future__ import annotations

import json
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
    from kvq.planner.layout import Layout


def plan(
    model: Annotated[str, typer.Option(help="Catalog name, hf:// URI, or config.json path")],
    gpu: Annotated[str, typer.Option(help="GPU product, as a node label spells it")],
    gpus: Annotated[int, typer.Option(min=1, max=8, help="GPUs per replica (TP)")] = 1,
    gpu_memory_utilization: Annotated[float, typer.Option(min=0.01, max=1.0)] = 0.90,
    kv_cache_dtype: Annotated[str, typer.Option(help="A dtype, or all")] = "all",
    max_model_len: Annotated[int | None, typer.Option(min=16)] = None,
    block_size: Annotated[int, typer.Option(min=1)] = 16,
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
            "nodes; shows the layout (nodes, layers per stage, KV per GPU)"
        ),
    ] = None,
    gpus_per_node: Annotated[
        int, typer.Option(min=1, max=8, help="GPUs of one node (with --parallelism)")
    ] = 8,
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
) -> None:
    """What one replica holds on a GPU, per KV-cache dtype, before anything is scheduled."""
    from kvq.catalog.engines import (
        DEFAULT_IMAGE,
        EngineVersionError,
        load_engine_catalog,
        version_from_image,
    )
    from kvq.catalog.gpus import load_gpu_catalog
    from kvq.catalog.models import load_model_catalog
    from kvq.planner import plan_capacity
    from kvq.planner.architecture import UnknownModelError, architecture_for_cli
    from kvq.planner.host_tier import host_tier_figures

    if output not in ("table", "json"):
        fail(f"--output must be table or json, not {output!r}")
    dtypes = KV_CACHE_DTYPES if kv_cache_dtype == "all" else (kv_cache_dtype,)
    if any(d not in KV_CACHE_DTYPES for d in dtypes):
        fail(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)} or all")
    gpu_model = load_gpu_catalog().lookup(gpu) or fail(
        f"unknown GPU {gpu!r}: see the products in kvq/catalog/gpus.yaml"
    )
    try:
        model_name, arch = architecture_for_cli(model, load_model_catalog())
    except UnknownModelError as error:
        fail(str(error))
    except ValueError as error:  # a config.json kvq cannot size: say why, plan nothing
        fail(f"{model}: {error}")
    if parallelism is not None:
        gpus = _tensor_or_layout(model_name, arch, parallelism, gpus_per_node, dtypes, output)
    if offload_backend not in ("native", "lmcache"):
        fail(f"--offload-backend must be native or lmcache, not {offload_backend!r}")
    capability = None
    if engine_version is not None:
        try:
            capability = load_engine_catalog().capability(engine_version)
        except EngineVersionError as error:
            fail(str(error))
    # The CPU tier is a fact of the engine: kvq's default one unless --engine-version says.
    tier_engine = capability or load_engine_catalog().capability(
        version_from_image(DEFAULT_IMAGE) or ""
    )
    image = engine_image or f"vllm/vllm-openai:v{tier_engine.version}"
    rows: dict[str, dict[str, Any]] = {}
    for dtype in dtypes:
        result = plan_capacity(
            arch,
            gpu_model,
            dtype,
            tensor_parallel=gpus,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            hybrid_kv_cache_manager=not disable_hybrid_kv_cache_manager,
            kv_cache_dtype_skip_layers=_skip_layers(kv_cache_dtype_skip_layers),
            memory_profile=tier_engine.memory_profile,
        )
        row = _plan_row(result)
        if swap_space_gib is not None:
            tier = host_tier_figures(
                tier_engine,
                result,
                swap_space_gib,
                "lmcache" if offload_backend == "lmcache" else "native",
                image,
            )
            if tier is not None:
                row["cpuTier"] = {**tier, "engineVersion": tier_engine.version}
        if capability is not None:
            row["engine"] = _engine_verdict(capability, dtype, gpu_model)
        row |= _accuracy_risks(tier_engine, dtype, gpu_model, arch, (model, model_name), result)
        rows[dtype] = row
    if output == "json":
        document = {
            "model": model_name,
            "gpu": gpu_model.product,
            "computeCapability": gpu_model.compute_capability_str,
            "gpuMemoryMiB": gpu_model.memory_mib,
            "gpus": gpus,
            "gpuMemoryUtilization": gpu_memory_utilization,
            "engineVersion": engine_version,
            # The engine the accuracy facts were matched for (kvq's default when not given).
            "accuracyEngineVersion": tier_engine.version,
            "dtypes": rows,
        }
        print(json.dumps(document, indent=2))
        return
    _print_plan_table(model_name, gpu_model.product, gpus, rows, engine_version)
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
    from kvq.planner.layout import Layout

    tensor, sep, pipeline = value.lower().partition("x")
    if not (sep and tensor.isdigit() and pipeline.isdigit()):
        fail(f"--parallelism must be TPxPP (e.g. 8x2), not {value!r}")
    return Layout(tensor=int(tensor), pipeline=int(pipeline))


def _tensor_or_layout(
    model: str,
    arch: ModelArchitecture,
    parallelism: str,
    gpus_per_node: int,
    dtypes: tuple[str, ...],
    output: str,
) -> int:
    """A one-stage layout's TP (what --gpus says), refused as vLLM would refuse it; a
    multi-stage layout is printed and the command ends there."""
    from kvq.planner.layout import LayoutError, check_layout, nodes_per_replica

    layout = _layout_or_fail(parallelism)
    if layout.pipeline > 1:
        _print_layout(model, arch, layout, gpus_per_node, dtypes, output)
        raise typer.Exit
    try:
        check_layout(arch, layout)
        nodes_per_replica(layout, gpus_per_node)
    except LayoutError as error:
        fail(f"{model}: {error}")
    return layout.tensor


def _print_layout(
    model: str,
    arch: ModelArchitecture,
    layout: Layout,
    gpus_per_node: int,
    dtypes: tuple[str, ...],
    output: str,
) -> None:
    """A multi-node replica's layout: what vLLM would split, and the KV per GPU per dtype.
    Its capacity (weights and activations per stage) is not planned yet (issue 24)."""
    from kvq.planner.layout import LayoutError, plan_layout

    try:
        plans = {d: plan_layout(arch, layout, gpus_per_node, d) for d in dtypes}
    except LayoutError as error:
        fail(f"{model}: {error}")
    first = next(iter(plans.values()))
    document = {
        "model": model,
        "tensorParallel": layout.tensor,
        "pipelineParallel": layout.pipeline,
        "gpus": layout.gpus,
        "nodes": first.nodes,
        "gpusPerNode": gpus_per_node,
        "stageLayers": list(first.stage_layers),
        "stageAttentionLayers": list(first.stage_attention_layers),
        "kvHeadsPerGpu": first.kv_heads_per_gpu,
        "kvBytesPerTokenPerGpu": {d: p.kv_bytes_per_token_per_gpu for d, p in plans.items()},
        "capacity": "not planned for more than one pipeline stage yet",
    }
    if output == "json":
        print(json.dumps(document, indent=2))
        return
    print(
        f"{model}: TP {layout.tensor} x PP {layout.pipeline} = {layout.gpus} GPUs on"
        f" {first.nodes} node(s) of {gpus_per_node} GPUs"
    )
    stages = ", ".join(str(n) for n in first.stage_layers)
    heads = (
        "one latent per token (MLA), on every GPU"
        if arch.attention == "mla"
        else f"KV heads per GPU: {first.kv_heads_per_gpu}"
    )
    print(f"layers per stage: {stages}; {heads}")
    table = Table(title="KV bytes per token on one GPU of the largest stage")
    table.add_column("dtype")
    table.add_column("bytes/token/GPU", justify="right")
    for dtype, layout_plan in plans.items():
        table.add_row(dtype, f"{layout_plan.kv_bytes_per_token_per_gpu:,}")
    Console(width=120).print(table)
    print("capacity (tokens, sequences) is not planned for more than one pipeline stage yet")


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
    if result.warnings:
        row["warnings"] = list(result.warnings)
    if result.reason:
        row["reason"] = result.reason
    return row


def _print_plan_table(
    model: str, gpu: str, gpus: int, rows: dict[str, dict[str, Any]], engine: str | None
) -> None:
    any_row = next(iter(rows.values()))
    title = f"{model} on {gpus}x {gpu}, maxModelLen {any_row['maxModelLen']:,}"
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
