"""What every `kvq` command shares: the error console, failing with exit code 2, and YAML
documents in and out."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import typer
import yaml
from rich.console import Console

err = Console(stderr=True)


def fail(message: str) -> NoReturn:
    # Not wrapped at the terminal width: a message is copied, grepped and tested whole.
    err.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def load_documents(path: str) -> list[dict[str, Any]]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    try:
        docs = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as error:
        err.print(f"[red]error:[/] {path} is not valid YAML: {error}")
        raise typer.Exit(2) from error
    if not all(isinstance(d, dict) for d in docs):
        err.print(f"[red]error:[/] {path} must hold YAML mappings (Kubernetes objects)")
        raise typer.Exit(2)
    return docs


class _LiteralDumper(yaml.SafeDumper):
    """Multi-line strings (the evidence wrapper script) as readable `|` blocks."""


def _str_presenter(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _str_presenter)


def dump_yaml(documents: list[dict[str, Any]]) -> str:
    return yaml.dump_all(documents, Dumper=_LiteralDumper, sort_keys=True, width=100)
