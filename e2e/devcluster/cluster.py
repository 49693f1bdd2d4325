"""Start, inspect and stop one named local control plane.

etcd -> kube-apiserver -> (controller-manager, scheduler, KWOK) -> profile Nodes -> Ready.
Everything listens on 127.0.0.1 with TLS; the state (ports, pids, kubeconfigs) is a JSON
file in the run dir, so `down` and `status` work from another process.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from e2e.devcluster import pki as pki_ids
from e2e.devcluster.binaries import Binaries, ensure_binaries
from e2e.devcluster.kubeconfig import write_kubeconfig
from e2e.devcluster.paths import e2e_dir, run_dir
from e2e.devcluster.pki import KeyPair, Pki, write_pki
from e2e.devcluster.ports import allocate_ports
from e2e.devcluster.processes import Running, is_alive, start_process, stop_process
from e2e.devcluster.profiles import (
    KWOK_NODE_ANNOTATION,
    load_profile,
    node_manifests,
    scale_profile,
)
from e2e.devcluster.rest import Rest, get_ok, tls_context
from e2e.devcluster.waits import WaitTimeoutError, wait_until

PORT_NAMES = ["etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok"]
STATE_FILE = "state.json"
AUDIT_LOG = "kube-apiserver-audit.log"
# The node IP KWOK writes into status (pod IPs come from the profile). Loopback on purpose:
# anything that ever dials it (kubectl logs, a metrics scrape) stays on this machine.
NODE_IP = "127.0.0.1"
NODE_CREATE_WORKERS = 8
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
HPA_SYNC_PERIOD = "2s"
NODE_LEASE_SECONDS = 120
CONTROLLER_QPS = 100


@dataclass
class ClusterState:
    name: str
    profile: str
    run_dir: str
    server: str
    kubeconfig: str
    viewer_kubeconfig: str
    ports: dict[str, int]
    processes: list[Running] = field(default_factory=list)
    startup_seconds: float = 0.0
    # Seconds from the start of `up` to each milestone, to see where start-up time goes.
    milestones: dict[str, float] = field(default_factory=dict)
    # Add-ons started on this cluster (e2e.devcluster.addons): name -> what each exposes.
    addons: dict[str, dict[str, str]] = field(default_factory=dict)

    def save(self) -> None:
        Path(self.run_dir, STATE_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, name: str) -> ClusterState | None:
        path = run_dir(name) / STATE_FILE
        if not path.is_file():
            return None
        raw = json.loads(path.read_text())
        raw["processes"] = [
            Running(**{**p, "argv": tuple(p.get("argv", ()))}) for p in raw["processes"]
        ]
        return cls(**raw)


class ClusterStartError(RuntimeError):
    """The cluster did not start; the message is one line that names the log to read."""


def up(
    name: str = "dev",
    profile: str = "hetero",
    kubeconfig: Path | None = None,
    timeout: float = 120.0,
    binaries: Binaries | None = None,
    nodes: int | None = None,
    audit_policy: Mapping[str, Any] | None = None,
) -> ClusterState:
    """Start a fresh cluster (stopping an earlier one of the same name) and wait until usable.

    Missing binaries are built first, under their own budget: `timeout` counts from the end
    of the build. `nodes` scales the profile's pools to that many nodes in all.
    `audit_policy` (an audit.k8s.io/v1 Policy) makes the API server record the requests it
    selects in `audit_log(state)`. Raises ClusterStartError (one line naming the log) when
    the start fails.
    """
    chosen = load_profile(profile)
    if nodes is not None:
        chosen = scale_profile(chosen, nodes)
    bins = binaries or ensure_binaries()
    began = time.monotonic()
    down(name)
    root = run_dir(name)
    for stale in ("etcd-data", "pki", "logs"):
        shutil.rmtree(root / stale, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)

    ports = allocate_ports(PORT_NAMES)
    pki = write_pki(root / "pki")
    server = f"https://127.0.0.1:{ports['apiserver']}"
    configs = {
        identity.name: write_kubeconfig(
            root / "kubeconfigs" / f"{identity.name}.kubeconfig",
            server=server,
            ca_cert=pki.ca.cert,
            client=pki.client(identity),
            user=identity.name,
        )
        for identity in pki_ids.CLIENT_IDENTITIES
    }
    admin = configs[pki_ids.ADMIN.name]
    if kubeconfig is not None:
        shutil.copyfile(admin, kubeconfig)
        kubeconfig.chmod(0o600)
        admin = kubeconfig
    state = ClusterState(
        name=name,
        profile=chosen.name,
        run_dir=str(root),
        server=server,
        kubeconfig=str(admin),
        viewer_kubeconfig=str(configs[pki_ids.VIEWER.name]),
        ports=ports,
    )
    deadline = began + timeout

    def remaining() -> float:
        return max(deadline - time.monotonic(), 1.0)

    def reached(milestone: str) -> None:
        state.milestones[milestone] = round(time.monotonic() - began, 1)

    logs = root / "logs"
    admin_pair = pki.client(pki_ids.ADMIN)
    rest = Rest(server, tls_context(pki.ca.cert, admin_pair.cert, admin_pair.key))

    def launch(component: str, argv: list[str]) -> None:
        launch_component(state, component, argv)

    try:
        launch("etcd", _etcd_args(bins, root, ports, pki))
        etcd_health = f"https://127.0.0.1:{ports['etcd']}/health"
        _wait_https(etcd_health, pki, pki.etcd_server, remaining(), state, "etcd")
        reached("etcd healthy")
        audit = _audit_args(root, audit_policy) if audit_policy is not None else []
        launch("kube-apiserver", [*_apiserver_args(bins, ports, pki), *audit])
        _wait_https(f"{server}/readyz", pki, admin_pair, remaining(), state, "kube-apiserver")
        reached("kube-apiserver ready")
        launch("kube-controller-manager", _controller_manager_args(bins, ports, pki, configs))
        launch("kube-scheduler", _scheduler_args(bins, ports, pki, configs))
        kwok_config = _write_kwok_config(root)
        launch("kwok", _kwok_args(bins, ports, configs, kwok_config, chosen.pod_cidr))
        manifests = node_manifests(chosen)
        _create_nodes(rest, manifests, logs / "kube-apiserver.log")
        _wait_ready(rest, len(manifests), remaining(), state, reached)
    except BaseException:
        _stop_all(state)
        raise
    state.startup_seconds = round(time.monotonic() - began, 1)
    state.save()
    return state


def restart_component(state: ClusterState, component: str, timeout: float = 60.0) -> None:
    """Stop one component (SIGTERM) and start it again with the same arguments, as a
    restart of that process on a real control plane; waits until the API answers again."""
    index, proc = next((i, p) for i, p in enumerate(state.processes) if p.name == component)
    stop_process(proc)
    state.processes[index] = start_process(component, list(proc.argv), Path(proc.log))
    state.save()
    rest = admin_rest(state)
    wait_until(
        lambda: rest.get_text("/readyz"),
        what=f"the API server to answer after restarting {component}",
        timeout=timeout,
        retry_on=(OSError,),
    )


def down(name: str = "dev") -> bool:
    """Stop every process of the named cluster; True when something was running."""
    state = ClusterState.load(name)
    if state is None:
        return False
    was_running = any(is_alive(p) for p in state.processes)
    _stop_all(state)
    return was_running


def status(name: str = "dev") -> dict[str, Any]:
    """Which components are alive, and whether the API server answers /readyz."""
    state = ClusterState.load(name)
    if state is None:
        return {"name": name, "running": False}
    alive = {p.name: is_alive(p) for p in state.processes}
    ready = False
    if alive.get("kube-apiserver"):
        pki_dir = Path(state.run_dir) / "pki"
        ctx = _tls_context(pki_dir / "ca.crt", _client_pair(pki_dir, pki_ids.ADMIN))
        ready = get_ok(f"{state.server}/readyz", ctx)
    return {
        "name": name,
        "running": all(alive.values()) and bool(alive),
        "ready": ready,
        "profile": state.profile,
        "server": state.server,
        "kubeconfig": state.kubeconfig,
        "viewer_kubeconfig": state.viewer_kubeconfig,
        "components": alive,
        "logs": str(Path(state.run_dir) / "logs"),
        "startup_seconds": state.startup_seconds,
    }


def launch_component(
    state: ClusterState, component: str, argv: list[str], env: dict[str, str] | None = None
) -> Running:
    """Start one process of the cluster (logs/<component>.log); `down` will stop it."""
    log = Path(state.run_dir) / "logs" / f"{component}.log"
    running = start_process(component, argv, log, env=env)
    state.processes.append(running)
    state.save()
    return running


def wait_alive(
    state: ClusterState,
    probe: Callable[[], object],
    what: str,
    timeout: float,
    suspect: str,
    interval: float = 0.1,
) -> None:
    """Until `probe()` holds; ClusterStartError (one line naming the log) when a component
    of the cluster dies meanwhile or the deadline passes (naming `suspect`'s log)."""
    _wait_alive(probe, what, timeout, state, suspect, interval)


def admin_rest(state: ClusterState) -> Rest:
    """The harness's REST client for a running cluster, as its admin."""
    pki_dir = Path(state.run_dir) / "pki"
    return Rest(
        state.server, _tls_context(pki_dir / "ca.crt", _client_pair(pki_dir, pki_ids.ADMIN))
    )


def _stop_all(state: ClusterState) -> None:
    # Reverse start order: KWOK and the controllers before the API server, etcd last.
    for proc in reversed(state.processes):
        stop_process(proc)
    state.processes = []
    if Path(state.run_dir).is_dir():
        state.save()


def _etcd_args(bins: Binaries, root: Path, ports: dict[str, int], pki: Pki) -> list[str]:
    client = f"https://127.0.0.1:{ports['etcd']}"
    peer = f"http://127.0.0.1:{ports['etcd-peer']}"
    return [
        str(bins.etcd),
        "--name=kvq",
        f"--data-dir={root / 'etcd-data'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=kvq={peer}",
        f"--cert-file={pki.etcd_server.cert}",
        f"--key-file={pki.etcd_server.key}",
        f"--trusted-ca-file={pki.ca.cert}",
        "--client-cert-auth=true",
        # Throwaway data: skipping fsync makes a 2-core machine's API server several times faster.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def _apiserver_args(bins: Binaries, ports: dict[str, int], pki: Pki) -> list[str]:
    etcd_client = pki.client(pki_ids.APISERVER_ETCD_CLIENT)
    return [
        str(bins.kube_apiserver),
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports['apiserver']}",
        f"--etcd-servers=https://127.0.0.1:{ports['etcd']}",
        f"--etcd-cafile={pki.ca.cert}",
        f"--etcd-certfile={etcd_client.cert}",
        f"--etcd-keyfile={etcd_client.key}",
        f"--tls-cert-file={pki.apiserver.cert}",
        f"--tls-private-key-file={pki.apiserver.key}",
        f"--client-ca-file={pki.ca.cert}",
        "--authorization-mode=Node,RBAC",
        "--anonymous-auth=false",
        f"--service-account-key-file={pki.service_account_pub}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-cluster-ip-range={pki_ids.SERVICE_CIDR}",
        "--enable-admission-plugins=NodeRestriction",
        # API aggregation (extension API servers such as KEDA's metrics server): the
        # aggregator proves itself with the front-proxy client certificate.
        f"--requestheader-client-ca-file={pki.front_proxy_ca.cert}",
        f"--requestheader-allowed-names={pki_ids.FRONT_PROXY_CLIENT.name}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
        f"--proxy-client-key-file={pki.front_proxy_client.key}",
        "--allow-privileged=true",
        # No kubelets reach this API server's Service; loopback is not a valid endpoint anyway.
        "--endpoint-reconciler-type=none",
        "--profiling=" + ("true" if os.environ.get("KVQ_DEV_PROFILING") else "false"),
        "--v=1",
    ]


def audit_policy(**selected: Any) -> dict[str, Any]:
    """An audit policy that records, at Metadata level and once each (when answered), the
    requests `selected` names (an audit.k8s.io/v1 rule's fields: verbs, users, namespaces,
    resources), and nothing else: the other requests cost the API server no audit work."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", **selected}, {"level": "None"}],
    }


def audit_log(state: ClusterState) -> Path:
    """Where the API server writes the audit events its policy selects (JSON lines)."""
    return Path(state.run_dir) / "logs" / AUDIT_LOG


def _audit_args(root: Path, policy: Mapping[str, Any]) -> list[str]:
    path = root / "audit-policy.yaml"
    path.write_text(yaml.safe_dump(dict(policy)))
    return [
        f"--audit-policy-file={path}",
        f"--audit-log-path={root / 'logs' / AUDIT_LOG}",
        "--audit-log-format=json",
        # Each event written as its request completes: the file is whole when it returns.
        "--audit-log-mode=blocking",
    ]


def _serving_args(binary: Path, kubeconfig: Path, port: int, pki: Pki) -> list[str]:
    """What controller-manager and scheduler share: identity, loopback TLS, one instance."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={pki.apiserver.cert}",
        f"--tls-private-key-file={pki.apiserver.key}",
        "--leader-elect=false",
        "--v=1",
    ]


