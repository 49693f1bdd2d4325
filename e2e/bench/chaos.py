"""`make chaos`: kvq's decisions survive a killed operator, a restarted API server and etcd.

Two runs on a local control plane (the `fleet` profile scaled down):

1. standalone: 200 InferenceServices of two replicas are created while a quarter of them
   run on a simulated GPU that refuses fp8 (so runtime fallbacks are under way); the
   operator is SIGKILLed 20 times at random moments (and restarted each time), the API
   server is restarted once and etcd once.
2. peering: two operator replicas; 100 services; the active replica is SIGKILLed five times
   (a new one is started each time) and the other takes over.

Then, once everything has converged: every service has exactly one Deployment, Service,
PodDisruptionBudget and evidence ConfigMap; a refusing service has exactly one fallback
attempt (requested -> auto) and the others none; no rung was entered twice; every service
is Ready on the dtype it should run. Prints what it did and found; exits 1 on a violation.

    python -m e2e.bench.chaos [--services 200] [--kills 20] [--seed 1]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.devcluster import cluster
from e2e.devcluster.clients import Kube, api_client
from e2e.devcluster.peering import peering_crds, peering_object
from e2e.devcluster.ports import allocate_ports
from e2e.devcluster.waits import WaitTimeoutError, wait_until
from kubernetes import client as k8s

from kvq.api import keys
from kvq.api.crd import crd_manifest
from kvq.api.keys import GROUP, PLURAL, VERSION

NAMESPACE = "chaos"
PEERING = "kvq-chaos"
REJECT_EVERY = 4
REFUSAL = (
    "engine exited with code 1\nerror lines, most specific first:\n"
    "NotImplementedError: FP8 KV cache requires head_size divisible by 32 on CPU."
)
MANAGED = f"{keys.LABEL_MANAGED_BY}={keys.MANAGED_BY_VALUE}"
CONVERGE_TIMEOUT = 900.0


@dataclass
class Report:
    name: str
    services: int
    kills: int = 0
    restarts: list[str] = field(default_factory=list)
    converged_s: float | None = None
    violations: list[str] = field(default_factory=list)


class Operators:
    """`kvq run` processes for the chaos namespace, killed and restarted at will."""

    def __init__(self, kubeconfig: str, log_dir: Path, peering: bool) -> None:
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.peering = peering
        self.running: list[tuple[subprocess.Popen[bytes], int]] = []
        self.started = 0

    def start(self) -> None:
        port = allocate_ports(["metrics"])["metrics"]
        self.started += 1
        argv = [
            *(sys.executable, "-m", "kvq.cli", "run", "--namespace", NAMESPACE),
            *(("--peering", PEERING, "--peering-lifetime", "15") if self.peering
              else ("--standalone",)),
            f"--metrics-port={port}",
        ]  # fmt: skip
        log = self.log_dir / f"operator-{self.started}.log"
        env = {**os.environ, "KUBECONFIG": self.kubeconfig}
        with log.open("ab") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.running.append((process, port))

    def reconciles(self, port: int) -> float:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as r:
                text = r.read().decode()
        except OSError:
            return 0.0
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("kvq_reconciles_total{")
        )

    def kill_active(self) -> None:
        """SIGKILL the replica that reconciles (the only one when standalone)."""
        alive = [(p, port) for p, port in self.running if p.poll() is None]
        active = max(alive, key=lambda item: self.reconciles(item[1]))
        active[0].send_signal(signal.SIGKILL)
        active[0].wait(timeout=30)
        self.running.remove(active)

    def stop(self) -> None:
        for process, _ in self.running:
            process.terminate()
        for process, _ in self.running:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make chaos", description=__doc__.split("\n")[0])
    parser.add_argument("--services", type=int, default=200)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--peering-services", type=int, default=100)
    parser.add_argument("--peering-kills", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=80)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    reports = [
        _run("standalone", args.services, args.kills, args.nodes, peering=False, rng=rng),
        _run("peering", args.peering_services, args.peering_kills, args.nodes, peering=True,
             rng=rng),
    ]  # fmt: skip
    failed = False
    print("\nkvq chaos:")
    for report in reports:
        verdict = "PASS" if not report.violations else "FAIL"
        print(
            f"  {report.name}: {report.services} services, {report.kills} operator kills, "
            f"restarts: {', '.join(report.restarts) or 'none'}; converged in "
            f"{report.converged_s} s; {len(report.violations)} violations  {verdict}"
        )
        for violation in report.violations[:20]:
            print(f"    - {violation}")
        failed = failed or bool(report.violations)
    return 1 if failed else 0


def _run(
    name: str, services: int, kills: int, nodes: int, *, peering: bool, rng: random.Random
) -> Report:
    report = Report(name, services)
    print(f"chaos {name}: {services} services, {kills} kills", flush=True)
    state = cluster.up(name=f"chaos-{name}", profile="fleet", nodes=nodes, timeout=600)
    api = api_client(state.kubeconfig)
    kube = Kube(state, api)
    operators = Operators(state.kubeconfig, Path(state.run_dir), peering)
    try:
        _prepare(kube, peering)
        operators.start()
        if peering:
            operators.start()
        names = [f"svc-{i:03d}" for i in range(services)]
        with ThreadPoolExecutor(8) as pool:
            creating = pool.submit(_create_all, kube, names)
            _chaos(kube, operators, kills, peering, rng, report)
            creating.result()
        while len([p for p, _ in operators.running if p.poll() is None]) < (2 if peering else 1):
            operators.start()
        began = time.monotonic()
        try:
            wait_until(
                lambda: _converged(kube, names),
                what=f"{services} services to converge",
                timeout=CONVERGE_TIMEOUT,
                interval=2.0,
            )
            report.converged_s = round(time.monotonic() - began, 1)
        except WaitTimeoutError as timed_out:
            report.violations.append(str(timed_out).splitlines()[0])
        report.violations.extend(_check(kube, names))
    finally:
        operators.stop()
        api.close()  # type: ignore[no-untyped-call]
        cluster.down(f"chaos-{name}")
    return report


def _prepare(kube: Kube, peering: bool) -> None:
    from kubernetes.dynamic import DynamicClient

    dynamic = DynamicClient(kube.api)  # type: ignore[no-untyped-call]
    kube.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE)))
    bodies = [crd_manifest(), *(peering_crds() if peering else [])]
    for body in bodies:
        resource = dynamic.resources.get(api_version=body["apiVersion"], kind=body["kind"])
        dynamic.server_side_apply(resource, body=body, field_manager="kvq-chaos")
    for body in bodies:
        wait_until(
            lambda body=body: _established(kube, body["metadata"]["name"]),
            what=f"{body['metadata']['name']} established",
            timeout=60,
        )
    if peering:
        body = peering_object(PEERING, NAMESPACE)
        resource = dynamic.resources.get(api_version=body["apiVersion"], kind=body["kind"])
        wait_until(
            lambda: dynamic.server_side_apply(
                resource, body=body, namespace=NAMESPACE, field_manager="kvq-chaos"
            ),
            what="the peering object",
            timeout=60,
            retry_on=(Exception,),
        )


def _established(kube: Kube, name: str) -> bool:
    crd = kube.extensions.read_custom_resource_definition(name)
    return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])


def _spec(index: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"uri": "hf://meta-llama/Meta-Llama-3-8B"},
        "kvCache": {"dtype": "fp8"},
        "memory": {"maxModelLen": 8192},
        "replicas": 2,
    }
    if index % REJECT_EVERY == REJECT_EVERY - 1:
        spec["engine"] = {
            "env": [
                {"name": "KVQ_SIM_REJECT_KV_CACHE_DTYPE", "value": "fp8"},
                {"name": "KVQ_SIM_TERMINATION_MESSAGE", "value": REFUSAL},
            ]
        }
    return spec


def _create_all(kube: Kube, names: list[str]) -> None:
    def one(name: str) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "InferenceService",
            "metadata": {"name": name},
            "spec": _spec(int(name.split("-")[1])),
        }
        # The API server may be restarting: retry until it takes the object.
        wait_until(
            lambda: _create_once(kube, body),
            what=f"{name} created",
            timeout=300,
            retry_on=(k8s.exceptions.ApiException, OSError, Exception),
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))


def _create_once(kube: Kube, body: dict[str, Any]) -> bool:
    try:
        kube.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
    except k8s.exceptions.ApiException as error:
        if error.status != 409:  # 409: an earlier try got through before the restart
            raise
    return True


def _chaos(
    kube: Kube,
    operators: Operators,
    kills: int,
    peering: bool,
    rng: random.Random,
    report: Report,
) -> None:
    """Kill the operator `kills` times at random moments; restart the API server and etcd
    once each (standalone run) somewhere in between."""
    restarts: dict[int, str] = {}
    if not peering:
        restarts = {kills // 3: "kube-apiserver", (2 * kills) // 3: "etcd"}
    for round_ in range(kills):
        moment = time.monotonic() + rng.uniform(0.5, 6.0)
        wait_until(lambda m=moment: time.monotonic() >= m, what="a random moment",
                   timeout=10, interval=0.1)  # fmt: skip
        operators.kill_active()
        report.kills += 1
        operators.start()
        component = restarts.get(round_)
        if component is not None:
            cluster.restart_component(kube.state, component)
            report.restarts.append(component)
        print(f"  kill {report.kills}/{kills}" + (f", restarted {component}" if component else ""),
              flush=True)  # fmt: skip


def _services(kube: Kube) -> list[dict[str, Any]]:
    found: dict[str, Any] = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL
    )
    return list(found["items"])


def _converged(kube: Kube, names: list[str]) -> bool:
    by_name = {s["metadata"]["name"]: s for s in _services(kube)}
    for name in names:
        status = (by_name.get(name) or {}).get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        expected = "auto" if _rejects(name) else "fp8"
        if conditions.get("Ready", {}).get("status") != "True":
            return False
        if (status.get("effective") or {}).get("kvCacheDtype") != expected:
            return False
    return True


def _rejects(name: str) -> bool:
    return int(name.split("-")[1]) % REJECT_EVERY == REJECT_EVERY - 1


def _check(kube: Kube, names: list[str]) -> list[str]:
    violations: list[str] = []
    counts: dict[tuple[str, str], int] = {}
    listings: list[tuple[str, Callable[..., Any]]] = [
        ("Deployment", kube.apps.list_namespaced_deployment),
        ("Service", kube.core.list_namespaced_service),
        ("ConfigMap", kube.core.list_namespaced_config_map),
        ("PodDisruptionBudget", k8s.PolicyV1Api(kube.api).list_namespaced_pod_disruption_budget),
    ]
    for kind, list_fn in listings:
        for item in list_fn(NAMESPACE, label_selector=MANAGED).items:
            owner = (item.metadata.labels or {}).get(keys.LABEL_INFERENCESERVICE, "?")
            counts[(kind, owner)] = counts.get((kind, owner), 0) + 1
    for name in names:
        for kind, _ in listings:
            if counts.get((kind, name), 0) != 1:
                violations.append(f"{name}: {counts.get((kind, name), 0)} {kind}s, not 1")
    for service in _services(kube):
        name = service["metadata"]["name"]
        attempts = ((service.get("status") or {}).get("fallback") or {}).get("attempts") or []
        moves = [(a["from"], a["to"], a["cause"]) for a in attempts]
        expected = [("requested", "auto", "Refused")] if _rejects(name) else []
        if moves != expected:
            violations.append(f"{name}: fallback attempts {moves}, expected {expected}")
        entered = [a["to"] for a in attempts]
        if len(entered) != len(set(entered)):
            violations.append(f"{name}: a rung entered twice: {entered}")
    return violations


if __name__ == "__main__":
    sys.exit(main())
