"""`make bench`: kvq on a fleet, with the figures a platform team asks for, against goals.

A local control plane with the `fleet` profile (500 KWOK GPU nodes in four pools), the
operator as a ServiceAccount (so the API server's own flow-control metrics count its
requests apart from the harness's), then InferenceServices in two waves: 100 (the
create-to-Deployment latency at 100 services), then the rest to 1,000 (time to all Ready).
Create-to-Deployment runs from the InferenceService's creation to its Deployment's, both
as the API server's audit log records them (one clock, microseconds); it is also printed as
the harness saw it (from the create request's answer to its watch delivering the
Deployment) and from the request sent. Five percent of them run on a simulated GPU that
refuses the fp8 KV cache, so kvq falls back at run time (the fallback latency). Then a
minute at rest: API requests per second that kvq makes
(apiserver_flowcontrol_dispatched_requests_total of its FlowSchema), its RSS and CPU.

    python -m e2e.bench.fleet [--services 1000] [--nodes 500] [--first-wave 100]

`--gitops` (make bench-gitops) arrives the way a GitOps sync does: every service
server-side applied in one wave, GITOPS_PARALLEL at a time (Argo CD's kubectl parallelism),
while a client lists the fleet every LIST_EVERY_S seconds (a UI or a sync's comparison).

Prints a table of figures and goals, writes them as JSON (--out), and exits 1 when a goal
is missed. Not a test: it measures; its figures go into the README.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from e2e.devcluster import cluster
from e2e.devcluster.clients import Kube, api_client
from e2e.devcluster.ports import allocate_ports
from e2e.devcluster.waits import wait_until
from kubernetes import client as k8s
from kubernetes import watch

from kvq.api import keys
from kvq.api.crd import crd_manifest
from kvq.api.keys import GROUP, PLURAL, VERSION

NAMESPACE = "bench"
OPERATOR_NAMESPACE = "kvq-system"
OPERATOR_ACCOUNT = "kvq"
FLOW_SCHEMA = "kvq-bench-operator"
REJECT_EVERY = 20  # one service in twenty runs on a GPU that refuses fp8 (5%)
RECONNECT_BACKOFF_S = 1.0
GITOPS_PARALLEL = 20  # Argo CD's default --kubectl-parallelism-limit
GITOPS_MANAGER = "argocd-controller"
LIST_EVERY_S = 10.0
REFUSAL = (
    "engine exited with code 1\nerror lines, most specific first:\n"
    "NotImplementedError: FP8 KV cache requires head_size divisible by 32 on CPU."
)

# The API server records the creation of each InferenceService and each Deployment of the
# bench's namespace.
AUDIT_POLICY = cluster.audit_policy(
    verbs=["create", "patch"],
    namespaces=[NAMESPACE],
    resources=[
        {"group": GROUP, "resources": [PLURAL]},
        {"group": "apps", "resources": ["deployments"]},
    ],
)

GOALS = {
    "all_ready_s": 120.0,
    "create_to_deployment_p95_at_100_s": 1.0,
    "fallback_p95_s": 10.0,
    "requests_per_s_at_rest": 1.0,
    "rss_mb": 300.0,
}


@dataclass
class Timeline:
    """When things happened (monotonic seconds), by InferenceService name."""

    requested: dict[str, float] = field(default_factory=dict)
    """The create request sent."""
    created: dict[str, float] = field(default_factory=dict)
    """The create request answered: the API server holds the object, kvq can see it."""
    deployed: dict[str, float] = field(default_factory=dict)
    available: dict[str, float] = field(default_factory=dict)
    """The Deployment's status first reports an available replica (the cluster's part done)."""
    ready: dict[str, float] = field(default_factory=dict)
    crashed: dict[str, float] = field(default_factory=dict)
    fell_back: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def mark(self, table: dict[str, float], name: str) -> None:
        with self.lock:
            table.setdefault(name, time.monotonic())


@dataclass
class Results:
    services: int
    nodes: int
    first_wave: int
    load_average: list[float]
    first_wave_ready_s: float | None = None
    create_to_deployment_at_100_s: dict[str, float] = field(default_factory=dict)
    """From the API server's audit log: the InferenceService created -> its Deployment."""
    seen_create_to_deployment_at_100_s: dict[str, float] = field(default_factory=dict)
    """As the harness saw it: the create request answered -> its watch delivering the
    Deployment (with the watch's delivery, which a loaded API server delays)."""
    request_to_deployment_at_100_s: dict[str, float] = field(default_factory=dict)
    """The same from the create request sent: with the API server's own create latency."""
    all_ready_s: float | None = None
    ready_count: int = 0
    create_to_deployment_at_1000_s: dict[str, float] = field(default_factory=dict)
    seen_create_to_deployment_at_1000_s: dict[str, float] = field(default_factory=dict)
    stages_at_1000_s: dict[str, dict[str, float]] = field(default_factory=dict)
    """The last wave (wave 2, or a GitOps sync's one wave) by stage, as the harness's watches
    saw it: kvq's (created -> Deployment, Deployment available -> Ready) and the cluster's
    (Deployment -> available), each with when its last service got there (from the wave's
    start): which one all-Ready waits on."""
    fallbacks: int = 0
    fallback_s: dict[str, float] = field(default_factory=dict)
    requests_during_waves: float = 0.0
    """kvq's requests the flow-control counter saw while the services rolled out: zero means
    the counter does not count kvq (wrong FlowSchema), and the figure at rest means nothing."""
    requests_per_s_at_rest: float | None = None
    cpu_percent_during_waves: float | None = None
    cpu_percent_at_rest: float | None = None
    operator_work: dict[str, float] = field(default_factory=dict)
    """Where the operator's time went during the waves (its own metrics)."""
    rss_mb: float | None = None
    cluster_start_s: float | None = None
    server_time: dict[str, Any] = field(default_factory=dict)
    """Where the control plane's time went during the waves (`_server_time`)."""
    verdicts: dict[str, bool] = field(default_factory=dict)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    results = Results(args.services, args.nodes, args.first_wave, list(os.getloadavg()))
    name = "bench"
    print(f"kvq bench: {args.services} InferenceServices on {args.nodes} GPU nodes", flush=True)
    began = time.monotonic()
    state = cluster.up(
        name=name, profile="fleet", nodes=args.nodes, timeout=900, audit_policy=AUDIT_POLICY
    )
    results.cluster_start_s = round(time.monotonic() - began, 1)
    print(f"  cluster up in {results.cluster_start_s} s ({args.nodes} nodes)", flush=True)
    api = api_client(state.kubeconfig)
    kube = Kube(state, api)
    try:
        _prepare(kube)
        kubeconfig = _operator_kubeconfig(kube, Path(state.run_dir))
        operator_log = Path(state.run_dir) / "operator.log"
        with _operator(kubeconfig, operator_log, args.workers) as operator:
            before_waves = _dispatched(kube)
            cpu_before, began = _cpu_seconds(operator.process.pid), time.monotonic()
            server_before = _server_sample(kube, operator)
            _run_waves(kube, args, results, cluster.audit_log(state))
            results.server_time = _server_time(server_before, _server_sample(kube, operator))
            results.requests_during_waves = _dispatched(kube) - before_waves
            used = _cpu_seconds(operator.process.pid) - cpu_before
            results.cpu_percent_during_waves = round(100 * used / (time.monotonic() - began), 1)
            results.operator_work = _operator_work(_scrape(operator.metrics_port))
            _measure_rest(kube, operator, args.rest, results)
    finally:
        api.close()  # type: ignore[no-untyped-call]
        if not args.keep:
            cluster.down(name)
    _judge(results)
    _print(results)
    if args.out:
        Path(args.out).write_text(json.dumps(asdict(results), indent=2))
    return 0 if all(results.verdicts.values()) else 1


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make bench", description=__doc__.split("\n")[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--first-wave", type=int, default=100)
    parser.add_argument("--rest", type=float, default=60.0, help="seconds measured at rest")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds per wave")
    parser.add_argument("--out", default="", help="write the figures as JSON here")
    parser.add_argument("--workers", type=int, default=0, help="kvq run --workers (0: default)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.add_argument(
        "--gitops",
        action="store_true",
        help="every service server-side applied in one wave while a client lists them",
    )
    args = parser.parse_args(argv)
    if args.gitops:
        args.first_wave = args.services
    return args


