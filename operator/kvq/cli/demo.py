"""`kvq demo`: the local control plane, the operator, the examples and a fallback."""

from __future__ import annotations

from typing import Annotated

import typer


def demo(
    profile: Annotated[str, typer.Option(help="Cluster profile (e2e/clusters)")] = "hetero",
) -> None:
    """Local control plane + operator + examples: placement, static and runtime fallback."""
    from kvq.devcluster.demo import run_demo

    raise typer.Exit(run_demo(profile=profile))
