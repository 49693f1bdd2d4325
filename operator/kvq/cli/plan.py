"""`kvq plan`: what one replica holds on a GPU, per KV-cache dtype."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from kvq.api.kv_cache import KV_CACHE_DTYPES
from kvq.cli.console import fail


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
    gpu_model = load_gpu_catalog().lookup(gpu)
    if gpu_model is None:
        fail(f"unknown GPU {gpu!r}: see the products in kvq/catalog/gpus.yaml")
    try:
        model_name, arch = architecture_for_cli(model, load_model_catalog())
    except UnknownModelError as error:
        fail(str(error))
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
        )
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
        }
        if result.reason:
            row["reason"] = result.reason
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
            verdict = capability.kv_dtype_verdict(dtype, gpu_model.compute_capability)
            row["engine"] = {
                "ok": verdict.ok,
                "value": verdict.engine_value,
                "reason": verdict.reason,
            }
            slow = capability.slow_warning(dtype, gpu_model.compute_capability)
            if slow is not None and verdict.ok:
                row["engine"]["warning"] = slow
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
            "dtypes": rows,
        }
        print(json.dumps(document, indent=2))
        return
    _print_plan_table(model_name, gpu_model.product, gpus, rows, engine_version)


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