def _controller_manager_args(
    bins: Binaries, ports: dict[str, int], pki: Pki, configs: dict[str, Path]
) -> list[str]:
    kubeconfig = configs[pki_ids.CONTROLLER_MANAGER.name]
    return [
        *_serving_args(bins.kube_controller_manager, kubeconfig, ports["controller-manager"], pki),
        f"--root-ca-file={pki.ca.cert}",
        f"--service-account-private-key-file={pki.service_account_key}",
        "--use-service-account-credentials=true",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.key}",
        f"--service-cluster-ip-range={pki_ids.SERVICE_CIDR}",
        # Autoscaling tests (KEDA's HPAs) see a decision within seconds, not 15 s; with no
        # HPA in the cluster the loop has nothing to do.
        f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_PERIOD}",
        # Endpoints (deprecated since 1.33; nothing here reads them) could never be written
        # for KWOK pods: their loopback IPs are not valid endpoint addresses. EndpointSlices
        # stay (a gateway reads them; the same refusal applies to loopback pods, see README).
        "--controllers=*,-endpoints-controller",
        # 20 requests/s per controller (the default) made 1,000 Deployments take 4 minutes
        # to become available on the fleet profile; the API server had room to spare.
        f"--kube-api-qps={CONTROLLER_QPS}",
        f"--kube-api-burst={2 * CONTROLLER_QPS}",
        f"--node-monitor-grace-period={NODE_LEASE_SECONDS + 60}s",
    ]


