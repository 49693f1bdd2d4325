"""Two `kvq run` replicas sharing a kopf peering object: exactly one of them reconciles."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.devcluster import peering
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import wait_until

from kvq.api.keys import GROUP, PLURAL, VERSION
from tests.cluster.operator_support import (
    OperatorProcess,
    apply_object,
    create_isvc,
    delete_inference_services,
    inference_service,
    install_kvq_crd,
    read_isvc,
)

pytestmark = pytest.mark.cluster

PEERING = "kvq"
NAME = "llama"


@pytest.fixture
def replicas(kube: Kube, namespace: str, tmp_path: Path) -> Iterator[list[OperatorProcess]]:
    install_kvq_crd(kube)
    for crd in peering.peering_crds():
        apply_object(kube, crd)

    def created() -> bool:
        # A fresh client each time: discovery must see the CRD that was just installed.
        apply_object(kube, peering.peering_object(PEERING, namespace))
        return True

    wait_until(created, what="the KopfPeering object", timeout=30, retry_on=(Exception,))
    processes = [
        OperatorProcess(
            kube.state.kubeconfig, namespace, tmp_path / f"replica-{i}.log", peering=PEERING
        )
        for i in range(2)
    ]
    for process in processes:
        process.start()
    try:
        yield processes
    finally:
        try:
            delete_inference_services(
                kube, namespace, describe=lambda: "\n".join(p.log_tail() for p in processes)
            )
        finally:
            for process in processes:
                process.stop()


def live_peers(kube: Kube, namespace: str) -> dict[str, object]:
    found = kube.custom.get_namespaced_custom_object(
        peering.PEERING_GROUP, peering.PEERING_VERSION, namespace, "kopfpeerings", PEERING
    )
    return dict(found.get("status") or {})


def test_two_replicas_one_reconciles(
    kube: Kube, namespace: str, replicas: list[OperatorProcess]
) -> None:
    wait_until(
        lambda: len(live_peers(kube, namespace)) == 2,
        what="both replicas in the peering object",
        timeout=60,
        describe=lambda: "\n".join(p.log_tail() for p in replicas),
    )
    create_isvc(kube, namespace, inference_service(NAME))

    def ready() -> bool:
        status = read_isvc(kube, namespace, NAME).get("status") or {}
        return any(
            c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", [])
        )

    wait_until(ready, what="Ready", timeout=120, describe=replicas[0].log_tail)
    counts = [p.sample("kvq_reconciles_total") for p in replicas]
    # Changes wake the operator; three label edits in a row make a pass of whoever is active.
    for value in ("a", "b", "c"):
        kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, NAME, {"metadata": {"labels": {"edit": value}}}
        )
    wait_until(
        lambda: sum(p.sample("kvq_reconciles_total") for p in replicas) >= sum(counts) + 1,
        what="a reconcile after the edits",
        timeout=30,
    )

    active = [p for p in replicas if p.sample("kvq_reconciles_total") > 0]
    assert len(active) == 1, [p.sample("kvq_reconciles_total") for p in replicas]
    priorities = {peer["priority"] for peer in live_peers(kube, namespace).values()}  # type: ignore[index]
    assert len(priorities) == 2


def test_the_paused_replica_takes_over_when_the_active_one_stops(
    kube: Kube, namespace: str, replicas: list[OperatorProcess]
) -> None:
    wait_until(
        lambda: len(live_peers(kube, namespace)) == 2,
        what="both replicas in the peering object",
        timeout=60,
    )
    create_isvc(kube, namespace, inference_service(NAME))
    wait_until(
        lambda: any(p.sample("kvq_reconciles_total") > 0 for p in replicas),
        what="the active replica's first reconcile",
        timeout=60,
    )
    (active,) = [p for p in replicas if p.sample("kvq_reconciles_total") > 0]
    (standby,) = [p for p in replicas if p is not active]

    active.stop()  # SIGTERM: kopf withdraws its peering record on the way out
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, NAME, {"spec": {"replicas": 2}}
    )

    wait_until(
        lambda: kube.apps.read_namespaced_deployment(NAME, namespace).spec.replicas == 2,
        what="the standby replica to reconcile the change",
        timeout=60,
        describe=standby.log_tail,
    )
    assert standby.sample("kvq_reconciles_total") > 0
