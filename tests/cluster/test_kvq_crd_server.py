"""The real API server gives every invalid InferenceService the message kvq validate gives.

Same cases as tests/unit/test_api_validation.py (tests/fixtures/isvc/invalid.yaml), sent
with `kubectl apply --dry-run=server` exactly as a user would.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.devcluster.clients import Kube

from tests.cluster.operator_support import install_kvq_crd
from tests.unit.test_api_validation import CASES, build_case

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = str(Path(sys.executable).parent / "kubectl")


def kubectl(kube: Kube, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBECTL, "--kubeconfig", str(kube.state.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def crd(kube: Kube) -> Kube:
    install_kvq_crd(kube)
    return kube


def _server_errors(stderr: str) -> list[str]:
    """The `field: message` lines of kubectl's error, one per violation."""
    if "strict decoding error: " in stderr:
        # Unknown fields are refused while decoding, before validation, in another shape.
        fields = re.findall(r'unknown field "([^"]+)"', stderr)
        return [f'{field}: unknown field "{field}"' for field in fields]
    text = stderr.split(" is invalid: ", 1)[-1]
    lines = [line.strip().removeprefix("* ").strip() for line in text.splitlines()]
    # The server's notice that CEL rules were skipped after a schema error is no violation.
    return [line for line in lines if line and "some validation rules were not checked" not in line]


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_server_refuses_with_the_same_message(
    crd: Kube, namespace: str, case: dict[str, Any]
) -> None:
    doc = build_case(case)
    doc["metadata"]["namespace"] = namespace
    result = kubectl(crd, "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(doc))
    assert result.returncode != 0, f"the server accepted {case['case']}"
    errors = _server_errors(result.stderr)
    field = case["field"] if case["field"] != "<root>" else ""
    matching = [e for e in errors if case["message"] in e and e.startswith(field)]
    assert matching, f"server said: {result.stderr}"
    assert len(errors) == 1, f"server said more than the one expected error: {result.stderr}"


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_server_accepts_the_examples(crd: Kube, namespace: str, path: Path) -> None:
    result = kubectl(crd, "apply", "--dry-run=server", "-n", namespace, "-f", str(path))
    assert result.returncode == 0, result.stderr


def test_kubectl_explain_teaches_the_api(crd: Kube) -> None:
    result = kubectl(crd, "explain", "inferenceservice.spec.kvCache.dtype")
    assert result.returncode == 0, result.stderr
    assert "fp8_e4m3" in result.stdout


def test_short_name_category_and_columns(crd: Kube, namespace: str) -> None:
    example = ROOT / "examples/llama3-8b-fp8.yaml"
    created = kubectl(crd, "apply", "-n", namespace, "-f", str(example))
    assert created.returncode == 0, created.stderr
    listed = kubectl(crd, "get", "kis", "-n", namespace)
    assert listed.returncode == 0, listed.stderr
    header = listed.stdout.splitlines()[0].split()
    assert header == [
        "NAME",
        "MODEL",
        "REQUESTED",
        "EFFECTIVE",
        "POOL",
        "REPLICAS",
        "TIERS",
        "READY",
        "AGE",
    ]
    by_category = kubectl(crd, "get", "kvq", "-n", namespace, "-o", "name")
    assert "inferenceservice.kvq.dev/llama3-8b" in by_category.stdout
    stored = yaml.safe_load(
        kubectl(crd, "get", "kis", "llama3-8b", "-n", namespace, "-o", "yaml").stdout
    )
    # The server filled in the documented defaults the file left out.
    assert stored["spec"]["kvCache"]["calculateScales"] is False
