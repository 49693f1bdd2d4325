"""What the executor and operator tests share: the kvq CRD, InferenceServices, metric reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from e2e.devcluster.clients import Kube
from e2e.devcluster.ports import allocate_ports
from e2e.devcluster.waits import wait_until
from e2e.prometheus.server import RunningPrometheus, ScrapeTarget, prometheus_running
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from kvq.api.crd import crd_manifest
from kvq.api.keys import GROUP, PLURAL, VERSION


def apply_object(kube: Kube, body: dict[str, Any]) -> None:
    """Server-side apply as the tests' own field manager (not counted as kvq's writes)."""
    dynamic = DynamicClient(kube.api)
    resource = dynamic.resources.get(api_version=body["apiVersion"], kind=body["kind"])
    dynamic.server_side_apply(
        resource,
        body=body,
        namespace=body["metadata"].get("namespace"),
        field_manager="kvq-tests",
        force_conflicts=True,
    )


def install_kvq_crd(kube: Kube) -> None:
    """Server-side apply the committed-schema CRD (idempotent) and wait until it is served."""
    body = crd_manifest()
    name = body["metadata"]["name"]
    apply_object(kube, body)

    def established() -> bool:
        crd = kube.extensions.read_custom_resource_definition(name)
        return any(
            c.type == "Established" and c.status == "True" for c in crd.status.conditions or []
        )

    wait_until(established, what="the InferenceService CRD to be Established", timeout=30)
    wait_until(
        lambda: kube.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL) is not None,
        what="InferenceServices to be served",
        timeout=30,
        retry_on=(ApiException,),
    )


def inference_service(name: str, **spec: Any) -> dict[str, Any]:
    """Llama-3-8B with an FP8 KV cache: the hetero profile has pools that can run it."""
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"uri": "hf://meta-llama/Meta-Llama-3-8B"},
            "kvCache": {"dtype": "fp8"},
            "memory": {"maxModelLen": 8192},
        },
    }
    body["spec"].update(spec)
    return body


def create_isvc(kube: Kube, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )
    return created


def read_isvc(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return found


def writes_so_far() -> float:
    """kvq_writes_total summed over kinds and verbs, in this process."""
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "kvq_writes":
            total += sum(s.value for s in metric.samples if s.name == "kvq_writes_total")
    return total


class OperatorProcess:
    """`kvq run` as a subprocess against the test cluster, watching one namespace.

    Standalone unless `peering` names a KopfPeering object in that namespace.
    """

    def __init__(
        self,
        kubeconfig: str,
        namespace: str,
        log_path: Path,
        resync: float = 300.0,
        peering: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.peering = peering
        self.extra_args = tuple(extra_args)
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.log_path = log_path
        self.resync = resync
        self.metrics_port = allocate_ports(["metrics"])["metrics"]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [
            *(sys.executable, "-m", "kvq.cli", "run"),
            *(("--peering", self.peering) if self.peering else ("--standalone",)),
            *("--namespace", self.namespace),
            # Long: every test must converge from watch events alone, not from a resync.
            *("--resync", str(self.resync)),
            *("--metrics-port", str(self.metrics_port)),
            "--verbose",
            *self.extra_args,
        ]
        env = {**os.environ, "KUBECONFIG": self.kubeconfig}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        wait_until(
            self._serving, what="the operator's /metrics", timeout=60, describe=self.log_tail
        )

    def kill(self) -> None:
        """SIGKILL: no cleanup, exactly like a node dying under the operator."""
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)
            self.process = None

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
        self.process = None

    def sample(self, name: str, **labels: str) -> float:
        """A sample's value from /metrics summed over the labels not given (0 if absent)."""
        text = self._scrape()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total

    def stacks_and_log(self) -> str:
        """Every thread's stack (SIGUSR1 -> faulthandler), then the log's end."""
        if self.process is not None:
            self.process.send_signal(signal.SIGUSR1)
            wait_until(lambda: "Thread 0x" in self.log_tail(400), what="a stack dump", timeout=10)
        return self.log_tail(400)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.is_file():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _serving(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"the operator exited:\n{self.log_tail()}")
        try:
            self._scrape()
        except OSError:
            return False
        return True

    def _scrape(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())


@contextmanager
def operator_running(
    kube: Kube, namespace: str, log_path: Path, extra_args: Sequence[str] = ()
) -> Iterator[OperatorProcess]:
    """A standalone operator for one namespace; its InferenceServices are deleted before it
    stops (kopf's finalizer is lifted only by a running operator)."""
    process = OperatorProcess(kube.state.kubeconfig, namespace, log_path, extra_args=extra_args)
    process.start()
    try:
        yield process
    finally:
        try:
            if process.process is None:
                process.start()
            delete_inference_services(kube, namespace, describe=process.stacks_and_log)
        finally:
            process.stop()


@contextmanager
def operator_on_prometheus(
    kube: Kube, namespace: str, run_dir: Path, targets: Sequence[ScrapeTarget]
) -> Iterator[tuple[RunningPrometheus, OperatorProcess]]:
    """A Prometheus scraping the engines' `targets` every second, and the operator reading
    it (what KEDA's queries and kvq's autoscaling read in the autoscaling tests)."""
    with (
        prometheus_running(
            run_dir / "prometheus", list(targets), scrape_interval_s=1
        ) as prometheus,
        operator_running(
            kube,
            namespace,
            run_dir / "operator.log",
            extra_args=[f"--prometheus-url={prometheus.url}"],
        ) as operator,
    ):
        yield prometheus, operator


def delete_inference_services(kube: Kube, namespace: str, describe: Any = None) -> None:
    """Delete every InferenceService in `namespace` and wait until they are gone."""
    kube.custom.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)

    def gone() -> bool:
        found = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        return not found["items"]

    wait_until(gone, what="InferenceServices deleted", timeout=60, describe=describe)
