"""kvq's status read by kstatus, the status logic of Flux, cli-utils and Argo-style waits.

The statuses come from kvq's own decisions (decide() on snapshots, invalid_status for a spec
the operator cannot read); the verdicts come from the real library, cli-utils'
`status.Compute`, through the small Go program in e2e/kstatus (built on first use, cached
by version). A Flux or cli-utils user expects: Current only when the service is Ready and
kvq has nothing left to do; InProgress while kvq works or waits; Failed when a person must
act (Stalled), each with kvq's own words as the message.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from kvq.api.validation import find_violations
from kvq.decide import decide
from kvq.decide.invalid import invalid_status
from tests.unit.test_decide import (
    HEAD80_CRASH,
    T0,
    crashing_pod,
    isvc,
    nodes,
    rolled_out,
    snapshot,
    with_status,
)

pytestmark = pytest.mark.kstatus

ROOT = Path(__file__).resolve().parents[2]
KSTATUS = ROOT / "e2e" / "kstatus"
# A cold build (toolchain, modules, compile) took minutes on this project's 2-core machine
# (e2e/kstatus/README.md); the budget is the control plane's (KVQ_BUILD_TIMEOUT_S).
BUILD_TIMEOUT_S = float(os.environ.get("KVQ_BUILD_TIMEOUT_S", "3600"))

Verdict = dict[str, Any]
Scenario = Callable[[], dict[str, Any]]


@pytest.fixture(scope="module")
def kstatus(request: pytest.FixtureRequest) -> Path:
    """The kstatus binary, built when absent, with the build's progress on the terminal."""
    if shutil.which("go") is None:
        pytest.skip("Go is not installed: e2e/kstatus is built from cli-utils' Go module")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        process = subprocess.Popen(
            ["bash", str(KSTATUS / "build.sh")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            # Its own process group: a timeout stops the go command too, not only bash.
            start_new_session=True,
        )
        try:
            out, _ = process.communicate(timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait()
            pytest.fail(f"building e2e/kstatus ran past {BUILD_TIMEOUT_S:.0f} s", pytrace=False)
    if process.returncode != 0:
        pytest.fail(f"e2e/kstatus/build.sh exited with {process.returncode}", pytrace=False)
    return Path(out.strip())


def read_kstatus(binary: Path, *objects: Mapping[str, Any]) -> list[Verdict]:
    """kstatus' verdict on each object, in order."""
    done = subprocess.run(
        [str(binary)],
        input=json.dumps(list(objects)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr or done.stdout
    return [json.loads(line) for line in done.stdout.splitlines()]


def condition(obj: Mapping[str, Any], type_: str) -> dict[str, Any]:
    return dict(next(c for c in obj["status"]["conditions"] if c["type"] == type_))


# --- the services kvq really produces ---------------------------------------------------


def fresh() -> dict[str, Any]:
    body = isvc()
    return with_status(body, decide(snapshot(body)))


def rolled_out_ready(replicas: int = 1) -> dict[str, Any]:
    body = isvc(replicas=replicas)
    first = decide(snapshot(body))
    ready = decide(snapshot(with_status(body, first), deployment=rolled_out(first, replicas)))
    return with_status(body, ready)


def scaled_to_zero() -> dict[str, Any]:
    return rolled_out_ready(replicas=0)


def waiting_for_capacity() -> dict[str, Any]:
    # The only allowed pool's node is NotReady: "cannot run now", kvq waits for it.
    body = isvc(placement={"pools": ["gpu-h100"]})
    down = copy.deepcopy(nodes())
    for node in down:
        if "gpu-h100" in node["metadata"]["labels"].values():
            node["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    return with_status(body, decide(snapshot(body, node_list=down)))


def hub_unavailable() -> dict[str, Any]:
    # A transient failure the kubelet's restart retries: kvq keeps working, no person needed.
    body = isvc()
    first = decide(snapshot(body))
    crash = crashing_pod(first, "huggingface_hub.errors.HfHubHTTPError: 503 Server Error")
    return with_status(body, decide(snapshot(with_status(body, first), pods=[crash])))


def falling_back() -> dict[str, Any]:
    # fp8 refused at run time: kvq renders the auto rung, which is rolling out.
    body = isvc()
    first = decide(snapshot(body))
    crash = crashing_pod(first, HEAD80_CRASH)
    return with_status(body, decide(snapshot(with_status(body, first), pods=[crash])))


def ladder_exhausted() -> dict[str, Any]:
    # fp8 holds ~110 sequences of 8k on one H100, auto ~55: for 100, auto is no rung.
    body = isvc(capacity={"minConcurrentSequences": 100}, placement={"pools": ["gpu-h100"]})
    first = decide(snapshot(body))
    crash = crashing_pod(first, HEAD80_CRASH)
    return with_status(body, decide(snapshot(with_status(body, first), pods=[crash])))


def oom_killed() -> dict[str, Any]:
    # Action FIX: a person must raise the memory limit.
    body = isvc()
    first = decide(snapshot(body))
    pod = crashing_pod(first, "")
    pod["status"]["containerStatuses"][0]["lastState"]["terminated"].update(
        reason="OOMKilled", exitCode=137
    )
    return with_status(body, decide(snapshot(with_status(body, first), pods=[pod])))


def invalid_spec() -> dict[str, Any]:
    # A Ready service edited (past an older CRD) to a spec the operator cannot read.
    body = rolled_out_ready()
    body["metadata"]["generation"] = 2
    body["spec"]["memory"]["gpuMemoryUtilization"] = 1.5
    violations = find_violations(body)
    assert violations, "the edit must be invalid for this scenario"
    body["status"] = invalid_status(body, violations, T0)
    return body


def edited_not_yet_observed(base: dict[str, Any]) -> dict[str, Any]:
    """`base` after a spec edit kvq has not reconciled yet (metadata.generation moved on)."""
    body = copy.deepcopy(base)
    body["metadata"]["generation"] = body["status"]["observedGeneration"] + 1
    body["spec"]["memory"]["maxModelLen"] = 4096
    return body


# --- what kstatus says ------------------------------------------------------------------


def test_the_binary_is_the_pinned_cli_utils(kstatus: Path) -> None:
    pinned = re.search(r"^\s*sigs\.k8s\.io/cli-utils (\S+)", (KSTATUS / "go.mod").read_text(), re.M)
    assert pinned is not None
    done = subprocess.run([str(kstatus), "-version"], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == f"sigs.k8s.io/cli-utils {pinned.group(1)}"
    assert kstatus.parent.name == f"kstatus-{pinned.group(1)}"


@pytest.mark.parametrize(
    ("scenario", "reason"),
    [
        (fresh, "Progressing"),
        (waiting_for_capacity, "WaitingForCapacity"),
        (hub_unavailable, "HubUnavailable"),
        (falling_back, "FallingBack"),
    ],
)
def test_kvq_at_work_or_waiting_is_in_progress_in_kvqs_words(
    kstatus: Path, scenario: Scenario, reason: str
) -> None:
    obj = scenario()
    reconciling = condition(obj, "Reconciling")
    assert (reconciling["status"], reconciling["reason"]) == ("True", reason)
    [verdict] = read_kstatus(kstatus, obj)
    assert verdict["status"] == "InProgress"
    assert verdict["message"] == reconciling["message"]
    assert condition(obj, "Ready")["status"] == "False"


@pytest.mark.parametrize("scenario", [rolled_out_ready, scaled_to_zero])
def test_a_ready_settled_service_is_current(kstatus: Path, scenario: Scenario) -> None:
    obj = scenario()
    [verdict] = read_kstatus(kstatus, obj)
    assert verdict["status"] == "Current", verdict
    assert condition(obj, "Ready")["status"] == "True"
    assert condition(obj, "Reconciling")["status"] == "False"


@pytest.mark.parametrize(
    ("scenario", "reason"),
    [
        (ladder_exhausted, "FallbackExhausted"),
        (oom_killed, "OOMKilled"),
        (invalid_spec, "InvalidSpec"),
    ],
)
def test_a_service_that_needs_a_person_is_failed_with_kvqs_reason(
    kstatus: Path, scenario: Scenario, reason: str
) -> None:
    obj = scenario()
    stalled = condition(obj, "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", reason)
    [verdict] = read_kstatus(kstatus, obj)
    assert verdict["status"] == "Failed"
    assert verdict["message"] == stalled["message"]
    assert verdict["conditions"] == [
        {"type": "Stalled", "status": "True", "reason": reason, "message": stalled["message"]}
    ]


@pytest.mark.parametrize("scenario", [rolled_out_ready, oom_killed, invalid_spec])
def test_a_spec_edit_kvq_has_not_observed_is_in_progress(kstatus: Path, scenario: Scenario) -> None:
    # Ready or Stalled describe the previous generation: a waiting tool must not stop on them.
    obj = edited_not_yet_observed(scenario())
    [verdict] = read_kstatus(kstatus, obj)
    generation = obj["metadata"]["generation"]
    assert verdict["status"] == "InProgress"
    assert verdict["message"] == (
        f"InferenceService generation is {generation}, "
        f"but latest observed generation is {generation - 1}"
    )


def test_kstatus_is_current_exactly_when_kvq_says_ready(kstatus: Path) -> None:
    # `kubectl wait --for=condition=Ready` and a kstatus wait end on the same services.
    objects = [
        scenario()
        for scenario in (
            fresh,
            rolled_out_ready,
            scaled_to_zero,
            waiting_for_capacity,
            hub_unavailable,
            falling_back,
            ladder_exhausted,
            oom_killed,
            invalid_spec,
        )
    ]
    verdicts = read_kstatus(kstatus, *objects)
    for obj, verdict in zip(objects, verdicts, strict=True):
        ready = condition(obj, "Ready")
        assert (verdict["status"] == "Current") == (ready["status"] == "True"), (ready, verdict)


def test_a_crash_seen_before_the_deployment_counts_it_reads_the_same_to_both(
    kstatus: Path,
) -> None:
    body = isvc(replicas=2)
    first = decide(snapshot(body))
    # The Deployment still counts 2 ready replicas; one pod was just OOM-killed.
    pod = crashing_pod(first, "")
    pod["status"]["containerStatuses"][0]["lastState"]["terminated"].update(
        reason="OOMKilled", exitCode=137
    )
    plan = decide(snapshot(with_status(body, first), pods=[pod], deployment=rolled_out(first, 2)))
    obj = with_status(body, plan)
    [verdict] = read_kstatus(kstatus, obj)
    ready = condition(obj, "Ready")
    assert (verdict["status"] == "Current") == (ready["status"] == "True"), (ready, verdict)


def test_before_kvq_writes_status_kstatus_reads_current(kstatus: Path) -> None:
    # kstatus' rule for a custom resource without status or conditions: Current. A wait
    # started in the instant between `kubectl apply` and kvq's first status write ends at
    # once; a GitOps wait should start after kvq wrote status.observedGeneration.
    [verdict] = read_kstatus(kstatus, isvc())
    assert verdict["status"] == "Current"
    assert verdict["message"] == "Resource is current"
