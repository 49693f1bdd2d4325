"""Bad InferenceServices get the message the API server gives; good ones parse."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvq.api.models import InferenceService
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
