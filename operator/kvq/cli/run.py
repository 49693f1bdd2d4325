"""`kvq run`: the operator."""

from __future__ import annotations

from typing import Annotated

import typer

from kvq.cli.console import fail
from kvq.decide.types import DEFAULT_OPERATOR_IMAGE


def run(
    namespace: Annotated[
        list[str] | None, typer.Option("--namespace", "-n", help="Watch this namespace (repeat)")
    ] = None,
    all_namespaces: Annotated[
        bool, typer.Option("--all-namespaces", "-A", help="Watch every namespace")
    ] = False,
    peering: Annotated[
        str | None, typer.Option(help="kopf peering object: replicas share it, one is active")
    ] = None,
    standalone: Annotated[bool, typer.Option(help="Run without peering")] = False,
    peering_lifetime: Annotated[
        int,
        typer.Option(
            min=10,
            max=3600,
            help="Seconds a peer's record lives without a heartbeat (how long a standby waits "
            "before taking over from a replica that died)",
        ),
    ] = 60,
    resync: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Seconds between safety-net reconciles of a service nothing changed about "
            "(changes are reconciled at once, from watch events)",
        ),
    ] = 600.0,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            max=4096,
            help="Reconciles that may run at the same time (a pass mostly waits for its writes)",
        ),
    ] = 1024,  # kvq.handlers.controller.DEFAULT_WORKERS (not imported: kopf loads slowly)
    qps: Annotated[
        float,
        typer.Option(
            min=1.0, help="Writes a second kvq sends to the API server at most, on average"
        ),
    ] = 1000.0,  # kvq.k8s.writers.DEFAULT_QPS
    burst: Annotated[
        int, typer.Option(min=1, help="Writes kvq may send at once above --qps")
    ] = 2000,  # kvq.k8s.writers.DEFAULT_BURST
    grace: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Seconds a service waits for a pool that cannot run it now (NotReady, full, "
            "scaled to zero, replicas unschedulable) before it moves or falls back",
        ),
    ] = 300.0,
    suspect_restarts: Annotated[
        int,
        typer.Option(
            min=1,
            max=20,
            help="Unknown start-up crashes with the same error before a quantized dtype is "
            "left (errors that name the dtype fall back at once)",
        ),
    ] = 3,
    retry_after: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Seconds before a dtype left after unknown crashes is tried again (doubles "
            "each time, up to --retry-after-max)",
        ),
    ] = 3600.0,
    retry_after_max: Annotated[float, typer.Option(min=1.0)] = 86400.0,
    max_retries: Annotated[
        int, typer.Option(min=0, max=20, help="Retries of such a dtype before it is given up")
    ] = 3,
    metrics_port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port of /metrics (0: off)")
    ] = 8080,
    liveness: Annotated[
        str | None, typer.Option(help="Liveness endpoint, e.g. http://0.0.0.0:8081/healthz")
    ] = None,
    verbose: Annotated[bool, typer.Option(help="Also log every kopf handler pass")] = False,
    prometheus_url: Annotated[
        str | None,
        typer.Option(
            envvar="KVQ_PROMETHEUS_URL",  # a URL with credentials can come from a Secret
            help="Prometheus that scrapes the engines (series labelled namespace and service); "
            "its KV cache usage, requests and KV capacity go into status.metrics",
        ),
    ] = None,
    metrics_interval: Annotated[
        float, typer.Option(min=1.0, help="Least seconds between status.metrics writes")
    ] = 60.0,
    autoscaling_prometheus_url: Annotated[
        str | None,
        typer.Option(
            help="Prometheus URL that KEDA uses for autoscaled services (default: "
            "--prometheus-url without its credentials)"
        ),
    ] = None,
    operator_image: Annotated[
        str,
        typer.Option(
            help="kvq's own image: the model download (kvq fetch) and quality probes "
            "(kvq probe) run it"
        ),
    ] = DEFAULT_OPERATOR_IMAGE,
    autoscaling_authentication: Annotated[
        str | None,
        typer.Option(
            help="KEDA ClusterTriggerAuthentication with Prometheus' credentials, by name"
        ),
    ] = None,
    pool_label: Annotated[
        list[str] | None,
        typer.Option(
            "--pool-label",
            help="Node label that names a GPU pool, tried in order (repeat); default: "
            "kvq.dev/pool, karpenter.sh/nodepool, cloud.google.com/gke-nodepool, "
            "eks.amazonaws.com/nodegroup, kubernetes.azure.com/agentpool",
        ),
    ] = None,
) -> None:
    """Run the operator: reconcile InferenceServices until stopped."""
    from datetime import timedelta

    from kvq.fallback.ladder import LadderPolicy
    from kvq.handlers.operator import RunOptions
    from kvq.handlers.operator import run as run_operator

    if bool(namespace) == all_namespaces:
        fail("give --namespace (one or more) or --all-namespaces")
    if peering and standalone:
        fail("--peering and --standalone exclude each other")
    run_operator(
        RunOptions(
            namespaces=tuple(namespace or ()),
            all_namespaces=all_namespaces,
            peering=peering,
            standalone=standalone,
            resync=resync,
            workers=workers,
            qps=qps,
            burst=burst,
            peering_lifetime=peering_lifetime,
            metrics_port=metrics_port,
            liveness=liveness,
            verbose=verbose,
            prometheus_url=prometheus_url,
            metrics_interval=metrics_interval,
            pool_labels=tuple(pool_label or ()),
            autoscaling_prometheus_url=autoscaling_prometheus_url,
            autoscaling_authentication=autoscaling_authentication,
            operator_image=operator_image,
            ladder=LadderPolicy(
                suspect_repeats=suspect_restarts,
                retry_after=timedelta(seconds=retry_after),
                retry_after_max=timedelta(seconds=max(retry_after_max, retry_after)),
                max_retries=max_retries,
                grace=timedelta(seconds=grace),
            ),
        )
    )
