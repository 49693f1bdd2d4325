"""The committed CRD is what the models generate, is structural, and its CEL agrees with Python."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kvq.api.crd import crd_manifest, crd_yaml, openapi_schema
from kvq.api.validation import find_violations
from tests.unit.cel_eval import apply_defaults, failed_rules
from tests.unit.test_api_validation import CASES, build_case

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds/kvq.dev_inferenceservices.yaml"


def test_committed_crd_matches_the_models() -> None:
    assert CRD_FILE.read_text() == crd_yaml(), "crds/ drifted: run `make crd` and commit"


def _walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, schema)]
    for name, sub in schema.get("properties", {}).items():
        out += _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        out += _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += _walk(schema["additionalProperties"], f"{path}{{}}")
    return out


def test_every_field_is_described_for_kubectl_explain() -> None:
    undescribed = [
        path
        for path, node in _walk(openapi_schema())
        if path
        and not path.endswith(("[]", "{}"))
        and not node.get("description")
        # The API server refuses anything but `type: object` on the root metadata.
        and path != ".metadata"
    ]
    assert undescribed == []


def test_schema_is_structural() -> None:
    forbidden = ("$ref", "anyOf", "oneOf", "allOf", "nullable", "title", "$defs")
    offenders = [(p, k) for p, node in _walk(openapi_schema()) for k in forbidden if k in node]
    assert offenders == []
    assert all("type" in node for path, node in _walk(openapi_schema()) if path)


def test_crd_shape_for_kubectl() -> None:
    crd = crd_manifest()
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["kis"]
    assert names["categories"] == ["kvq"]
    [version] = crd["spec"]["versions"]
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == [
        "Model",
        "Requested",
        "Effective",
        "Pool",
        "Replicas",
        "Tiers",
        "Sequences",
        "Ready",
        "Age",
    ]
    wide = [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority")]
    assert wide == ["Sequences"]
    conditions = openapi_schema()["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


RULE_MESSAGES = {
    rule["message"]
    for _, node in _walk(openapi_schema())
    for rule in node.get("x-kubernetes-validations", [])
}
CEL_CASES = [c for c in CASES if c["message"] in RULE_MESSAGES]


def test_most_cases_are_cel_rules() -> None:
    assert len(CEL_CASES) >= 15


@pytest.mark.parametrize("case", CEL_CASES, ids=[c["case"] for c in CEL_CASES])
def test_cel_rule_and_python_check_agree(case: dict[str, Any]) -> None:
    doc = build_case(case)
    defaulted = apply_defaults(doc, openapi_schema())
    assert failed_rules(defaulted, openapi_schema()) == [(case["field"], case["message"])]
    assert [(v.field, v.message) for v in find_violations(doc)] == [
        (case["field"], case["message"])
    ]


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_pass_every_cel_rule(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "InferenceService":
            assert failed_rules(apply_defaults(doc, openapi_schema()), openapi_schema()) == []


def test_every_integer_a_user_writes_has_an_upper_bound() -> None:
    # The API server refuses integers beyond int64; a bound below it gives the same verdict
    # offline and a message that names the field.
    unbounded = [
        path
        for path, node in _walk(openapi_schema()["properties"]["spec"], ".spec")
        if node.get("type") == "integer"
        and "maximum" not in node
        and not any(
            "<=" in r["rule"] or "self in [" in r["rule"]
            for r in node.get("x-kubernetes-validations", [])
        )
    ]
    assert unbounded == []


@pytest.mark.parametrize(
    ("path", "keys"),
    [
        (("tiers",), ["name"]),
        (("pod", "imagePullSecrets"), ["name"]),
        (("placement", "topologySpreadConstraints"), ["topologyKey", "whenUnsatisfiable"]),
    ],
)
def test_lists_keyed_like_the_pod_spec_are_list_maps(
    path: tuple[str, ...], keys: list[str]
) -> None:
    node = openapi_schema()["properties"]["spec"]
    for name in path:
        node = node["properties"][name]
    assert node["x-kubernetes-list-type"] == "map"
    assert node["x-kubernetes-list-map-keys"] == keys
