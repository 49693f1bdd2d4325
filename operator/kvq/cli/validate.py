"""`kvq validate`: the API server's verdicts and messages on InferenceServices, offline, and
given a fleet, the operator's placement checks too."""

from __future__ import annotations

from typing import Annotated

import typer

from kvq.cli.console import load_documents
from kvq.cli.fleet import (
    FleetOptions,
    GpusPerNode,
    NodeCount,
    Nodes,
    Pods,
    Pool,
    PoolLabel,
    PoolName,
    previews,
)


def validate(
    file: Annotated[str, typer.Option("-f", "--filename", help="YAML file, or - for stdin")],
    pool: Pool = None,
    pool_name: PoolName = None,
    gpus_per_node: GpusPerNode = 8,
    node_count: NodeCount = 1,
    nodes: Nodes = None,
    pods: Pods = None,
    pool_label: PoolLabel = None,
) -> None:
    """Check InferenceServices with the same verdicts and messages as the CRD at apply time;
    with --pool or --nodes, also whether the operator can place them there (tensor-parallel
    size against the model's heads, GPUs per node, memory, the KV dtype on the GPU, ...)."""
    from kvq.api.keys import KIND
    from kvq.api.validation import find_violations

    fleet = FleetOptions(
        pool, pool_name, gpus_per_node, node_count, nodes, pods, tuple(pool_label or ())
    )
    failed = False
    if fleet.given:
        for doc, found, _ in previews(file, fleet):
            name = (doc.get("metadata") or {}).get("name", "<unnamed>")
            if found is None:
                failed = True
                _invalid(name, [str(v) for v in find_violations(doc)])
            elif problem := found.refusal or found.stalled:
                failed = True
                print(f'The InferenceService "{name}" cannot run on this fleet:')
                print(f"* {problem}")
            else:
                print(f"inferenceservice/{name} valid ({found.decision})")
                for need in found.requires:
                    print(f"* needs: {need}")
        raise typer.Exit(1 if failed else 0)
    for doc in load_documents(file):
        if doc.get("kind") != KIND:
            continue
        name = (doc.get("metadata") or {}).get("name", "<unnamed>")
        violations = find_violations(doc)
        if violations:
            failed = True
            _invalid(name, [str(v) for v in violations])
        else:
            print(f"inferenceservice/{name} valid")
    raise typer.Exit(1 if failed else 0)


def _invalid(name: str, violations: list[str]) -> None:
    print(f'The InferenceService "{name}" is invalid:')
    for violation in violations:
        print(f"* {violation}")