def _scheduler_args(
    bins: Binaries, ports: dict[str, int], pki: Pki, configs: dict[str, Path]
) -> list[str]:
    kubeconfig = configs[pki_ids.SCHEDULER.name]
    return _serving_args(bins.kube_scheduler, kubeconfig, ports["scheduler"], pki)


def _kwok_args(
    bins: Binaries,
    ports: dict[str, int],
    configs: dict[str, Path],
    kwok_config: Path,
    pod_cidr: str,
) -> list[str]:
    annotation = "=".join(KWOK_NODE_ANNOTATION)
    return [
        str(bins.kwok),
        f"--kubeconfig={configs[pki_ids.KWOK.name]}",
        f"--config={kwok_config}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={annotation}",
        f"--server-address=127.0.0.1:{ports['kwok']}",
        f"--node-ip={NODE_IP}",
        f"--node-port={ports['kwok']}",
        f"--cidr={pod_cidr}",
        # KWOK renews each node's Lease every quarter of this. A kubelet's 40 s (a renewal
        # every 10 s) costs 50 writes/s at 500 nodes, most of what an idle fleet's API server
        # does; 120 s costs a third. The controller manager's grace period follows it.
        f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
    ]


def _write_kwok_config(root: Path) -> Path:
    """KWOK reads its stages from the same --config file; copy them in as loaded."""
    target = root / "kwok-stages.yaml"
    shutil.copyfile(e2e_dir() / "kwok" / "stages.yaml", target)
    return target