def _prepare(kube: Kube) -> None:
    from kubernetes.dynamic import DynamicClient

    dynamic = DynamicClient(kube.api)  # type: ignore[no-untyped-call]
    for body in (crd_manifest(), _flow_schema()):
        resource = dynamic.resources.get(api_version=body["apiVersion"], kind=body["kind"])
        dynamic.server_side_apply(resource, body=body, field_manager="kvq-bench")
    for namespace in (NAMESPACE, OPERATOR_NAMESPACE):
        kube.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    wait_until(
        lambda: kube.custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL),
        what="InferenceServices to be served",
        timeout=60,
        retry_on=(k8s.exceptions.ApiException,),
    )


def _flow_schema() -> dict[str, Any]:
    """Puts the operator's requests in a flow schema of their own: the API server then
    counts them in apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}."""
    return {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": FLOW_SCHEMA},
        "spec": {
            "matchingPrecedence": 500,
            "priorityLevelConfiguration": {"name": "workload-high"},
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [
                {
                    "subjects": [
                        {
                            "kind": "ServiceAccount",
                            "serviceAccount": {
                                "name": OPERATOR_ACCOUNT,
                                "namespace": OPERATOR_NAMESPACE,
                            },
                        }
                    ],
                    "resourceRules": [
                        {
                            "verbs": ["*"],
                            "apiGroups": ["*"],
                            "resources": ["*"],
                            "clusterScope": True,
                            "namespaces": ["*"],
                        }
                    ],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                }
            ],
        },
    }


