"""`kvq render`: the objects the operator applies for an InferenceService on a fleet."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from kvq.cli.console import dump_yaml, err, fail
from kvq.cli.fleet import (
    ClusterOptions,
    FleetOptions,
    GpusPerNode,
    NodeCount,
    Nodes,
    Pods,
    Pool,
    PoolLabel,
    PoolName,
    previews,
)
from kvq.decide.types import DEFAULT_OPERATOR_IMAGE


def render(
    file: Annotated[str, typer.Option("-f", "--filename", help="InferenceService YAML, or -")],
    pool: Pool = None,
    pool_name: PoolName = None,
    gpus_per_node: GpusPerNode = 8,
    node_count: NodeCount = 1,
    nodes: Nodes = None,
    pods: Pods = None,
    pool_label: PoolLabel = None,
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", "-n", help="Namespace of a service whose file names none"),
    ] = None,
    engine_version: Annotated[str | None, typer.Option(help="Override spec.engine.version")] = None,
    rung: Annotated[
        str | None,
        typer.Option(
            help="requested, auto or awq: what the operator applies once the engine has "
            "refused the other rungs (default: the rung it starts with)"
        ),
    ] = None,
    prometheus_url: Annotated[
        str | None,
        typer.Option(
            help="The Prometheus the operator is given (kvq run --autoscaling-prometheus-url "
            "or --prometheus-url): without one it applies no ScaledObject"
        ),
    ] = None,
    autoscaling_authentication: Annotated[
        str | None, typer.Option(help="As kvq run's --autoscaling-authentication")
    ] = None,
    operator_image: Annotated[
        str, typer.Option(help="As kvq run's --operator-image")
    ] = DEFAULT_OPERATOR_IMAGE,
    keda: Annotated[bool, typer.Option(help="The cluster serves KEDA's ScaledObject")] = True,
    gateway_api: Annotated[
        bool, typer.Option(help="The cluster serves the Gateway API's HTTPRoute")
    ] = True,
    inference_pool: Annotated[
        bool, typer.Option(help="The cluster serves the Inference Extension's InferencePool")
    ] = True,
    leader_worker_set: Annotated[
        bool,
        typer.Option(
            help="The cluster serves LeaderWorkerSet (leaderworkerset.x-k8s.io/v1), which a "
            "replica over several nodes runs as"
        ),
    ] = True,
) -> None:
    """Print the objects the operator applies for an InferenceService on a pool (for GitOps).

    The operator's own decision (placement, fallback ladder, tiers, routing, autoscaling,
    rollout), made on the fleet given; ownerReferences are left out. The decision and
    anything the spec asks for that is not applied go to stderr.
    """
    documents: list[dict[str, Any]] = []
    fleet = FleetOptions(
        pool, pool_name, gpus_per_node, node_count, nodes, pods, tuple(pool_label or ())
    )
    cluster = ClusterOptions(
        prometheus_url,
        autoscaling_authentication,
        operator_image,
        keda,
        gateway_api,
        inference_pool,
        rung,
        leader_worker_set,
    )
    for _, found, invalid in previews(
        file, fleet, cluster, namespace=namespace, engine_version=engine_version
    ):
        if found is None:
            fail(str(invalid))
        if found.refusal is not None:
            fail(f"{found.name}: {found.refusal}")
        err.print(f"{found.name}: {found.decision}", highlight=False, soft_wrap=True)
        for warning in ([found.stalled] if found.stalled else []) + list(found.warnings):
            err.print(
                f"[yellow]warning:[/] {found.name}: {warning}", highlight=False, soft_wrap=True
            )
        for need in found.requires:
            err.print(f"note: {found.name}: {need}", highlight=False, soft_wrap=True)
        documents += found.objects
    sys.stdout.write(dump_yaml(documents))