def _create_nodes(rest: Rest, manifests: list[dict[str, Any]], server_log: Path) -> None:
    try:
        # A few at a time: a fleet profile's hundreds of nodes in seconds, not minutes.
        with ThreadPoolExecutor(max_workers=NODE_CREATE_WORKERS) as pool:
            list(pool.map(lambda node: rest.post("/api/v1/nodes", node), manifests))
    except OSError as error:
        raise ClusterStartError(
            f"creating the profile's nodes failed ({error}); read {server_log}"
        ) from error


def _wait_ready(
    rest: Rest,
    expected: int,
    timeout: float,
    state: ClusterState,
    reached: Callable[[str], None],
) -> None:
    def nodes_ready() -> bool:
        nodes = rest.get("/api/v1/nodes")["items"]
        return sum(1 for n in nodes if _schedulable(n)) == expected

    # The controller manager is up when it has created the default ServiceAccount.
    def default_account() -> bool:
        return bool(rest.get("/api/v1/namespaces/default/serviceaccounts")["items"])

    # Each poll lists every node: a 500-node list is megabytes, so poll less often there.
    _wait_alive(
        nodes_ready,
        f"{expected} nodes Ready and schedulable",
        timeout,
        state,
        "kwok",
        interval=min(0.1 + expected / 500, 1.0),
    )
    reached("nodes Ready and schedulable")
    # The controller manager creates it: its log says why when it does not.
    _wait_alive(
        default_account, "the default ServiceAccount", timeout, state, "kube-controller-manager"
    )
    reached("default ServiceAccount")