def _operator_kubeconfig(kube: Kube, run_dir: Path) -> Path:
    """A ServiceAccount token for the operator (cluster-admin: RBAC is tested elsewhere)."""
    account = k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name=OPERATOR_ACCOUNT))
    kube.core.create_namespaced_service_account(OPERATOR_NAMESPACE, account)
    kube.rbac.create_cluster_role_binding(
        k8s.V1ClusterRoleBinding(
            metadata=k8s.V1ObjectMeta(name="kvq-bench-operator"),
            role_ref=k8s.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="cluster-admin"
            ),
            subjects=[
                k8s.RbacV1Subject(
                    kind="ServiceAccount", name=OPERATOR_ACCOUNT, namespace=OPERATOR_NAMESPACE
                )
            ],
        )
    )
    request = k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=6 * 3600)
    )
    token = kube.core.create_namespaced_service_account_token(
        OPERATOR_ACCOUNT, OPERATOR_NAMESPACE, request
    ).status.token
    admin = yaml.safe_load(Path(kube.state.kubeconfig).read_text())
    the_cluster = admin["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [the_cluster],
        "users": [{"name": "kvq", "user": {"token": token}}],
        "contexts": [{"name": "kvq", "context": {"cluster": the_cluster["name"], "user": "kvq"}}],
        "current-context": "kvq",
    }
    path = run_dir / "kubeconfigs" / "kvq-operator.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass
class Operator:
    process: subprocess.Popen[bytes]
    metrics_port: int
    log: Path


