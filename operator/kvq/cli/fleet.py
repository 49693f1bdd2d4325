"""What `kvq render` and `kvq validate` share: the fleet and cluster they preview on, given
as options, and the operator's decision for each InferenceService of a file."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kvq.cli.console import fail, load_documents
from kvq.decide.types import DEFAULT_OPERATOR_IMAGE

if TYPE_CHECKING:
    from kvq.decide.preview import Fleet, Preview
    from kvq.decide.types import Catalogs, OperatorConfig

Pool = Annotated[
    str | None,
    typer.Option(
        help="GPU product of a pool of free nodes to place on, e.g. H100 (or give --nodes)"
    ),
]
PoolName = Annotated[
    str | None,
    typer.Option(
        help="Name of that pool: its nodes carry kvq.dev/pool=NAME and are selected by it "
        "(default: the GPU product label selects them)"
    ),
]
GpusPerNode = Annotated[int, typer.Option(min=1, max=16, help="GPUs of each node of --pool")]
NodeCount = Annotated[int, typer.Option(min=1, max=1000, help="Nodes in --pool")]
Nodes = Annotated[
    str | None,
    typer.Option(
        help="Node objects to place on instead of --pool (kubectl get nodes -o yaml): the "
        "operator chooses among their pools"
    ),
]
Pods = Annotated[
    str | None,
    typer.Option(
        help="Pods bound to those nodes (kubectl get pods -A -o yaml): the GPUs they hold "
        "are not free"
    ),
]
PoolLabel = Annotated[
    list[str] | None,
    typer.Option("--pool-label", help="As kvq run's --pool-label (repeat)"),
]


@dataclass(frozen=True)
class FleetOptions:
    pool: str | None = None
    pool_name: str | None = None
    gpus_per_node: int = 8
    node_count: int = 1
    nodes: str | None = None
    pods: str | None = None
    pool_labels: tuple[str, ...] = ()

    @property
    def given(self) -> bool:
        return self.pool is not None or self.nodes is not None


@dataclass(frozen=True)
class ClusterOptions:
    """What the operator is run with and what the cluster serves (render's options)."""

    prometheus_url: str | None = None
    autoscaling_authentication: str | None = None
    operator_image: str = DEFAULT_OPERATOR_IMAGE
    keda: bool = True
    gateway_api: bool = True
    inference_pool: bool = True
    rung: str | None = None
    leader_worker_set: bool = True


def previews(
    file: str,
    fleet_options: FleetOptions,
    cluster: ClusterOptions | None = None,
    *,
    namespace: str | None = None,
    engine_version: str | None = None,
) -> Iterator[tuple[dict[str, Any], Preview | None, str | None]]:
    """Each InferenceService document of `file`, its preview (None when the document is
    invalid), and the validation error when it is."""
    from kvq.api.keys import KIND
    from kvq.api.validation import InvalidInferenceServiceError, parse_inference_service
    from kvq.decide.preview import ServedApis, preview
    from kvq.fallback.ladder import Rung

    cluster = cluster or ClusterOptions()
    if cluster.rung not in (None, "requested", "auto", "awq"):
        fail("--rung must be requested, auto or awq")
    catalogs, config, fleet = _setting(fleet_options, cluster)
    apis = ServedApis(
        cluster.keda, cluster.gateway_api, cluster.inference_pool, cluster.leader_worker_set
    )
    now = datetime.now(UTC)
    for doc in load_documents(file):
        if doc.get("kind") != KIND:
            continue
        if engine_version is not None:
            doc.setdefault("spec", {}).setdefault("engine", {})["version"] = engine_version
        if namespace and not (doc.get("metadata") or {}).get("namespace"):
            doc.setdefault("metadata", {})["namespace"] = namespace
        try:
            isvc = parse_inference_service(doc)
        except InvalidInferenceServiceError as error:
            yield doc, None, str(error)
            continue
        rung = Rung(cluster.rung) if cluster.rung else None
        yield (
            doc,
            preview(isvc, fleet, catalogs, now=now, config=config, apis=apis, rung=rung),
            None,
        )


def _setting(
    options: FleetOptions, cluster: ClusterOptions
) -> tuple[Catalogs, OperatorConfig, Fleet]:
    from kvq.catalog.engines import load_engine_catalog
    from kvq.catalog.gpus import load_gpu_catalog
    from kvq.catalog.models import load_model_catalog
    from kvq.decide.preview import Fleet, synthetic_fleet
    from kvq.decide.types import Catalogs, OperatorConfig
    from kvq.observe.prometheus import without_credentials
    from kvq.placement.discovery import DEFAULT_POOL_LABELS, gpu_pod
    from kvq.render.autoscaling import PrometheusAccess

    catalogs = Catalogs(load_gpu_catalog(), load_engine_catalog(), load_model_catalog())
    if (options.pool is None) == (options.nodes is None):
        fail("give --pool (a GPU product) or --nodes (a file of Node objects)")
    if options.nodes is not None:
        nodes = tuple(_objects(options.nodes, "Node"))
        pods = tuple(_objects(options.pods, "Pod")) if options.pods else ()
        fleet = Fleet(nodes, tuple(p for pod in pods if (p := gpu_pod(pod)) is not None))
    else:
        assert options.pool is not None
        gpu = catalogs.gpus.lookup(options.pool)
        if gpu is None:
            fail(f"unknown GPU {options.pool!r}: see the products in kvq/catalog/gpus.yaml")
        fleet = synthetic_fleet(
            gpu,
            gpus_per_node=options.gpus_per_node,
            node_count=options.node_count,
            pool=options.pool_name,
        )
    prometheus = (
        PrometheusAccess(
            without_credentials(cluster.prometheus_url), cluster.autoscaling_authentication
        )
        if cluster.prometheus_url
        else None
    )
    config = OperatorConfig(
        pool_labels=options.pool_labels or DEFAULT_POOL_LABELS,
        autoscaling_prometheus=prometheus,
        operator_image=cluster.operator_image,
    )
    return catalogs, config, fleet


def _objects(path: str, kind: str) -> list[dict[str, Any]]:
    """The objects of `kind` in a file of documents or `kind: List`s (kubectl get -o yaml)."""
    found: list[dict[str, Any]] = []
    for doc in load_documents(path):
        if str(doc.get("kind", "")).endswith("List"):
            # A list's items may leave their kind out (the API's own lists do).
            items = doc.get("items") or []
            found.extend(i for i in items if isinstance(i, dict) and i.get("kind", kind) == kind)
        elif doc.get("kind") == kind:
            found.append(doc)
    if kind == "Node" and not found:
        fail(f"{path} holds no Node objects")
    return found
