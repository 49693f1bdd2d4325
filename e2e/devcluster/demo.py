"""The demo (`make demo`, `python -m e2e.devcluster demo`): the whole story on a local
control plane, then everything stopped again.

Starts the `hetero` cluster (T4, A100, L4, H100, H200, B200 pools), installs the CRD,
runs the operator, applies the examples and waits for each to reach its outcome:
FP8 placed on an FP8-capable pool, a T4-only request falling back before deploying,
and a start-up crash (real vLLM text) falling back at runtime. Prints `kubectl get kis`
and the fallback reasons, and exits non-zero if any outcome was not reached.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.devcluster import cluster
from e2e.devcluster.binaries import BinaryBuildError, ensure_binaries
from e2e.devcluster.paths import e2e_dir
from e2e.devcluster.ports import allocate_ports
from e2e.devcluster.waits import WaitTimeoutError, wait_until

NAMESPACE = "kvq-demo"
DEADLINE_SECONDS = 180.0


@dataclass(frozen=True)
class Expectation:
    """An example and the outcome the demo waits for."""

    file: str
    name: str
    what: str
    reached: Callable[[dict[str, Any]], bool]


def _condition(isvc: dict[str, Any], type_: str) -> str | None:
    for c in (isvc.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return str(c.get("status"))
    return None


def _attempt_causes(isvc: dict[str, Any]) -> list[str]:
    """Each move's cause: Incompatible is decided before deploying (static), Refused on the
    engine's own refusal (runtime)."""
    attempts = ((isvc.get("status") or {}).get("fallback") or {}).get("attempts") or []
    return [str(a.get("cause")) for a in attempts]


EXPECTATIONS = (
    Expectation(
        "llama3-8b-fp8.yaml",
        "llama3-8b",
        "FP8 KV cache on an FP8-capable pool that holds 64 sequences of 8k",
        lambda i: _condition(i, "Ready") == "True" and _attempt_causes(i) == [],
    ),
    Expectation(
        "legacy-fp8-on-t4.yaml",
        "llama3-8b-legacy",
        "T4 only: static fallback to the AWQ model before deploying",
        lambda i: _condition(i, "Ready") == "True" and _attempt_causes(i) == ["Incompatible"],
    ),
    Expectation(
        "tiny-head80-fp8-sim.yaml",
        "tiny-head80",
        "engine rejects fp8 at start-up: runtime fallback to auto",
        lambda i: _condition(i, "Ready") == "True" and _attempt_causes(i) == ["Refused"],
    ),
)


class DemoStepError(RuntimeError):
    """A step of the demo failed; the message is one line naming the log to read."""


def run_demo(profile: str = "hetero", name: str = "demo") -> int:
    """The demo; failures end in one `error:` line naming the log to read (exit 1)."""
    try:
        return _run_demo(profile, name)
    except (BinaryBuildError, cluster.ClusterStartError, DemoStepError) as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 1


def _run_demo(profile: str, name: str) -> int:
    root = e2e_dir().parent
    # The build (first run only) has its own budget and progress; the start-up its own.
    binaries = ensure_binaries()
    print(f"==> starting the local control plane ({profile} profile)", flush=True)
    state = cluster.up(name=name, profile=profile, timeout=300, binaries=binaries)
    print(f"    ready in {state.startup_seconds:.1f} s; export KUBECONFIG={state.kubeconfig}")
    logs = Path(state.run_dir) / "logs"
    kubectl = _kubectl(state.kubeconfig, logs / "kube-apiserver.log")
    operator: subprocess.Popen[bytes] | None = None
    log_path = logs / "kvq-operator.log"
    try:
        kubectl("get", "nodes", "-L", "nvidia.com/gpu.product", show=True)
        kubectl("apply", "--server-side", "-f", str(root / "crds"))
        _wait_established(kubectl, logs / "kube-apiserver.log")
        kubectl("create", "namespace", NAMESPACE)
        # The example references an HF token by Secret; KWOK pods never read it.
        kubectl(
            "create", "secret", "generic", "hf-token", "-n", NAMESPACE,
            "--from-literal=token=demo-placeholder-not-a-token",
        )  # fmt: skip
        print("==> starting the operator (kvq run)", flush=True)
        operator = _start_operator(state.kubeconfig, log_path)
        for expectation in EXPECTATIONS:
            kubectl("apply", "-n", NAMESPACE, "-f", str(root / "examples" / expectation.file))
        print(f"==> waiting for the outcomes (up to {DEADLINE_SECONDS:.0f} s)", flush=True)
        missed = _wait_for_outcomes(kubectl, operator)
        print()
        kubectl("get", "kis", "-n", NAMESPACE, show=True)
        kubectl(
            "get", "deployments,pods", "-n", NAMESPACE, "-o", "wide", show=True
        )  # fmt: skip
        _print_decisions(kubectl)
        if missed:
            print(f"\nNOT reached: {', '.join(missed)}; operator log: {log_path}")
            return 1
        print("\nAll outcomes reached. Stopping the operator and the cluster.")
        return 0
    finally:
        if operator is not None:
            operator.send_signal(signal.SIGTERM)
            try:
                operator.wait(timeout=30)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait()
        cluster.down(name)