@contextmanager
def _operator(kubeconfig: Path, log: Path, workers: int) -> Iterator[Operator]:
    port = allocate_ports(["metrics"])["metrics"]
    argv = [
        sys.executable,
        "-m",
        "kvq.cli",
        "run",
        "--all-namespaces",
        "--standalone",
        f"--metrics-port={port}",
        *([f"--workers={workers}"] if workers else []),
    ]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    with log.open("ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    operator = Operator(process, port, log)
    try:
        wait_until(lambda: _scrape(port), what="the operator's /metrics", timeout=120,
                   retry_on=(OSError,))  # fmt: skip
        yield operator
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def _run_waves(kube: Kube, args: argparse.Namespace, results: Results, audit: Path) -> None:
    timeline = Timeline()
    stop = threading.Event()
    watchers = [
        threading.Thread(target=fn, args=(kube, timeline, stop), daemon=True)
        for fn in (_watch_services, _watch_deployments, _watch_pods)
    ]
    for thread in watchers:
        thread.start()
    # Latencies are a running operator's: one service first, waited for, so the operator's
    # start (API discovery, initial lists of every watched kind) is not in the figures.
    _create(kube, ["warmup-0000"], timeline)
    _wait_ready(timeline, ["warmup-0000"], time.monotonic(), args.deadline)
    names = [f"svc-{i:04d}" for i in range(args.services)]
    first, rest = names[: args.first_wave], names[args.first_wave :]

    began = time.monotonic()
    if args.gitops:
        lister = threading.Thread(target=_list_every, args=(kube, stop), daemon=True)
        lister.start()
        _create(kube, first, timeline, apply=True)
    else:
        _create(kube, first, timeline)
    results.first_wave_ready_s = _wait_ready(timeline, first, began, args.deadline)
    stored = _stored(audit)
    results.create_to_deployment_at_100_s = _latency(stored.services, stored.deployments, first)
    results.seen_create_to_deployment_at_100_s = _latency(
        timeline.created, timeline.deployed, first
    )
    results.request_to_deployment_at_100_s = _latency(timeline.requested, timeline.deployed, first)
    print(f"  wave 1: {len(first)} services, all Ready in {results.first_wave_ready_s} s",
          flush=True)  # fmt: skip

    if rest:
        began = time.monotonic()
        _create(kube, rest, timeline)
        results.all_ready_s = _wait_ready(timeline, names, began, args.deadline)
    else:  # the whole fleet was the first wave (--first-wave equal to --services)
        results.all_ready_s = results.first_wave_ready_s
    results.ready_count = sum(1 for n in names if n in timeline.ready)
    stored = _stored(audit)
    results.create_to_deployment_at_1000_s = _latency(stored.services, stored.deployments, rest)
    results.seen_create_to_deployment_at_1000_s = _latency(
        timeline.created, timeline.deployed, rest
    )
    # The last wave by stage: wave 2, or the GitOps sync's single wave.
    last, offset = (rest, len(first)) if rest else (first, 0)
    steady = [n for i, n in enumerate(last) if (i + offset) % REJECT_EVERY != REJECT_EVERY - 1]
    results.stages_at_1000_s = _stages(timeline, steady, began)
    rejecting = [n for i, n in enumerate(names) if i % REJECT_EVERY == REJECT_EVERY - 1]
    results.fallbacks = sum(1 for n in rejecting if n in timeline.fell_back)
    results.fallback_s = _latency(timeline.crashed, timeline.fell_back, rejecting)
    if rest:
        print(f"  wave 2: {len(rest)} more, {results.ready_count}/{len(names)} Ready in "
              f"{results.all_ready_s} s", flush=True)  # fmt: skip
    stop.set()


def _create(kube: Kube, names: list[str], timeline: Timeline, apply: bool = False) -> None:
    """Each service created (16 at a time), or with `apply` server-side applied as a
    GitOps controller does (GITOPS_PARALLEL at a time)."""
    from kubernetes.dynamic import DynamicClient

    dynamic = DynamicClient(kube.api) if apply else None  # type: ignore[no-untyped-call]
    resource = None
    if dynamic is not None:
        resource = dynamic.resources.get(api_version=f"{GROUP}/{VERSION}", kind="InferenceService")

    def one(name: str) -> None:
        index = int(name.split("-")[1])
        spec: dict[str, Any] = {
            "model": {"uri": "hf://meta-llama/Meta-Llama-3-8B"},
            "kvCache": {"dtype": "fp8"},
            "memory": {"maxModelLen": 8192},
        }
        if index % REJECT_EVERY == REJECT_EVERY - 1:
            spec["engine"] = {
                "env": [
                    {"name": "KVQ_SIM_REJECT_KV_CACHE_DTYPE", "value": "fp8"},
                    {"name": "KVQ_SIM_TERMINATION_MESSAGE", "value": REFUSAL},
                ]
            }
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "InferenceService",
            "metadata": {"name": name},
            "spec": spec,
        }
        timeline.mark(timeline.requested, name)
        if dynamic is not None:
            dynamic.server_side_apply(
                resource,
                body={**body, "metadata": {"name": name, "namespace": NAMESPACE}},
                namespace=NAMESPACE,
                field_manager=GITOPS_MANAGER,
            )
        else:
            kube.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
        timeline.mark(timeline.created, name)

    with ThreadPoolExecutor(GITOPS_PARALLEL if apply else 16) as pool:
        list(pool.map(one, names))


