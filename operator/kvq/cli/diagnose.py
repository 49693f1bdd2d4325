"""`kvq diagnose`: what kvq would do with an engine's failure."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from kvq.api.kv_cache import KV_CACHE_DTYPES
from kvq.cli.console import fail


def diagnose(
    file: Annotated[
        str,
        typer.Option(
            "-f", "--filename", help="A termination message or a whole engine log, or - for stdin"
        ),
    ],
    kv_cache_dtype: Annotated[
        str, typer.Option(help="The KV-cache dtype the engine ran with")
    ] = "auto",
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
) -> None:
    """Say what kvq would do with an engine's failure: fall back, wait, or what to fix."""
    from kvq.fallback.classifier import classify_failure
    from kvq.fallback.diagnosis import diagnose_text

    if output not in ("table", "json"):
        fail(f"--output must be table or json, not {output!r}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        fail(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}")
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(errors="replace")
    except OSError as error:
        fail(f"cannot read {file}: {error.strerror or error}")
    if not text.strip():
        fail(f"{file} is empty: give a termination message or an engine log")
    diagnosis = diagnose_text(text, kv_cache_dtype=kv_cache_dtype, classify=classify_failure)
    if output == "json":
        print(json.dumps(diagnosis.to_json(), indent=2))
        return
    table = Table(show_header=False, box=None)
    table.add_row("family", diagnosis.family)
    table.add_row("decision", f"{diagnosis.decision}: {diagnosis.what_kvq_does}")
    table.add_row("reason", diagnosis.reason)
    table.add_row("what to do", diagnosis.remedy)
    Console().print(table)
    if diagnosis.evidence:
        print("evidence:")
        print("\n".join(f"  {line}" for line in diagnosis.evidence.splitlines()))