def _kubectl(kubeconfig: str, server_log: Path) -> Callable[..., str]:
    binary = str(Path(sys.executable).parent / "kubectl")

    def call(*args: str, show: bool = False) -> str:
        try:
            result = subprocess.run(
                [binary, "--kubeconfig", kubeconfig, *args],
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise DemoStepError(f"kubectl {args[0]} failed ({error}); read {server_log}") from error
        if result.returncode != 0:
            said = " ".join(result.stderr.split())
            said = said if len(said) <= 300 else said[:297] + "..."
            raise DemoStepError(f"kubectl {' '.join(args)} failed: {said}; read {server_log}")
        if show:
            print(result.stdout, end="", flush=True)
        return result.stdout

    return call


def _wait_established(kubectl: Callable[..., str], server_log: Path) -> None:
    # Not `kubectl wait` (nor a jsonpath filter): both fail at once while a new CRD has no
    # conditions yet.
    def ready() -> bool:
        crd = json.loads(kubectl("get", "crd", "inferenceservices.kvq.dev", "-o", "json"))
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    try:
        wait_until(ready, what="the InferenceService CRD Established", timeout=60)
    except WaitTimeoutError as error:
        raise DemoStepError(f"{error}; read {server_log}") from error


def _start_operator(kubeconfig: str, log_path: Path) -> subprocess.Popen[bytes]:
    port = allocate_ports(["metrics"])["metrics"]
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    command = [
        sys.executable, "-m", "kvq.cli", "run", "--namespace", NAMESPACE, "--standalone",
        "--metrics-port", str(port),
    ]  # fmt: skip
    # The child keeps its own copy of the descriptor: ours closes at once.
    with log_path.open("wb") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait_for_outcomes(kubectl: Callable[..., str], operator: subprocess.Popen[bytes]) -> list[str]:
    pending = {e.name: e for e in EXPECTATIONS}

    def settled() -> bool:
        if operator.poll() is not None:
            print(f"    the operator exited with code {operator.returncode}")
            return True
        items = json.loads(kubectl("get", "kis", "-n", NAMESPACE, "-o", "json"))["items"]
        for isvc in items:
            expectation = pending.get(isvc["metadata"]["name"])
            if expectation is not None and expectation.reached(isvc):
                print(f"    reached: {expectation.name}: {expectation.what}", flush=True)
                del pending[expectation.name]
        return not pending

    with contextlib.suppress(WaitTimeoutError):
        wait_until(settled, what="the demo's outcomes", timeout=DEADLINE_SECONDS)
    return sorted(pending)


def _print_decisions(kubectl: Callable[..., str]) -> None:
    items = json.loads(kubectl("get", "kis", "-n", NAMESPACE, "-o", "json"))["items"]
    for isvc in sorted(items, key=lambda i: str(i["metadata"]["name"])):
        status = isvc.get("status") or {}
        placement = status.get("placement") or {}
        capacity = status.get("capacity") or {}
        effective = status.get("effective") or {}
        print(f"\n{isvc['metadata']['name']}:")
        print(
            f"  pool {placement.get('pool')} ({placement.get('gpuProduct')}, cc "
            f"{placement.get('computeCapability')}); KV cache {effective.get('kvCacheDtype')}; "
            f"model {effective.get('modelUri')}"
        )
        print(
            f"  capacity: {capacity.get('kvTokens')} KV tokens, "
            f"{capacity.get('maxConcurrentSequences')} sequences of {capacity.get('maxModelLen')}"
            f" tokens, {capacity.get('ratioVsAuto')}x the auto cache"
        )
        for attempt in (status.get("fallback") or {}).get("attempts") or []:
            print(
                f"  fallback ({attempt['cause']}) {attempt['from']} -> {attempt['to']}: "
                f"{attempt['reason']}"
            )
            if attempt.get("evidence"):
                print("    evidence: " + attempt["evidence"].splitlines()[0])
        for ignored in effective.get("ignored") or []:
            print(f"  ignored: {ignored['field']}: {ignored['reason']}")
