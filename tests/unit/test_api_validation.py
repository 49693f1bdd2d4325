"""Bad InferenceServices get the message the API server gives; good ones parse."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvq.api.placement import PlacementSpec
from kvq.api.resource import InferenceService
from kvq.api.validation import (
    InvalidInferenceServiceError,
    Violation,
    find_violations,
    parse_inference_service,
)

ROOT = Path(__file__).resolve().parents[2]
CASES = yaml.safe_load((ROOT / "tests/fixtures/isvc/invalid.yaml").read_text())
BASE: dict[str, Any] = {
    "apiVersion": "kvq.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "llama", "namespace": "default"},
    "spec": {"model": {"uri": "hf://meta-llama/Meta-Llama-3-8B"}},
}


def build_case(case: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    for key, value in case["spec"].items():
        if value is None:
            doc["spec"].pop(key, None)
        else:
            doc["spec"][key] = value
    if "name" in case:
        doc["metadata"]["name"] = case["name"]
    doc["metadata"].update(case.get("metadata", {}))
    return doc


def test_there_are_at_least_twenty_cases() -> None:
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_invalid_case_gets_its_message(case: dict[str, Any]) -> None:
    assert find_violations(build_case(case)) == [Violation(case["field"], case["message"])]


def test_every_violation_is_reported_not_just_the_first() -> None:
    doc = copy.deepcopy(BASE)
    doc["spec"]["memory"] = {"gpuMemoryUtilization": 2, "swapSpaceGiB": -4}
    doc["spec"]["kvCache"] = {"dtype": "fp4"}
    fields = sorted(v.field for v in find_violations(doc))
    assert fields == [
        "spec.kvCache.dtype",
        "spec.memory.gpuMemoryUtilization",
        "spec.memory.swapSpaceGiB",
    ]


def test_parse_raises_with_every_message_in_kubectl_form() -> None:
    doc = build_case(CASES[0])
    with pytest.raises(InvalidInferenceServiceError) as err:
        parse_inference_service(doc)
    assert str(err.value).startswith('InferenceService "llama" is invalid:\n* spec.kvCache.dtype:')


def test_wrong_kind_is_refused_before_schema_checks() -> None:
    doc = copy.deepcopy(BASE)
    doc["kind"] = "Deployment"
    [violation] = find_violations(doc)
    assert "expected kvq.dev/v1alpha1 InferenceService" in violation.message


def test_minimal_service_gets_documented_defaults() -> None:
    isvc = parse_inference_service(copy.deepcopy(BASE))
    spec = isvc.spec
    assert spec.kv_cache.dtype == "auto"
    assert spec.memory.gpu_memory_utilization == 0.90
    assert spec.memory.swap_space_gib is None  # the engine's own default
    assert spec.placement.gpus_per_replica == 1
    assert spec.fallback.enabled is True
    assert spec.fallback.rungs == ["auto"]
    assert spec.replicas == 1


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "InferenceService":
            assert find_violations(doc) == []


def test_round_trip_keeps_wire_names() -> None:
    doc = yaml.safe_load((ROOT / "examples/llama3-8b-fp8.yaml").read_text())
    isvc = InferenceService.model_validate(doc)
    wire = isvc.to_kube()
    assert wire["spec"]["memory"]["swapSpaceGiB"] == 0
    assert wire["spec"]["model"]["tokenSecretRef"] == {"name": "hf-token", "key": "token"}
    assert InferenceService.model_validate(wire) == isvc


def _with(spec: dict[str, Any] | None = None, **metadata: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["spec"].update(spec or {})
    doc["metadata"].update(metadata)
    return doc


# The document is read as the API server reads it: JSON types, no coercion.
@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"replicas": "2"}, "spec.replicas", 'Invalid value: "string": must be of type integer'),
        ({"replicas": 2.0}, "spec.replicas", 'Invalid value: "number": must be of type integer'),
        ({"replicas": True}, "spec.replicas", 'Invalid value: "boolean": must be of type integer'),
        (
            {"memory": {"gpuMemoryUtilization": "0.5"}},
            "spec.memory.gpuMemoryUtilization",
            'Invalid value: "string": must be of type number',
        ),
        (
            {"memory": {"gpuMemoryUtilization": True}},
            "spec.memory.gpuMemoryUtilization",
            'Invalid value: "boolean": must be of type number',
        ),
        (
            {"kvCache": {"calculateScales": 1}},
            "spec.kvCache.calculateScales",
            'Invalid value: "integer": must be of type boolean',
        ),
        (
            {"kvCache": {"calculateScales": "yes"}},
            "spec.kvCache.calculateScales",
            'Invalid value: "string": must be of type boolean',
        ),
    ],
)
def test_json_types_are_not_coerced(spec: dict[str, Any], field: str, message: str) -> None:
    assert find_violations(_with(spec)) == [Violation(field, message)]


def test_an_integer_is_a_number() -> None:
    isvc = parse_inference_service(_with({"memory": {"gpuMemoryUtilization": 1}}))
    assert isvc.spec.memory.gpu_memory_utilization == 1.0


def test_only_wire_names_are_fields() -> None:
    assert find_violations(_with({"memory": {"max_model_len": 4096}})) == [
        Violation("spec.memory.max_model_len", 'unknown field "spec.memory.max_model_len"')
    ]
    # Python code still builds the models by their field names.
    assert PlacementSpec(gpus_per_replica=2).to_kube()["gpusPerReplica"] == 2


def test_gpus_per_replica_follows_the_parallelism_when_omitted() -> None:
    two_nodes = parse_inference_service(
        _with({"placement": {"parallelism": {"tensor": 8, "pipeline": 2}}})
    )
    assert two_nodes.spec.placement.gpus_per_replica == 16
    assert two_nodes.spec.placement.to_kube()["gpusPerReplica"] == 16
    stages = parse_inference_service(_with({"placement": {"parallelism": {"pipeline": 2}}}))
    assert stages.spec.placement.gpus_per_replica == 2
    # Stated both ways, they must agree; more than a node needs the layout said.
    assert not find_violations(
        _with({"placement": {"gpusPerReplica": 16, "parallelism": {"tensor": 8, "pipeline": 2}}})
    )


def test_a_null_is_read_as_absent_and_the_default_applies() -> None:
    doc = _with({"replicas": None, "kvCache": None, "placement": {"nodeSelector": {"a": None}}})
    isvc = parse_inference_service(doc)
    assert isvc.spec.replicas == 1
    assert isvc.spec.kv_cache.dtype == "auto"
    assert isvc.spec.placement.node_selector == {}


def test_a_null_list_item_or_unknown_field_is_still_refused() -> None:
    assert find_violations(_with({"placement": {"pools": [None]}})) == [
        Violation("spec.placement.pools[0]", 'Invalid value: "null": must be of type string')
    ]
    assert find_violations(_with({"bogus": None})) == [
        Violation("spec.bogus", 'unknown field "spec.bogus"')
    ]


def test_a_model_from_the_server_parses_strictly() -> None:
    doc = _with(
        uid="0b1c",
        resourceVersion="17",
        generation=3,
        creationTimestamp="2026-01-01T00:00:00Z",
        managedFields=[{"manager": "kubectl", "operation": "Apply"}],
    )
    assert parse_inference_service(doc).metadata.generation == 3


@pytest.mark.parametrize(
    ("metadata", "violations"),
    [
        ({"bogus": "x"}, [("metadata.bogus", 'unknown field "metadata.bogus"')]),
        (
            {"resource_version": "1"},
            [("metadata.resource_version", 'unknown field "metadata.resource_version"')],
        ),
        ({"labels": {"team": None}, "annotations": None}, []),
        ({"annotations": {"Example.COM/Team": "x", "note": "🙂"}}, []),
        (
            {"labels": {"team": "v" * 64}},
            [
                (
                    "metadata.labels",
                    f'Invalid value: "{"v" * 64}": must be no more than 63 characters',
                )
            ],
        ),
        (
            {"labels": {"a/b/c": "x"}},
            [
                (
                    "metadata.labels",
                    'Invalid value: "a/b/c": a qualified name must consist of alphanumeric '
                    "characters, '-', '_' or '.', and must start and end with an alphanumeric "
                    "character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional "
                    "DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                )
            ],
        ),
        (
            {"annotations": {"x": "v" * (256 * 1024)}},
            [("metadata.annotations", "Too long: may not be more than 262144 bytes")],
        ),
    ],
)
def test_metadata_is_checked_as_the_server_checks_object_meta(
    metadata: dict[str, Any], violations: list[tuple[str, str]]
) -> None:
    assert find_violations(_with(**metadata)) == [Violation(*v) for v in violations]
