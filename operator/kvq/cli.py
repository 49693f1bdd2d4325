"""`kvq`: the operator and the tools around it (plan, render, validate, crd, dev-cluster)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console

app = typer.Typer(
    name="kvq",
    help="Kubernetes operator for vLLM with a quantized (FP8/INT8) KV cache.",
    no_args_is_help=True,
    add_completion=False,
)
err = Console(stderr=True)


def _load_documents(path: str) -> list[dict[str, Any]]:
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


@app.command()
def crd() -> None:
    """Print the InferenceService CustomResourceDefinition (generated from the API models)."""
    from kvq.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())


@app.command()
def validate(
    file: Annotated[str, typer.Option("-f", "--filename", help="YAML file, or - for stdin")],
) -> None:
    """Check InferenceServices with the same verdicts and messages as the CRD at apply time."""
    from kvq.api.models import KIND
    from kvq.api.validation import find_violations

    failed = False
    for doc in _load_documents(file):
        if doc.get("kind") != KIND:
            continue
        name = (doc.get("metadata") or {}).get("name", "<unnamed>")
        violations = find_violations(doc)
        if violations:
            failed = True
            print(f'The InferenceService "{name}" is invalid:')
            for violation in violations:
                print(f"* {violation}")
        else:
            print(f"inferenceservice/{name} valid")
    raise typer.Exit(1 if failed else 0)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
