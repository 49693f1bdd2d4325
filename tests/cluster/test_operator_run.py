"""`kvq run` end to end: an InferenceService becomes Ready on a KWOK GPU node, the steady
state writes nothing, a killed operator restarted converges without duplicates, and a
service is deleted at once, with or without the operator."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.devcluster.binaries import locate_binaries
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import wait_for_deletion, wait_until

from kvq.api import keys
from kvq.api.keys import GROUP, PLURAL, VERSION
from tests.cluster.operator_support import (
    OperatorProcess,
    create_isvc,
    inference_service,
    install_kvq_crd,
    operator_running,
    read_isvc,
)

pytestmark = pytest.mark.cluster

NAME = "llama"
READY_TIMEOUT = 120
MANAGED = f"{keys.LABEL_MANAGED_BY}={keys.MANAGED_BY_VALUE}"

# No pass for this long: the operator has settled (a retry comes within a second or two).
QUIET_S = 3.0


@pytest.fixture(scope="module")
def crd(kube: Kube) -> None:
    install_kvq_crd(kube)


@pytest.fixture
def operator(kube: Kube, namespace: str, crd: None, tmp_path: Path) -> Iterator[OperatorProcess]:
    with operator_running(kube, namespace, tmp_path / "operator.log") as process:
        yield process


def kubectl_wait_ready(kube: Kube, namespace: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(locate_binaries().kubectl),
            f"--kubeconfig={kube.state.kubeconfig}",
            f"--namespace={namespace}",
            "wait",
            "--for=condition=Ready",
            f"kis/{NAME}",
            f"--timeout={READY_TIMEOUT}s",
        ],
        capture_output=True,
        text=True,
        timeout=READY_TIMEOUT + 30,
        check=False,
    )


def conditions(kube: Kube, namespace: str) -> dict[str, Any]:
    status = read_isvc(kube, namespace, NAME).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


def managed_objects(kube: Kube, namespace: str) -> dict[str, list[str]]:
    return {
        "Deployment": [
            d.metadata.name
            for d in kube.apps.list_namespaced_deployment(namespace, label_selector=MANAGED).items
        ],
        "ReplicaSet": [
            r.metadata.name
            for r in kube.apps.list_namespaced_replica_set(namespace, label_selector=MANAGED).items
        ],
        "Service": [
            s.metadata.name
            for s in kube.core.list_namespaced_service(namespace, label_selector=MANAGED).items
        ],
        "ConfigMap": [
            c.metadata.name
            for c in kube.core.list_namespaced_config_map(namespace, label_selector=MANAGED).items
        ],
        "Pod": [
            p.metadata.name
            for p in kube.core.list_namespaced_pod(namespace, label_selector=MANAGED).items
        ],
    }


def test_an_inference_service_becomes_ready_on_a_gpu_node(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    began = time.monotonic()
    create_isvc(kube, namespace, inference_service(NAME))

    waited = kubectl_wait_ready(kube, namespace)

    assert waited.returncode == 0, f"{waited.stdout}{waited.stderr}\n{operator.log_tail()}"
    print(f"\ncreate -> Ready (kubectl wait): {time.monotonic() - began:.1f} s")
    status = read_isvc(kube, namespace, NAME)["status"]
    assert status["effective"]["kvCacheDtype"] == "fp8"
    assert status["readyReplicas"] == 1
    (pod,) = kube.core.list_namespaced_pod(namespace, label_selector=MANAGED).items
    node = kube.core.read_node(pod.spec.node_name)
    assert status["placement"]["pool"] in node.metadata.labels.values()


def settle(operator: OperatorProcess) -> float:
    """Wait until the operator has nothing left to do (no reconcile for a while: every
    pass it made was for a change it saw), and return its reconcile count."""
    seen: list[float] = []
    samples = int(QUIET_S / 0.5) + 1

    def quiet() -> bool:
        seen.append(operator.sample("kvq_reconciles_total", result="ok"))
        return len(seen) >= samples and seen[-1] == seen[-samples]

    wait_until(quiet, what="the operator to settle", timeout=60, interval=0.5)
    return seen[-1]


def test_at_steady_state_reconciles_write_nothing_and_ask_nothing(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    create_isvc(kube, namespace, inference_service(NAME))
    assert kubectl_wait_ready(kube, namespace).returncode == 0, operator.log_tail()
    reconciles = settle(operator)
    writes = operator.sample("kvq_writes_total")
    reads = operator.sample("kvq_reads_total")
    status = read_isvc(kube, namespace, NAME)["status"]
    deployment_version = kube.apps.read_namespaced_deployment(
        NAME, namespace
    ).metadata.resource_version

    # Edits kvq does not act on still wake it (a watch event each; three in a row make one
    # pass): it must decide from its caches that nothing changed, and neither write nor ask
    # the API server anything.
    for value in ("a", "b", "c"):
        kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, NAME, {"metadata": {"labels": {"edit": value}}}
        )
    wait_until(
        lambda: operator.sample("kvq_reconciles_total", result="ok") >= reconciles + 1,
        what="a reconcile after the edits",
        timeout=30,
        describe=operator.log_tail,
    )
    settle(operator)

    assert operator.sample("kvq_writes_total") == writes, operator.log_tail()
    assert operator.sample("kvq_reads_total") == reads
    assert read_isvc(kube, namespace, NAME)["status"] == status
    assert (
        kube.apps.read_namespaced_deployment(NAME, namespace).metadata.resource_version
        == deployment_version
    )
    decisions = operator.sample("kvq_decision_seconds_count")
    seconds = operator.sample("kvq_decision_seconds_sum")
    print(
        f"\nsteady state: {writes:.0f} writes in total, none for 3 unrelated edits; "
        f"decide() mean {1000 * seconds / decisions:.2f} ms over {decisions:.0f} decisions"
    )


def test_a_killed_operator_restarted_converges_without_duplicates(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    create_isvc(kube, namespace, inference_service(NAME))
    # Kill it as soon as its first object lands: the same pass has more to write.
    wait_until(
        lambda: managed_objects(kube, namespace)["ConfigMap"],
        what="the operator's first write",
        timeout=60,
        interval=0.02,
        describe=operator.log_tail,
    )
    operator.kill()
    at_kill = managed_objects(kube, namespace)
    status_at_kill = read_isvc(kube, namespace, NAME).get("status")
    print(f"\nkilled with {at_kill}, status {'written' if status_at_kill else 'not written'}")

    operator.start()
    waited = kubectl_wait_ready(kube, namespace)

    assert waited.returncode == 0, f"{waited.stderr}\n{operator.log_tail()}"
    objects = managed_objects(kube, namespace)
    assert objects["Deployment"] == [NAME]
    assert objects["Service"] == [NAME]
    assert objects["ConfigMap"] == [f"{NAME}-kvq-evidence"]
    assert len(objects["ReplicaSet"]) == 1
    assert len(objects["Pod"]) == 1
    assert conditions(kube, namespace)["Ready"]["status"] == "True"
    # Deleting now often meets the restarted operator's first pass: its loop ends there.
    began = time.monotonic()
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
    wait_for_deletion(lambda: read_isvc(kube, namespace, NAME), what="deletion", timeout=30)
    print(f"deletion after the restart: {time.monotonic() - began:.1f} s")
    assert time.monotonic() - began < 10


def test_a_restart_at_steady_state_writes_nothing(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    create_isvc(kube, namespace, inference_service(NAME))
    assert kubectl_wait_ready(kube, namespace).returncode == 0, operator.log_tail()
    settle(operator)
    version = read_isvc(kube, namespace, NAME)["metadata"]["resourceVersion"]

    operator.stop()
    operator.start()
    wait_until(
        lambda: operator.sample("kvq_reconciles_total", result="ok") >= 1,
        what="the restarted operator's first reconcile",
        timeout=60,
        describe=operator.log_tail,
    )
    settle(operator)

    assert operator.sample("kvq_writes_total") == 0, operator.log_tail()
    assert read_isvc(kube, namespace, NAME)["metadata"]["resourceVersion"] == version


def test_a_service_deleted_while_the_operator_is_stopped_goes_at_once_with_its_objects(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    create_isvc(kube, namespace, inference_service(NAME))
    assert kubectl_wait_ready(kube, namespace).returncode == 0, operator.log_tail()
    # No finalizer holds the object for the operator (kopf's daemons would add one).
    assert not read_isvc(kube, namespace, NAME)["metadata"].get("finalizers")
    operator.stop()

    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
    wait_for_deletion(lambda: read_isvc(kube, namespace, NAME), what="deletion", timeout=10)
    # Garbage collection takes what kvq rendered, by the ownerReferences.
    wait_until(
        lambda: not any(managed_objects(kube, namespace).values()),
        what="the service's Deployment, Service, ConfigMap, ReplicaSet and pod to go",
        timeout=60,
        describe=lambda: str(managed_objects(kube, namespace)),
    )


def test_the_finalizer_an_earlier_kvq_left_is_removed(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    body = inference_service(NAME)
    body["metadata"]["finalizers"] = [keys.FINALIZER]
    create_isvc(kube, namespace, body)
    assert kubectl_wait_ready(kube, namespace).returncode == 0, operator.log_tail()
    wait_until(
        lambda: not read_isvc(kube, namespace, NAME)["metadata"].get("finalizers"),
        what=f"{keys.FINALIZER} to be removed",
        timeout=30,
        describe=operator.log_tail,
    )
    # And nothing holds the deletion.
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
    wait_for_deletion(lambda: read_isvc(kube, namespace, NAME), what="deletion", timeout=10)
