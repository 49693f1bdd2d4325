"""KWOK's stage file: one YAML document per stage (KWOK reads a merged document as its last
stage and silently drops the first), and every simulated fate that keeps a pod from
becoming Ready has a stage of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

STAGES = Path(__file__).resolve().parents[2] / "e2e" / "kwok" / "stages.yaml"


class _UniqueKeys(yaml.SafeLoader):
    pass


def _refuse_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        assert key not in seen, f"duplicate key {key!r} at line {key_node.start_mark.line + 1}"
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _refuse_duplicates)


def stages() -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(STAGES.read_text(), Loader=_UniqueKeys) if d]


def test_each_stage_is_its_own_document_with_its_own_name() -> None:
    names = [s["metadata"]["name"] for s in stages()]
    assert len(names) == len(set(names))
    assert all(s["kind"] == "Stage" for s in stages())


def test_every_fate_kept_from_ready_has_a_stage() -> None:
    by_name = {s["metadata"]["name"]: s for s in stages()}
    ready = by_name["pod-ready"]["spec"]["selector"]["matchExpressions"]
    kept = next(e["values"] for e in ready if e["operator"] == "NotIn")
    handled = {
        value
        for stage in stages()
        if stage["metadata"]["name"] != "pod-ready"
        for expression in stage["spec"].get("selector", {}).get("matchExpressions", [])
        if expression["operator"] == "In"
        for value in expression["values"]
    }
    assert set(kept) <= handled, f"fates without a stage: {set(kept) - handled}"
