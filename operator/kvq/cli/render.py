"""`kvq render`: the manifests kvq would apply for an InferenceService on a pool."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from kvq.cli.console import dump_yaml, fail, load_documents


def render(
    file: Annotated[str, typer.Option("-f", "--filename", help="InferenceService YAML, or -")],
    pool: Annotated[str, typer.Option(help="GPU product of the target pool, e.g. H100")],
    gpus_per_node: Annotated[int, typer.Option(min=1, max=16)] = 8,
    engine_version: Annotated[str | None, typer.Option(help="Override spec.engine.version")] = None,
    rung: Annotated[str, typer.Option(help="requested, auto or awq")] = "requested",
) -> None:
    """Print the manifests kvq would apply for an InferenceService on a pool (for GitOps)."""
    from kvq.api.validation import InvalidInferenceServiceError, parse_inference_service
    from kvq.catalog.engines import load_engine_catalog
    from kvq.catalog.gpus import load_gpu_catalog
    from kvq.catalog.models import load_model_catalog
    from kvq.placement.pool import pool_for_gpu
    from kvq.planner.architecture import UnknownModelError, resolve_architecture
    from kvq.render import RenderError, effective_settings, render_manifests

    gpu_model = load_gpu_catalog().lookup(pool)
    if gpu_model is None:
        fail(f"unknown GPU {pool!r}: see the products in kvq/catalog/gpus.yaml")
    if rung not in ("requested", "auto", "awq"):
        fail("--rung must be requested, auto or awq")
    documents = []
    for doc in load_documents(file):
        if doc.get("kind") != "InferenceService":
            continue
        if engine_version is not None:
            doc.setdefault("spec", {}).setdefault("engine", {})["version"] = engine_version
        try:
            isvc = parse_inference_service(doc)
            try:  # the model's size derives memory, the cache's size and the start-up budget
                arch = resolve_architecture(isvc.spec.model, load_model_catalog())
            except UnknownModelError:
                arch = None
            settings = effective_settings(
                isvc,
                gpu_model,
                rung,  # type: ignore[arg-type]
                engines=load_engine_catalog(),
                arch=arch,
            )
            documents += render_manifests(isvc, pool_for_gpu(gpu_model, gpus_per_node), settings)
        except InvalidInferenceServiceError as error:
            fail(str(error))
        except RenderError as error:
            # The engine refuses the KV dtype on this GPU: a fallback rung may render.
            hint = " (try --rung auto or --rung awq)" if "kvCache.dtype" in str(error) else ""
            fail(f"{isvc.metadata.name}: {error}{hint}")
    sys.stdout.write(dump_yaml(documents))
