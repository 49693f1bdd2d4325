"""`kvq`: the operator and the tools around it, one module per command."""

from __future__ import annotations

import typer

from kvq.cli import crd, demo, diagnose, fetch, plan, probe, render, run, validate

app = typer.Typer(
    name="kvq",
    help="Kubernetes operator for vLLM with a quantized (FP8/INT8) KV cache.",
    no_args_is_help=True,
    add_completion=False,
)


def _mount_dev_cluster() -> None:
    from kvq.devcluster.cli import app as dev_cluster_app

    app.add_typer(dev_cluster_app, name="dev-cluster")


_mount_dev_cluster()
for command in (
    crd.crd,
    validate.validate,
    plan.plan,
    render.render,
    fetch.fetch,
    probe.probe,
    demo.demo,
    diagnose.diagnose,
    run.run,
):
    app.command()(command)


def main() -> None:
    app()
