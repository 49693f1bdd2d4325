"""`kvq render` prints what the operator applies: on the local control plane, for the golden
examples (tiers with routing and autoscaling, a CPU tier with autoscaling, replicas with a
PDB, a model cache kvq owns, tensor parallel 4), the objects `kvq run` applied are exactly
the ones `kvq render --nodes` printed for the same cluster's nodes: the same objects (kind
and name), and applying each printed object as the operator's field manager (a server-side
dry run) changes nothing in the live one.

The cluster serves KEDA's ScaledObject, the Gateway API's HTTPRoute and the InferencePool
(their CRDs), and the operator has a Prometheus URL for KEDA, so every kind kvq renders is
applied. That Prometheus is real and scrapes nothing: `make test` runs KEDA for the whole
session (test_operator_autoscaling), and KEDA acts on these ScaledObjects too. With an
unreachable Prometheus, KEDA's fallback (kvq's rule: serve maxReplicas when signals are
missing) would scale the service to 4 replicas and the operator would rightly add a PDB that
the preview, made for the spec's replicas, did not print. An empty Prometheus answers with no
samples: no load, minReplicas kept, whether KEDA runs or not.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.devcluster.addons import apply_all, load_manifests
from e2e.devcluster.binaries import build_components, cached_manifests
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import wait_until
from e2e.prometheus.server import RunningPrometheus, prometheus_running
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

from kvq.api.keys import FIELD_MANAGER
from kvq.k8s.apply import server_side_apply
from tests.cluster.operator_support import (
    OperatorProcess,
    create_isvc,
    install_kvq_crd,
    operator_running,
    read_isvc,
)
from tests.prometheus_support import require_prometheus

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
APPLIED_TIMEOUT = 90
# Every kind kvq applies, as (apiVersion, kind).
KINDS = (
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("v1", "PersistentVolumeClaim"),
    ("apps/v1", "Deployment"),
    ("policy/v1", "PodDisruptionBudget"),
    ("batch/v1", "Job"),
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
    ("inference.networking.k8s.io/v1", "InferencePool"),
)

# No pass for this long: the operator has settled (a retry comes within a second or two).
QUIET_S = 3.0


def example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / name).read_text())
    return doc


def service(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kvq.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": spec,
    }


CASES = {
    # spec.tiers + spec.routing + spec.autoscaling: two Deployments, an HTTPRoute, a
    # ScaledObject (the old render printed one Deployment and neither).
    "tiers-routing-autoscaling": example("llama3-8b-tiers.yaml"),
    "cpu-tier-autoscaling": example("llama3-8b-shared-prefixes.yaml"),
    "replicas-pdb-awq": example("llama3-8b-fp8.yaml"),
    # tests/golden/render/hf-cached-claim.yaml: the model cache's claim, kvq's own.
    "model-cache": service(
        "llama-cached",
        model={
            "uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
            "revision": "0e9e39f249a16976918f6564b8830bc894c89659",
            "tokenSecretRef": {"name": "hf-token", "key": "token"},
            "cache": {"volumeClaim": {"accessMode": "ReadWriteMany", "size": "40Gi"}},
        },
        kvCache={"dtype": "fp8"},
        replicas=2,
    ),
    # tests/golden/render/tp4-replica.yaml: tensor parallel 4 on the 8-GPU nodes.
    "tp4": service(
        "llama70b",
        model={"uri": "hf://meta-llama/Llama-3.1-70B-Instruct", "cache": {"claimName": "models"}},
        kvCache={"dtype": "fp8"},
        memory={"maxModelLen": 32768},
        replicas=2,
        engine={"runAsUser": 1000},
        placement={"gpusPerReplica": 4},
    ),
}


@pytest.fixture(scope="module")
def served_apis(kube: Kube) -> None:
    """kvq's CRD, and the CRDs of the optional APIs kvq renders for (no controllers)."""
    install_kvq_crd(kube)
    build_components(["crds"])
    files = [
        cached_manifests("keda-crds", "KEDA_VERSION") / "keda.sh_scaledobjects.yaml",
        cached_manifests("gateway-api-crds", "GATEWAY_API_VERSION")
        / "gateway.networking.k8s.io_httproutes.yaml",
        cached_manifests("inference-extension-crds", "INFERENCE_EXTENSION_VERSION")
        / "inference.networking.k8s.io_inferencepools.yaml",
    ]
    apply_all(
        kube.state, load_manifests(files), Path(kube.state.run_dir) / "logs" / "kube-apiserver.log"
    )


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningPrometheus]:
    """A real Prometheus with no scrape targets (see the module's docstring)."""
    require_prometheus()
    with prometheus_running(tmp_path_factory.mktemp("prometheus"), []) as running:
        yield running


