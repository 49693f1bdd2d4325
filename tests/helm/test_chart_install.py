"""charts/kvq against the real control plane: the API server accepts what it renders, Helm
installs, upgrades and uninstalls it (CRDs and InferenceServices survive), the operator runs
with nothing but the chart's ServiceAccount, and that account can do no more than it needs."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, cast

import pytest
import yaml
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import wait_until
from kubernetes.client.exceptions import ApiException

from kvq.api.keys import GROUP, PLURAL, VERSION
from tests.helm.chart import CHART, ROOT, helm, values_file
from tests.helm.cluster_support import (
    kubectl,
    lists_namespaces,
    operator_running,
    refusals_in,
    service_account_kubeconfig,
)

pytestmark = pytest.mark.helm

EXAMPLE = ROOT / "examples" / "llama3-8b-fp8.yaml"
EXAMPLE_NAME = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
KVQ_CRD = "inferenceservices.kvq.dev"
PEERING_CRDS = ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")
# Every node of the test cluster is in a tainted GPU pool; the operator may run there.
ON_GPU_NODES: dict[str, Any] = {
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
}
OTHER_NAMESPACE = "default"


@pytest.fixture
def release(kube: Kube, namespace: str) -> Iterator[str]:
    name = f"kvq-{uuid.uuid4().hex[:6]}"
    yield name
    helm(
        *("uninstall", name, "--namespace", namespace, "--ignore-not-found", "--wait"),
        kubeconfig=kube.state.kubeconfig,
        check=False,
    )


class Installed(NamedTuple):
    seconds: float
    notes: str


def install(
    kube: Kube, release: str, namespace: str, tmp_path: Path, values: dict[str, Any], *more: str
) -> Installed:
    """`helm upgrade --install` with `values` and the flags in `more`; its time and NOTES."""
    began = time.monotonic()
    done = helm(
        *("upgrade", "--install", release, str(CHART), "--namespace", namespace, *more),
        *("--values", str(values_file(tmp_path, values, f"values-{uuid.uuid4().hex[:6]}.yaml"))),
        kubeconfig=kube.state.kubeconfig,
    )
    return Installed(time.monotonic() - began, done.stdout.partition("NOTES:")[2])


def read_deployment(kube: Kube, name: str, namespace: str) -> dict[str, Any]:
    found = kube.apps.read_namespaced_deployment(name, namespace)
    return cast(dict[str, Any], kube.api.sanitize_for_serialization(found))  # type: ignore[no-untyped-call]


def operator_args(deployment: dict[str, Any]) -> list[str]:
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def read_peering(kube: Kube, name: str, namespace: str | None = None) -> dict[str, Any]:
    if namespace is None:
        found = kube.custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", name)
    else:
        found = kube.custom.get_namespaced_custom_object(
            "kopf.dev", "v1", namespace, "kopfpeerings", name
        )
    return cast(dict[str, Any], found)


def read_example(kube: Kube, namespace: str) -> dict[str, Any]:
    found = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, EXAMPLE_NAME
    )
    return cast(dict[str, Any], found)


def install_chart_crds(kube: Kube) -> None:
    kubectl(
        *("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds")),
        kubeconfig=kube.state.kubeconfig,
    )

    def established() -> bool:
        # Not `kubectl wait`: it errors out while a new CRD has no conditions yet.
        for name in (KVQ_CRD, *PEERING_CRDS):
            status = kube.extensions.read_custom_resource_definition(name).status
            conditions = (status.conditions if status else None) or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    wait_until(established, what="the chart's CRDs Established", timeout=60)


def apply_example(kube: Kube, namespace: str, *how: str) -> None:
    def applied() -> bool:
        done = kubectl(
            *("apply", *how, "-n", namespace, "-f", str(EXAMPLE)),
            kubeconfig=kube.state.kubeconfig,
            check=False,
        )
        return done.returncode == 0

    # kubectl's discovery may not know the CRD the chart has just installed: ask again.
    wait_until(applied, what="kubectl apply of the example InferenceService", timeout=30)


def wait_ready(kube: Kube, namespace: str, log: Path) -> dict[str, Any]:
    """The example reconciled at its generation, Placed and Ready, its Deployment there.

    Ready is the last status write of a rollout (its pods became ready): a diff taken
    before it would race that write and see the status change.
    """

    def ready() -> dict[str, Any] | None:
        isvc = read_example(kube, namespace)
        status = isvc.get("status") or {}
        if status.get("observedGeneration") != isvc["metadata"]["generation"]:
            return None
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        if (conditions.get("Placed"), conditions.get("Ready")) != ("True", "True"):
            return None
        kube.apps.read_namespaced_deployment(EXAMPLE_NAME, namespace)
        return isvc

    def describe() -> str:
        return "\n".join(log.read_text(errors="replace").splitlines()[-30:])

    return wait_until(
        ready,
        what="the example Placed and Ready",
        timeout=120,
        retry_on=(ApiException,),
        describe=describe,
    )


def assert_no_drift(kube: Kube, namespace: str, *how: str) -> None:
    """`kubectl diff` of the applied file finds nothing: kvq wrote status, never the spec.

    `how` must match the apply: a server-side diff of a client-side applied object
    rewrites kubectl's last-applied annotation, a difference that is kubectl's, not kvq's.
    """
    diff = kubectl(
        *("diff", *how, "-n", namespace, "-f", str(EXAMPLE)),
        kubeconfig=kube.state.kubeconfig,
        check=False,
    )
    assert (diff.returncode, diff.stderr) == (0, ""), diff.stdout


SERVED = "<served>"
DRY_RUN_MODES: dict[str, dict[str, Any]] = {
    "cluster-wide": {},
    "namespaced": {"watchNamespaces": [SERVED]},
    "standalone": {"replicas": 1},
    "two-namespaces-standalone": {"replicas": 1, "watchNamespaces": [SERVED, OTHER_NAMESPACE]},
}


@pytest.mark.parametrize("mode", DRY_RUN_MODES)
def test_rendered_chart_is_accepted_by_the_api_server(
    kube: Kube, namespace: str, tmp_path: Path, mode: str
) -> None:
    install_chart_crds(kube)
    values = json.loads(json.dumps(DRY_RUN_MODES[mode]).replace(SERVED, namespace))
    manifest = helm(
        *("template", "kvq-dry", str(CHART), "--namespace", namespace),
        *("--values", str(values_file(tmp_path, values))),
    ).stdout
    expected = sum(1 for doc in yaml.safe_load_all(manifest) if doc)

    refusal: list[str] = []

    def accepted() -> list[str] | None:
        done = kubectl(
            *("apply", "--dry-run=server", "-f", "-"),
            kubeconfig=kube.state.kubeconfig,
            stdin=manifest,
            check=False,
        )
        refusal[:] = [done.stderr]
        return done.stdout.splitlines() if done.returncode == 0 else None

    # Retried only while kubectl's discovery catches up with the CRDs just installed.
    lines = wait_until(
        accepted,
        what="a server-side dry-run of the chart",
        timeout=30,
        describe=lambda: "".join(refusal),
    )
    assert len(lines) == expected
    assert all(line.endswith("(server dry run)") for line in lines)


def test_install_upgrade_uninstall_keep_crds_and_inference_services(
    kube: Kube, namespace: str, release: str, tmp_path: Path
) -> None:
    first = install(kube, release, namespace, tmp_path, ON_GPU_NODES, "--wait", "--timeout=3m")
    print(f"\nhelm install --wait (2 replicas, ready): {first.seconds:.1f} s")
    assert f"installed in namespace {namespace}" in first.notes
    assert f"rollout status deployment/{release}" in first.notes
    assert f'one active at a time (kopf peering "{release}")' in first.notes
    deployment = read_deployment(kube, release, namespace)
    assert deployment["status"]["readyReplicas"] == 2
    assert f"--peering={release}" in operator_args(deployment)
    assert read_peering(kube, release)["metadata"]["name"] == release
    apply_example(kube, namespace)

    upgrade = install(kube, release, namespace, tmp_path, {**ON_GPU_NODES, "replicas": 1}, "--wait")
    print(f"helm upgrade --wait (to 1 replica): {upgrade.seconds:.1f} s")
    assert "1 replica(s), standalone" in upgrade.notes
    deployment = read_deployment(kube, release, namespace)
    assert deployment["spec"]["replicas"] == 1
    assert "--standalone" in operator_args(deployment)
    with pytest.raises(ApiException) as gone:
        read_peering(kube, release)
    assert gone.value.status == 404
    history = json.loads(
        helm(
            "history", release, "-n", namespace, "-o", "json", kubeconfig=kube.state.kubeconfig
        ).stdout
    )
    assert [(h["revision"], h["status"]) for h in history] == [(1, "superseded"), (2, "deployed")]

    began = time.monotonic()
    helm("uninstall", release, "-n", namespace, "--wait", kubeconfig=kube.state.kubeconfig)
    print(f"helm uninstall --wait: {time.monotonic() - began:.1f} s")
    for read in (
        lambda: kube.apps.read_namespaced_deployment(release, namespace),
        lambda: kube.rbac.read_cluster_role(f"{release}-cluster"),
        lambda: kube.core.read_namespaced_service_account(release, namespace),
    ):
        with pytest.raises(ApiException) as deleted:
            read()
        assert deleted.value.status == 404
    for crd in (KVQ_CRD, *PEERING_CRDS):
        kube.extensions.read_custom_resource_definition(crd)  # 404 would raise
    assert read_example(kube, namespace)["metadata"]["name"] == EXAMPLE_NAME


def test_operator_as_the_chart_service_account_reconciles_without_drift(
    kube: Kube, namespace: str, release: str, tmp_path: Path
) -> None:
    install(kube, release, namespace, tmp_path, {})
    account = service_account_kubeconfig(
        kube.state.kubeconfig, namespace, release, tmp_path / "sa.kubeconfig"
    )
    args = ["--all-namespaces", f"--peering={release}"]
    with operator_running(account, args, tmp_path / "operator.log") as log:
        apply_example(kube, namespace)
        wait_ready(kube, namespace, log)
        assert_no_drift(kube, namespace)
        assert read_peering(kube, release).get("status"), (
            "the operator did not write its lease into the peering object"
        )
    assert refusals_in(log) == []


def test_operator_in_namespaced_mode_needs_only_the_roles(
    kube: Kube, namespace: str, release: str, tmp_path: Path
) -> None:
    install(kube, release, namespace, tmp_path, {"watchNamespaces": [namespace]})
    account = service_account_kubeconfig(
        kube.state.kubeconfig, namespace, release, tmp_path / "sa.kubeconfig"
    )
    args = [f"--namespace={namespace}", f"--peering={release}"]
    with operator_running(account, args, tmp_path / "operator.log") as log:
        apply_example(kube, namespace, "--server-side")
        wait_ready(kube, namespace, log)
        assert_no_drift(kube, namespace, "--server-side")
        assert read_peering(kube, release, namespace).get("status"), (
            "the operator did not write its lease into the peering object"
        )
    # kopf would list Namespaces to match patterns; with exact names it does without.
    assert [line for line in refusals_in(log) if not lists_namespaces(line)] == []
