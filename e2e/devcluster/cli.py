"""`python -m e2e.devcluster up|down|status|usage|demo`: the local control plane from the
command line, and the demo on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from e2e.devcluster import cluster
from e2e.devcluster.addons import ADDON_NAMES, start_addons
from e2e.devcluster.binaries import BinaryBuildError, ensure_binaries
from e2e.devcluster.profiles import load_profile, scale_profile
from pydantic import ValidationError

app = typer.Typer(
    name="python -m e2e.devcluster",
    help="Local Kubernetes control plane (real etcd/apiserver/controllers, KWOK GPU nodes), "
    "and the demo on it. Development and test tooling: not part of the kvq package.",
    no_args_is_help=True,
    add_completion=False,
)

NameOption = Annotated[str, typer.Option("--name", help="Cluster name (one run dir per name).")]


@app.command()
def up(
    profile: Annotated[
        str, typer.Option(help="Profile name in e2e/clusters/ or a path to a profile YAML.")
    ] = "hetero",
    kubeconfig: Annotated[
        Path | None, typer.Option(help="Also write the admin kubeconfig here.")
    ] = None,
    name: NameOption = "dev",
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for readiness, counted after the build.")
    ] = 180.0,
    nodes: Annotated[
        int | None,
        typer.Option(help="Scale the profile's pools to this many nodes in all (proportionally)."),
    ] = None,
    addons: Annotated[
        str,
        typer.Option(help="Opt-in add-ons to start too, comma-separated: keda, gateway."),
    ] = "",
    build_timeout: Annotated[
        float | None,
        typer.Option(help="Seconds the build of missing binaries may take (default 3600)."),
    ] = None,
) -> None:
    """Start a fresh cluster with the profile's GPU node pools and wait until it is ready."""
    wanted = [a.strip() for a in addons.split(",") if a.strip()]
    try:
        chosen = load_profile(profile)
        if nodes is not None:
            scale_profile(chosen, nodes)
        unknown = sorted(set(wanted) - set(ADDON_NAMES))
        if unknown:
            raise ValueError(f"unknown add-on {unknown[0]!r} (known: {', '.join(ADDON_NAMES)})")
    except (FileNotFoundError, ValidationError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from error
    try:
        binaries = ensure_binaries(timeout=build_timeout)
        state = cluster.up(
            name=name,
            profile=profile,
            kubeconfig=kubeconfig,
            timeout=timeout,
            binaries=binaries,
            nodes=nodes,
        )
        try:
            start_addons(state, wanted)
        except BaseException:
            cluster.down(name)  # `up` is all or nothing
            raise
    except (BinaryBuildError, cluster.ClusterStartError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error
    typer.echo(f"cluster {state.name!r} ready in {state.startup_seconds} s ({state.server})")
    steps = ", ".join(f"{k} {v} s" for k, v in state.milestones.items())
    typer.echo(f"profile: {state.profile}; {steps}")
    for addon, exposed in state.addons.items():
        typer.echo(f"add-on {addon}: " + ", ".join(f"{k} {v}" for k, v in exposed.items()))
    typer.echo(f"logs: {Path(state.run_dir) / 'logs'}")
    typer.echo(f"viewer (no RBAC bindings): {state.viewer_kubeconfig}")
    typer.echo(f"export KUBECONFIG={state.kubeconfig}")


@app.command()
def down(name: NameOption = "dev") -> None:
    """Stop every process of the cluster (its files stay in the run dir for inspection)."""
    stopped = cluster.down(name)
    typer.echo(f"cluster {name!r} stopped" if stopped else f"cluster {name!r} was not running")


@app.command()
def status(name: NameOption = "dev") -> None:
    """Print the cluster's components, readiness and kubeconfig as JSON; exit 1 if not ready."""
    info = cluster.status(name)
    typer.echo(json.dumps(info, indent=2))
    if not info.get("ready"):
        raise typer.Exit(1)


@app.command()
def usage(
    name: NameOption = "dev",
    seconds: Annotated[float, typer.Option(min=1.0, help="Length of the window.")] = 60.0,
) -> None:
    """Each component's CPU (cores) and RSS, and the API server's requests/s by verb."""
    from e2e.devcluster.usage import measure_usage

    state = cluster.ClusterState.load(name)
    if state is None:
        typer.echo(f"error: no cluster {name!r}", err=True)
        raise typer.Exit(1)
    measured = measure_usage(state.processes, cluster.admin_rest(state), seconds)
    typer.echo(f"over {measured.seconds} s:")
    for c in measured.components:
        typer.echo(f"  {c.name:<28} {c.cpu_cores:6.3f} cores  {c.rss_mib:8.1f} MiB")
    total_rss = sum(c.rss_mib for c in measured.components)
    total_cpu = sum(c.cpu_cores for c in measured.components)
    typer.echo(f"  {'total':<28} {total_cpu:6.3f} cores  {total_rss:8.1f} MiB")
    rates = ", ".join(f"{verb} {rate}" for verb, rate in measured.requests_per_second.items())
    total = sum(measured.requests_per_second.values())
    typer.echo(f"API requests/s: {total:.2f} ({rates})")


@app.command()
def demo(
    profile: Annotated[str, typer.Option(help="Cluster profile (e2e/clusters)")] = "hetero",
) -> None:
    """Local control plane + operator + examples: placement, static and runtime fallback."""
    from e2e.devcluster.demo import run_demo

    raise typer.Exit(run_demo(profile=profile))