def _list_every(kube: Kube, stop: threading.Event) -> None:
    """The whole fleet listed every LIST_EVERY_S seconds, as a GitOps UI or sync does."""
    while not stop.wait(LIST_EVERY_S):
        try:
            kube.custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
        except k8s.exceptions.ApiException:
            continue


def _wait_ready(
    timeline: Timeline, names: list[str], began: float, deadline: float
) -> float | None:
    try:
        wait_until(
            lambda: all(n in timeline.ready for n in names),
            what=f"{len(names)} InferenceServices Ready",
            timeout=deadline,
            interval=0.5,
        )
    except Exception:  # the figures so far are still worth printing
        return None
    return round(max(timeline.ready[n] for n in names) - began, 1)


def _watch_services(kube: Kube, timeline: Timeline, stop: threading.Event) -> None:
    for event in _stream(kube.custom.list_namespaced_custom_object, stop,
                         GROUP, VERSION, NAMESPACE, PLURAL):  # fmt: skip
        obj = event["object"]
        conditions = (obj.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            timeline.mark(timeline.ready, obj["metadata"]["name"])


def _watch_deployments(kube: Kube, timeline: Timeline, stop: threading.Event) -> None:
    for event in _stream(kube.apps.list_namespaced_deployment, stop, NAMESPACE):
        obj = event["object"]
        name = obj["metadata"]["name"]
        timeline.mark(timeline.deployed, name)
        if (obj.get("status") or {}).get("availableReplicas"):
            timeline.mark(timeline.available, name)
        template = obj.get("spec", {}).get("template", {})
        annotations = template.get("metadata", {}).get("annotations") or {}
        if annotations.get(keys.ANNOTATION_RUNG) == "auto":
            timeline.mark(timeline.fell_back, name)


def _watch_pods(kube: Kube, timeline: Timeline, stop: threading.Event) -> None:
    for event in _stream(kube.core.list_namespaced_pod, stop, NAMESPACE):
        obj = event["object"]
        owner = (obj["metadata"].get("labels") or {}).get(keys.LABEL_INFERENCESERVICE)
        for status in (obj.get("status") or {}).get("containerStatuses") or []:
            if owner and (status.get("lastState") or {}).get("terminated"):
                timeline.mark(timeline.crashed, owner)


def _stream(list_fn: Any, stop: threading.Event, *args: Any) -> Iterator[dict[str, Any]]:
    while not stop.is_set():
        stream = watch.Watch()
        try:
            # Events as parsed JSON: the typed models cost the harness seconds of CPU per
            # wave (each event parsed, dumped and parsed again) on the cores kvq shares.
            yield from stream.stream(list_fn, *args, timeout_seconds=60, deserialize=False)
        except Exception:  # a dropped watch is reopened; the bench does not judge it
            stop.wait(RECONNECT_BACKOFF_S)


@dataclass(frozen=True)
class Stored:
    """When the API server created each object (epoch seconds), by name."""

    services: dict[str, float]
    deployments: dict[str, float]


def _stored(audit: Path) -> Stored:
    """The creations in the API server's audit log (AUDIT_POLICY): an InferenceService's
    create and the apply that created its Deployment, each the moment its response was
    complete (201: the object is in etcd)."""
    stored = Stored({}, {})
    tables = {PLURAL: stored.services, "deployments": stored.deployments}
    for line in audit.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        table = tables.get(ref.get("resource"))
        created = (event.get("responseStatus") or {}).get("code") == 201
        if table is None or ref.get("subresource") or not created or not ref.get("name"):
            continue
        if event.get("stage") == "ResponseComplete":
            when = datetime.fromisoformat(event["stageTimestamp"]).timestamp()
            table.setdefault(ref["name"], when)
    return stored


def _latency(start: dict[str, float], end: dict[str, float], names: list[str]) -> dict[str, float]:
    values = sorted(end[n] - start[n] for n in names if n in start and n in end)
    if not values:
        return {}
    return {
        "count": len(values),
        "p50": round(statistics.median(values), 3),
        "p95": round(values[min(len(values) - 1, int(0.95 * len(values)))], 3),
        "max": round(values[-1], 3),
    }


def _stages(timeline: Timeline, names: list[str], began: float) -> dict[str, dict[str, float]]:
    """Each stage's latencies and when its last service finished it (services that do not
    fall back: a fallback's second Deployment is not a stage of the first)."""
    steps = (
        ("created -> Deployment (kvq)", timeline.created, timeline.deployed),
        ("Deployment -> available (cluster)", timeline.deployed, timeline.available),
        ("available -> Ready (kvq)", timeline.available, timeline.ready),
    )
    stages = {}
    for what, start, end in steps:
        stage = _latency(start, end, names)
        done = [end[n] for n in names if n in end]
        if stage and done:
            stage["last_s"] = round(max(done) - began, 1)
        stages[what] = stage
    return stages


def _measure_rest(kube: Kube, operator: Operator, seconds: float, results: Results) -> None:
    """Wait for the operator to settle, then count its requests, CPU and memory."""

    def reconciles() -> float:
        return _sample(_scrape(operator.metrics_port), "kvq_reconciles_total")

    seen: list[float] = []

    def quiet() -> bool:
        seen.append(reconciles())
        return len(seen) >= 10 and seen[-1] == seen[-10]

    wait_until(quiet, what="the operator to settle", timeout=600, interval=1.0)
    requests_before = _dispatched(kube)
    cpu_before = _cpu_seconds(operator.process.pid)
    began = time.monotonic()
    wait_until(lambda: time.monotonic() - began >= seconds, what="the rest window",
               timeout=seconds + 30, interval=1.0)  # fmt: skip
    elapsed = time.monotonic() - began
    results.requests_per_s_at_rest = round((_dispatched(kube) - requests_before) / elapsed, 3)
    cpu = _cpu_seconds(operator.process.pid) - cpu_before
    results.cpu_percent_at_rest = round(100 * cpu / elapsed, 2)
    results.rss_mb = round(_rss_bytes(operator.process.pid) / 1e6, 1)


def _operator_work(text: str) -> dict[str, float]:
    """Reconciles, their queue wait and decision time, writes (API calls that changed
    something): from kvq's /metrics."""

    def mean(name: str, scale: float = 1.0, **labels: str) -> float:
        count = _sample(text, f"{name}_count", **labels)
        return round(scale * _sample(text, f"{name}_sum", **labels) / count, 3) if count else 0.0

    return {
        "reconciles": _sample(text, "kvq_reconciles_total"),
        "queue_wait_mean_s": mean("kvq_queue_wait_seconds"),
        "decision_mean_ms": mean("kvq_decision_seconds", 1000),
        "work_mean_s": mean("kvq_work_seconds"),
        **{
            f"write_wait_mean_s_urgency_{u}": mean("kvq_write_wait_seconds", urgency=str(u))
            for u in range(3)
        },
        "writes": _sample(text, "kvq_writes_total"),
    }


def _dispatched(kube: Kube) -> float:
    text = cluster.admin_rest(kube.state).get_text("/metrics")
    return _sample(text, "apiserver_flowcontrol_dispatched_requests_total",
                   flow_schema=FLOW_SCHEMA)  # fmt: skip


@dataclass(frozen=True)
class ServerSample:
    """The API server's /metrics and each process's CPU seconds, at one moment."""

    metrics: str
    cpu_s: dict[str, float]


def _server_sample(kube: Kube, operator: Operator) -> ServerSample:
    pids = {p.name: p.pid for p in kube.state.processes}
    pids["kvq"] = operator.process.pid
    pids["harness"] = os.getpid()
    cpu = {}
    for name, pid in pids.items():
        try:
            cpu[name] = _cpu_seconds(pid)
        except OSError:  # an add-on that has exited counts nothing
            continue
    return ServerSample(cluster.admin_rest(kube.state).get_text("/metrics"), cpu)


# Who the API server served, by its own flow-control metrics (the default FlowSchemas name
# the clients: the controller manager's controllers run as kube-system ServiceAccounts).
SERVER_SERIES = {
    "flow": ("apiserver_flowcontrol_request_execution_seconds", ("flow_schema",)),
    "request": ("apiserver_request_duration_seconds", ("verb", "resource")),
    "watch_events": ("apiserver_watch_events_sizes", ("kind",)),
}


def _server_time(before: ServerSample, after: ServerSample) -> dict[str, Any]:
    """The waves' share of the control plane: CPU seconds per process, and the API
    server's time by flow schema and by request, and the watch events it sent by kind
    (count and megabytes), each the difference of two samples, largest first."""

    def sums(text: str, series: str, by: tuple[str, ...]) -> dict[str, tuple[float, float]]:
        from prometheus_client.parser import text_string_to_metric_families

        found: dict[str, list[float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in (f"{series}_sum", f"{series}_count"):
                    continue
                key = " ".join(sample.labels.get(label, "") for label in by)
                slot = found.setdefault(key, [0.0, 0.0])
                slot[0 if sample.name.endswith("_sum") else 1] += sample.value
        return {k: (v[0], v[1]) for k, v in found.items()}

    report: dict[str, Any] = {
        "cpu_s": {
            name: round(after.cpu_s[name] - spent, 1)
            for name, spent in sorted(before.cpu_s.items(), key=lambda kv: kv[0])
            if name in after.cpu_s
        }
    }
    for what, (series, by) in SERVER_SERIES.items():
        old = sums(before.metrics, series, by)
        new = sums(after.metrics, series, by)
        rows = []
        for key, (total, count) in new.items():
            total0, count0 = old.get(key, (0.0, 0.0))
            if count - count0 > 0:
                rows.append((key, total - total0, count - count0))
        rows.sort(key=lambda row: -row[1])
        scale = 1e-6 if what == "watch_events" else 1.0  # bytes -> MB
        report[what] = [[key, round(total * scale, 1), int(count)] for key, total, count in rows]
    return report


def _sample(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _judge(results: Results) -> None:
    # Every service of the first wave counted: one missing from the audit log is no pass.
    whole = results.create_to_deployment_at_100_s.get("count") == results.first_wave
    at_100 = results.create_to_deployment_at_100_s.get("p95") if whole else None
    fallback = results.fallback_s.get("p95")
    results.verdicts = {
        "all_ready_s": results.all_ready_s is not None
        and results.all_ready_s <= GOALS["all_ready_s"],
        "create_to_deployment_p95_at_100_s": at_100 is not None
        and at_100 <= GOALS["create_to_deployment_p95_at_100_s"],
        "fallback_p95_s": fallback is not None and fallback <= GOALS["fallback_p95_s"],
        "requests_per_s_at_rest": results.requests_per_s_at_rest is not None
        and results.requests_during_waves > 0
        and results.requests_per_s_at_rest <= GOALS["requests_per_s_at_rest"],
        "rss_mb": results.rss_mb is not None and results.rss_mb <= GOALS["rss_mb"],
    }


def _second_wave(results: Results) -> str:
    more = results.services - results.first_wave
    return f"wave 2 of {more}" if more else "from the first wave's apply: no wave 2"


def _print(results: Results) -> None:
    def mark(key: str) -> str:
        return "PASS" if results.verdicts[key] else "MISS"

    load = ", ".join(f"{x:.1f}" for x in results.load_average)
    rows = [
        ("apply -> all Ready", f"{results.all_ready_s} s ({results.ready_count}/"
         f"{results.services} Ready; {_second_wave(results)})",
         f"<= {GOALS['all_ready_s']:.0f} s", mark("all_ready_s")),
        ("create -> Deployment at 100", _fmt(results.create_to_deployment_at_100_s),
         f"p95 < {GOALS['create_to_deployment_p95_at_100_s']:.0f} s",
         mark("create_to_deployment_p95_at_100_s")),
        ("  as the harness saw it", _fmt(results.seen_create_to_deployment_at_100_s), "", ""),
        ("  from the create request sent", _fmt(results.request_to_deployment_at_100_s),
         "", ""),
        ("create -> Deployment at 1000", _fmt(results.create_to_deployment_at_1000_s), "", ""),
        ("  as the harness saw it", _fmt(results.seen_create_to_deployment_at_1000_s), "", ""),
        ("fallback (crash seen -> auto Deployment)",
         f"{_fmt(results.fallback_s)} ({results.fallbacks} fallbacks)",
         f"p95 < {GOALS['fallback_p95_s']:.0f} s", mark("fallback_p95_s")),
        ("kvq API requests at rest", f"{results.requests_per_s_at_rest}/s "
         f"({results.requests_during_waves:.0f} counted during the waves)",
         f"< {GOALS['requests_per_s_at_rest']:.0f}/s", mark("requests_per_s_at_rest")),
        ("operator RSS at rest", f"{results.rss_mb} MB", f"< {GOALS['rss_mb']:.0f} MB",
         mark("rss_mb")),
        ("operator CPU at rest", f"{results.cpu_percent_at_rest}% of a core "
         f"({results.cpu_percent_during_waves}% during the waves)", "", ""),
    ]  # fmt: skip
    for what, stage in results.stages_at_1000_s.items():
        last = f"; the last at {stage['last_s']} s" if "last_s" in stage else ""
        rows.append((f"  last wave: {what}", _fmt(stage) + last, "", ""))
    work = results.operator_work
    if work:
        rows.append(
            (
                "operator during the waves",
                f"{work['reconciles']:.0f} reconciles, {work['writes']:.0f} writes; means: "
                f"in the queue {work['queue_wait_mean_s']} s, a pass "
                f"{work['work_mean_s']} s (decide {work['decision_mean_ms']} ms), "
                f"a write's wait for a writer "
                f"{work['write_wait_mean_s_urgency_0']}/{work['write_wait_mean_s_urgency_1']}/"
                f"{work['write_wait_mean_s_urgency_2']} s (crash/change/routine)",
                "",
                "",
            )
        )
    server = results.server_time
    if server:
        cpu = ", ".join(f"{name} {spent} s" for name, spent in server["cpu_s"].items())
        rows.append(("control plane CPU during the waves", cpu, "", ""))
        for what, unit, top in (("flow", "s", 6), ("request", "s", 10), ("watch_events", "MB", 8)):
            listed = "; ".join(f"{k or '-'} {v} {unit} ({n})" for k, v, n in server[what][:top])
            rows.append((f"API server by {what}", listed, "", ""))
    print(f"\nkvq bench: {results.services} services, {results.nodes} nodes "
          f"(cluster up in {results.cluster_start_s} s; load average at start {load})")  # fmt: skip
    width = max(len(r[0]) for r in rows)
    for what, value, goal, verdict in rows:
        print(f"  {what:<{width}}  {value:<48} {goal:<14} {verdict}")


def _fmt(latency: dict[str, float]) -> str:
    if not latency:
        return "n/a"
    return (
        f"p50 {latency['p50']} s, p95 {latency['p95']} s, max {latency['max']} s"
        f" ({latency['count']:.0f} services)"
    )


if __name__ == "__main__":
    sys.exit(main())
