"""`kvq fetch`: the model download of the engine pod's init container."""

from __future__ import annotations

from typing import Annotated

import typer


def fetch(
    uri: Annotated[str, typer.Option(help="hf://org/name or s3://bucket/prefix")],
    cache_dir: Annotated[str, typer.Option(help="The cache volume's mount path")],
    revision: Annotated[str | None, typer.Option(help="hf://: branch, tag or commit")] = None,
    link: Annotated[str | None, typer.Option(help="Symlink to point at the fetched model")] = None,
) -> None:
    """Download a model into the cache (the engine pod's init container), verify, link it."""
    from kvq.fetch.command import run_fetch

    raise typer.Exit(run_fetch(uri, revision, cache_dir, link))
