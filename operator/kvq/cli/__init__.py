"""`kvq`: the operator and the tools around it, one module per command."""

from __future__ import annotations

import typer

from kvq.cli import crd, diagnose, fetch, plan, probe, render, run, validate

app = typer.Typer(
    name="kvq",
    help="Kubernetes operator for vLLM with a quantized (FP8/INT8) KV cache.",
    no_args_is_help=True,
    add_completion=False,
)

for command in (
    crd.crd,
    validate.validate,
    plan.plan,
    render.render,
    fetch.fetch,
    probe.probe,
    diagnose.diagnose,
    run.run,
):
    app.command()(command)


def main() -> None:
    app()
