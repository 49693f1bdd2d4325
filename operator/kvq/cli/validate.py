"""`kvq validate`: the API server's verdicts and messages on InferenceServices, offline."""

from __future__ import annotations

from typing import Annotated

import typer

from kvq.cli.console import load_documents


def validate(
    file: Annotated[str, typer.Option("-f", "--filename", help="YAML file, or - for stdin")],
) -> None:
    """Check InferenceServices with the same verdicts and messages as the CRD at apply time."""
    from kvq.api.keys import KIND
    from kvq.api.validation import find_violations

    failed = False
    for doc in load_documents(file):
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