def _schedulable(node: dict[str, Any]) -> bool:
    """Ready, and the node controller has taken its not-ready taint off (at 500 new nodes
    that lags Ready by about 20 s, its node patches and Events a stream of writes beside
    whatever runs first, and the tainted nodes refuse pods)."""
    conditions = node.get("status", {}).get("conditions", [])
    taints = node.get("spec", {}).get("taints") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) and not any(
        t.get("key") == NOT_READY_TAINT for t in taints
    )


def _wait_alive(
    probe: Callable[[], object],
    what: str,
    timeout: float,
    state: ClusterState,
    suspect: str,
    interval: float = 0.1,
) -> None:
    """wait_until, but fail at once when a component has died; either way one line that
    names the log to read (the dead component's, else `suspect`'s, whose work is awaited)."""

    def check() -> bool:
        for proc in state.processes:
            if not is_alive(proc):
                raise ClusterStartError(
                    f"{proc.name} exited during start ({_last_line(proc.log)}); read {proc.log}"
                )
        return bool(probe())

    try:
        wait_until(check, what=what, timeout=timeout, interval=interval, retry_on=(OSError,))
    except WaitTimeoutError as timed_out:
        log = Path(state.run_dir) / "logs" / f"{suspect}.log"
        first_line = str(timed_out).splitlines()[0]
        raise ClusterStartError(f"{first_line}; read {log}") from timed_out


def _wait_https(
    url: str, pki: Pki, client: KeyPair, timeout: float, state: ClusterState, server: str
) -> None:
    ctx = _tls_context(pki.ca.cert, client)
    _wait_alive(lambda: get_ok(url, ctx), url, timeout, state, server)


def _tls_context(ca: Path, client: KeyPair | None) -> ssl.SSLContext:
    if client is None:
        return tls_context(ca)
    return tls_context(ca, client.cert, client.key)


def _client_pair(pki_dir: Path, identity: pki_ids.Identity) -> KeyPair:
    stem = f"client-{identity.name}"
    return KeyPair(pki_dir / f"{stem}.crt", pki_dir / f"{stem}.key")


def _last_line(log: str) -> str:
    """The log's last non-empty line, shortened: usually the reason a component exited."""
    try:
        lines = [line for line in Path(log).read_text(errors="replace").splitlines() if line]
    except FileNotFoundError:
        return "no log"
    last = lines[-1].strip() if lines else "empty log"
    return last if len(last) <= 160 else last[:157] + "..."