@pytest.fixture
def operator(
    kube: Kube, namespace: str, served_apis: None, prometheus: RunningPrometheus, tmp_path: Path
) -> Iterator[OperatorProcess]:
    # Started after the CRDs: the operator learns what the cluster serves at start-up.
    extra = ("--autoscaling-prometheus-url", prometheus.url)
    with operator_running(kube, namespace, tmp_path / "operator.log", extra) as process:
        yield process


def render(
    kube: Kube, namespace: str, doc: dict[str, Any], prometheus_url: str, tmp_path: Path
) -> list[Any]:
    """`kvq render` as a person runs it, on the nodes `kubectl get nodes -o yaml` gives."""
    nodes = kube.api.sanitize_for_serialization(kube.core.list_node())
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({**nodes, "kind": "NodeList"}))
    (tmp_path / "isvc.yaml").write_text(yaml.safe_dump(doc))
    argv = [sys.executable, "-m", "kvq.cli", "render", "-f", str(tmp_path / "isvc.yaml")]
    argv += ["--nodes", str(tmp_path / "nodes.yaml"), "-n", namespace]
    argv += ["--prometheus-url", prometheus_url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def applied(dynamic: DynamicClient, namespace: str, uid: str) -> dict[tuple[str, str], Any]:
    """Every object of a kind kvq applies that the InferenceService controls."""
    found = {}
    for api_version, kind in KINDS:
        resource = dynamic.resources.get(api_version=api_version, kind=kind)
        for item in resource.get(namespace=namespace).to_dict()["items"]:
            owners = item["metadata"].get("ownerReferences") or []
            if any(o.get("uid") == uid and o.get("controller") for o in owners):
                found[kind, item["metadata"]["name"]] = item
    return found


def essence(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without what the server keeps about the write itself."""
    metadata = {
        k: v
        for k, v in obj["metadata"].items()
        if k not in ("resourceVersion", "managedFields", "generation")
    }
    return {k: v for k, v in {**obj, "metadata": metadata}.items() if k != "status"}


def differences(left: Any, right: Any, path: str = "") -> list[str]:
    if isinstance(left, dict) and isinstance(right, dict):
        return [
            d
            for key in sorted(set(left) | set(right))
            for d in differences(left.get(key), right.get(key), f"{path}.{key}")
        ]
    if isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
        return [
            d
            for i, (a, b) in enumerate(zip(left, right, strict=True))
            for d in differences(a, b, f"{path}[{i}]")
        ]
    return [] if left == right else [f"{path}: applied {left!r}, as printed {right!r}"]


def settle(operator: OperatorProcess) -> None:
    """Until the operator makes no more passes (the first one's follow-ups included)."""
    seen: list[float] = []
    samples = int(QUIET_S / 0.5) + 1

    def quiet() -> bool:
        seen.append(operator.sample("kvq_reconciles_total"))
        return len(seen) >= samples and seen[-1] == seen[-samples]

    wait_until(quiet, what="the operator to settle", timeout=60, interval=0.5)


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_operator_applies_what_kvq_render_printed(
    kube: Kube,
    namespace: str,
    operator: OperatorProcess,
    prometheus: RunningPrometheus,
    tmp_path: Path,
    case: str,
) -> None:
    doc = CASES[case]
    printed = render(kube, namespace, doc, prometheus.url, tmp_path)
    name = doc["metadata"]["name"]
    uid = create_isvc(kube, namespace, doc)["metadata"]["uid"]
    dynamic = DynamicClient(kube.api)
    wanted = {(o["kind"], o["metadata"]["name"]) for o in printed}

    def all_applied() -> bool:
        return wanted <= set(applied(dynamic, namespace, uid))

    def describe() -> str:
        status = read_isvc(kube, namespace, name).get("status") or {}
        return f"{yaml.safe_dump(status.get('conditions'))}\n{operator.log_tail()}"

    wait_until(
        all_applied, what=f"{sorted(wanted)} applied", timeout=APPLIED_TIMEOUT, describe=describe
    )
    settle(operator)
    live = applied(dynamic, namespace, uid)
    assert set(live) == wanted, f"applied {sorted(live)}, render printed {sorted(wanted)}"
    for obj in printed:
        current = live[obj["kind"], obj["metadata"]["name"]]
        # render leaves out the ownerReferences (the live service's uid) and nothing else.
        owners = current["metadata"]["ownerReferences"]
        body = {**obj, "metadata": {**obj["metadata"], "ownerReferences": owners}}
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        try:
            response = server_side_apply(
                dynamic,
                resource,
                body,
                namespace,
                field_manager=FIELD_MANAGER,
                force=True,
                dry_run=True,
                serialize=False,
            )
        except NotFoundError as error:
            raise AssertionError(f"{obj['kind']} {obj['metadata']['name']}: {error}") from error
        after = yaml.safe_load(response.data)
        found = differences(essence(current), essence(after))
        assert not found, f"{obj['kind']} {obj['metadata']['name']}:\n" + "\n".join(found)
