"""The operator's pure glue: what counts as a change, invalid specs in status, index keys."""

from __future__ import annotations

import asyncio
import copy
import inspect
import threading
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY
from typer.testing import CliRunner

from kvq.api import keys
from kvq.api.validation import Violation
from kvq.cli import app
from kvq.decide.invalid import invalid_status
from kvq.handlers.controller import DEFAULT_WORKERS, Controller, PassResult
from kvq.handlers.indices import by_inference_service
from kvq.handlers.operator import on_pod_event
from kvq.handlers.slots import Priority
from kvq.k8s.apply import holds
from kvq.k8s.status_writer import without_nulls
from kvq.metrics import count_event
from tests.unit.test_slots import until

LIVE: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {
        "name": "a",
        "namespace": "n",
        "uid": "u1",
        "resourceVersion": "10",
        "labels": {"x": "1", "added-by-someone": "y"},
    },
    "spec": {
        "replicas": 1,
        "template": {
            "spec": {
                "containers": [{"name": "vllm", "image": "i", "imagePullPolicy": "IfNotPresent"}],
                "enableServiceLinks": False,
            }
        },
    },
    "status": {"replicas": 1},
}
DESIRED: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "a", "namespace": "n", "labels": {"x": "1"}},
    "spec": {
        "replicas": 1,
        "template": {
            "spec": {"containers": [{"name": "vllm", "image": "i"}], "enableServiceLinks": False}
        },
    },
}


def _with(base: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


@pytest.mark.parametrize(
    ("desired", "holds_already"),
    [
        (DESIRED, True),  # defaults and other managers' fields do not count
        (_with(DESIRED, ("spec", "replicas"), 2), False),
        (_with(DESIRED, ("metadata", "labels"), {"x": "2"}), False),
        (_with(DESIRED, ("spec", "template", "spec", "enableServiceLinks"), 0), False),
        (_with(DESIRED, ("spec", "template", "spec", "containers"), []), False),
        (_with(DESIRED, ("metadata", "annotations"), {"a": "b"}), False),
    ],
)
def test_the_cache_tells_what_an_apply_would_change(
    desired: dict[str, Any], holds_already: bool
) -> None:
    assert holds(desired, LIVE) is holds_already


@pytest.mark.parametrize(
    ("desired", "stored", "equal"),
    [
        ({"a": None, "b": 1}, {"b": 1}, True),
        ({"conditions": []}, {}, True),
        ({"effective": {"ignored": []}}, {}, True),
        ({"b": 1}, {"b": 2}, False),
        (
            {"conditions": [{"type": "Ready", "message": None}]},
            {"conditions": [{"type": "Ready"}]},
            True,
        ),
    ],
)
def test_null_and_empty_mean_absent_in_status(
    desired: dict[str, Any], stored: dict[str, Any], equal: bool
) -> None:
    assert (without_nulls(desired) == without_nulls(stored)) is equal


NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
BROKEN = [Violation("spec.memory.gpuMemoryUtilization", "must be in (0, 1]")]


def test_an_invalid_spec_sets_ready_false_and_keeps_the_rest_of_status() -> None:
    body = {
        "metadata": {"generation": 3},
        "status": {
            "placement": {"pool": "l4-pool"},
            "conditions": [
                {"type": "Placed", "status": "True"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T00:00:00Z"},
            ],
        },
    }

    status = invalid_status(body, BROKEN, NOW)

    assert status["placement"] == {"pool": "l4-pool"}
    assert status["observedGeneration"] == 3
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    assert ready["reason"] == "InvalidSpec"
    assert ready["message"] == "spec.memory.gpuMemoryUtilization: must be in (0, 1]"
    assert ready["lastTransitionTime"] == "2026-11-30T12:00:00Z"
    kinds = {c["type"]: (c["status"], c.get("reason")) for c in status["conditions"]}
    assert kinds == {
        "Placed": ("True", None),
        "Ready": ("False", "InvalidSpec"),
        "Reconciling": ("False", "Stalled"),
        "Stalled": ("True", "InvalidSpec"),
    }


def test_an_invalid_spec_twice_keeps_the_transition_time() -> None:
    first = invalid_status({"metadata": {"generation": 1}}, BROKEN, NOW)
    later = NOW.replace(hour=13)

    second = invalid_status({"metadata": {"generation": 1}, "status": first}, BROKEN, later)

    assert second == first


@pytest.mark.parametrize(
    ("namespace", "labels", "key"),
    [
        ("team-a", {keys.LABEL_INFERENCESERVICE: "llama"}, ("team-a", "llama")),
        ("team-a", {}, None),
        (None, {keys.LABEL_INFERENCESERVICE: "llama"}, None),
    ],
)
def test_engine_objects_are_indexed_by_their_inference_service(
    namespace: str | None, labels: dict[str, str], key: tuple[str, str] | None
) -> None:
    body = {"metadata": {"name": "x", "labels": labels}}

    entry = by_inference_service(namespace=namespace, labels=labels, body=body)

    assert list(entry) == ([key] if key else [])


def test_only_fallback_events_count_as_fallbacks() -> None:
    def value(reason: str) -> float:
        return REGISTRY.get_sample_value("kvq_fallbacks_total", {"reason": reason}) or 0.0

    before = value("FallbackToAwq")
    count_event("FallbackToAwq")
    count_event("Ready")
    assert value("FallbackToAwq") == before + 1
    assert value("Ready") == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run"], "give --namespace (one or more) or --all-namespaces"),
        (
            ["run", "-n", "a", "--all-namespaces"],
            "give --namespace (one or more) or --all-namespaces",
        ),
        (["run", "-n", "a", "--peering", "p", "--standalone"], "--peering and --standalone"),
    ],
)
def test_run_refuses_contradictory_flags_before_starting(argv: list[str], message: str) -> None:
    result = CliRunner().invoke(app, argv)

    assert result.exit_code == 2
    assert message in result.output


# --- what wakes whom ------------------------------------------------------------------


def _gpu_node(name: str, pool: str, ready: bool = True, heartbeat: str = "t0") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"karpenter.sh/nodepool": pool, "nvidia.com/gpu.product": "NVIDIA-H100"},
        },
        "spec": {},
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False",
                 "lastHeartbeatTime": heartbeat},
            ],
        },
    }  # fmt: skip


def _woken(controller: Controller, keys_: list[tuple[str, str]]) -> set[tuple[str, str]]:
    events = {key: controller._signals[key] for key in keys_}
    return {key for key, event in events.items() if event.is_set()}


def _controller() -> tuple[Controller, list[tuple[str, str]]]:
    controller = Controller(pool_labels=("karpenter.sh/nodepool",))
    services = [("a", "on-h100"), ("a", "on-l4"), ("a", "waiting")]
    for key in services:
        controller._signals[key] = asyncio.Event()
    controller._remember(("a", "on-h100"), PassResult(pool="gpu-h100"))
    controller._remember(("a", "on-l4"), PassResult(pool="gpu-l4"))
    controller._remember(("a", "waiting"), PassResult(pool=None, watches_capacity=True))
    return controller, services


def test_a_node_heartbeat_wakes_nobody_and_a_readiness_change_wakes_its_pool() -> None:
    controller, services = _controller()
    controller.node_changed("n1", _gpu_node("n1", "gpu-h100"))
    for event in controller._signals.values():
        event.clear()
    controller.node_changed("n1", _gpu_node("n1", "gpu-h100", heartbeat="t1"))
    assert _woken(controller, services) == set()
    controller.node_changed("n1", _gpu_node("n1", "gpu-h100", ready=False))
    assert _woken(controller, services) == {("a", "on-h100"), ("a", "waiting")}


def test_gpus_taken_on_a_pool_wake_only_the_services_waiting_for_capacity() -> None:
    controller, services = _controller()
    controller.node_changed("n2", _gpu_node("n2", "gpu-l4"))
    for event in controller._signals.values():
        event.clear()
    pod = {
        "metadata": {"namespace": "b", "labels": {}},
        "spec": {
            "nodeName": "n2",
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Running"},
    }
    controller.pod_changed("pod-uid", pod)
    # Not the services placed on that pool: they stay where they are (their own pods'
    # events wake them), and waking them all on every pod makes a rollout quadratic.
    assert _woken(controller, services) == {("a", "waiting")}
    for event in controller._signals.values():
        event.clear()
    controller.pod_changed("pod-uid", pod)  # the same pod again: nothing new
    assert _woken(controller, services) == set()


def test_a_fallback_waits_for_nodes_not_for_every_pod() -> None:
    controller, services = _controller()
    refused = ("a", "refused")
    controller._signals[refused] = asyncio.Event()
    controller._remember(refused, PassResult(pool="gpu-l4", watches_nodes=True))
    controller.node_changed("n3", _gpu_node("n3", "gpu-h100"))
    assert refused in _woken(controller, [*services, refused])  # a pool it may move back to
    for event in controller._signals.values():
        event.clear()
    pod = {
        "metadata": {"namespace": "b", "labels": {}},
        "spec": {
            "nodeName": "n3",
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Running"},
    }
    controller.pod_changed("pod-uid", pod)
    assert _woken(controller, [*services, refused]) == {("a", "waiting")}


def test_kvq_reading_its_own_status_write_back_wakes_nobody() -> None:
    controller = Controller()
    key = ("a", "llama")
    controller._signals[key] = asyncio.Event()
    body: dict[str, Any] = {"metadata": {"generation": 1, "labels": {"team": "a"}}}
    controller.isvc_changed(key, body)
    assert controller._signals[key].is_set() and controller._priority[key] == Priority.CHANGE
    controller._signals[key].clear()
    controller._priority.clear()
    controller.isvc_changed(key, {**body, "status": {"conditions": []}})
    assert not controller._signals[key].is_set()  # status only: kvq's own write
    controller.isvc_changed(key, {"metadata": {"generation": 2, "labels": {"team": "a"}}})
    assert controller._priority[key] == Priority.CHANGE  # a spec change
    controller._signals[key].clear()
    controller._priority.clear()
    retry = {"generation": 2, "labels": {"team": "a"}, "annotations": {"kvq.dev/retry": "1"}}
    controller.isvc_changed(key, {"metadata": retry})
    assert controller._signals[key].is_set() and controller._priority[key] == Priority.ROUTINE


def _engine_pod(state: dict[str, Any]) -> dict[str, Any]:
    labels = {keys.LABEL_INFERENCESERVICE: "llama"}
    return {
        "metadata": {"name": "llama-0", "namespace": "a", "labels": labels},
        "status": {"containerStatuses": [{"name": "vllm", "ready": False, **state}]},
    }


@pytest.mark.parametrize(
    ("state", "priority"),
    [
        ({"state": {"waiting": {"reason": "ContainerCreating"}}}, Priority.ROUTINE),
        ({"state": {"running": {}}, "ready": True}, Priority.ROUTINE),
        ({"state": {"terminated": {"exitCode": 1, "message": "fp8 refused"}}}, Priority.FAILURE),
        ({"state": {"waiting": {"reason": "CrashLoopBackOff"}}}, Priority.FAILURE),
    ],
)
def test_a_crashed_engine_is_reconciled_ahead_of_every_other_pass(
    state: dict[str, Any], priority: Priority
) -> None:
    controller = Controller()
    key = ("a", "llama")
    controller._signals[key] = asyncio.Event()
    memo = SimpleNamespace(controller=controller)
    body = _engine_pod(state)
    labels = body["metadata"]["labels"]
    on_pod_event(namespace="a", labels=labels, uid="u", body=body, type="MODIFIED", memo=memo)
    assert controller._signals[key].is_set()
    assert controller._priority[key] == priority


def test_kvq_run_and_the_chart_default_to_the_controllers_workers() -> None:
    from kvq.cli.run import run

    assert inspect.signature(run).parameters["workers"].default == DEFAULT_WORKERS
    values = yaml.safe_load(Path("charts/kvq/values.yaml").read_text())
    assert values["reconcile"]["workers"] == DEFAULT_WORKERS


def test_a_pass_retried_after_a_conflict_keeps_its_priority() -> None:
    async def scenario() -> list[Priority]:
        controller = Controller(workers=1)
        controller.start()
        slots = controller._slots
        assert slots is not None
        asked: list[Priority] = []
        held = slots.held

        def recording(priority: Priority = Priority.ROUTINE, key: Any = None) -> Any:
            asked.append(priority)
            return held(priority, key)

        slots.held = recording  # type: ignore[method-assign]
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        results = iter([PassResult(conflict=True), PassResult()])

        async def carry_out(_: None, urgency: int) -> PassResult:
            result = next(results)
            if not result.conflict:
                loop.call_soon_threadsafe(done.set)
            return result

        daemon = asyncio.create_task(
            controller.serve(("a", "llama"), lambda: None, lambda observed: observed, carry_out)
        )
        await asyncio.wait_for(done.wait(), timeout=10)
        daemon.cancel()
        with pytest.raises(asyncio.CancelledError):
            await daemon
        controller.stop()
        return asked

    # The first pass of a new service, then its retry: both ahead of routine passes.
    assert asyncio.run(scenario()) == [Priority.CHANGE, Priority.CHANGE]


async def _passes_after(controller: Controller, script: Any, count: int) -> list[int]:
    """Serve one service, run `script(notify)` once its first pass is done, and return the
    urgencies of its first `count` passes."""
    controller.start()
    key = ("a", "llama")
    urgencies: list[int] = []

    async def carry_out(_: None, urgency: int) -> PassResult:
        urgencies.append(urgency)
        return PassResult()

    daemon = asyncio.create_task(
        controller.serve(key, lambda: None, lambda observed: observed, carry_out)
    )
    await until(lambda: len(urgencies) == 1, "the first pass")
    await script(lambda priority: controller.notify(key, priority), urgencies)
    await until(lambda: len(urgencies) >= count, f"{count} passes")
    daemon.cancel()
    await asyncio.gather(daemon, return_exceptions=True)
    controller.stop()
    return urgencies


def test_a_burst_of_routine_events_becomes_one_pass() -> None:
    async def burst(notify: Any, urgencies: list[int]) -> None:
        notify(Priority.ROUTINE)
        for _ in range(4):  # a rollout's other pod and Deployment events, while it waits
            await until(lambda: bool(controller.settling), "the loop to wait for more")
            notify(Priority.ROUTINE)
        await until(lambda: len(urgencies) == 2, "the routine pass")
        notify(Priority.FAILURE)

    controller = Controller(coalesce=2.0)
    urgencies = asyncio.run(_passes_after(controller, burst, 3))
    assert urgencies == [Priority.CHANGE, Priority.ROUTINE, Priority.FAILURE]


def test_a_crash_does_not_wait_for_routine_events_to_settle() -> None:
    async def crash(notify: Any, urgencies: list[int]) -> None:
        notify(Priority.ROUTINE)
        await until(lambda: bool(controller.settling), "the loop to wait for more (a minute)")
        notify(Priority.FAILURE)

    # Within the deadline of `until` (10 s), not after the minute.
    controller = Controller(coalesce=60)
    urgencies = asyncio.run(_passes_after(controller, crash, 2))
    assert urgencies == [Priority.CHANGE, Priority.FAILURE]


def test_a_crash_while_its_pass_waits_moves_that_pass_up_instead_of_queueing_another() -> None:
    async def scenario() -> tuple[list[str], bool]:
        controller = Controller(workers=1)
        controller.start()
        slots = controller._slots
        assert slots is not None
        admitted: list[str] = []
        gate = asyncio.Event()
        crashed = ("a", "crashed")
        controller._signals[crashed] = asyncio.Event()  # its daemon runs (and waits)

        async def holder() -> None:
            async with slots.held():
                await gate.wait()

        async def queued(key: tuple[str, str], priority: Priority) -> None:
            async with slots.held(priority, key):
                admitted.append(key[1])

        first = asyncio.create_task(holder())
        await until(lambda: slots.free == 0, "the holder to take the only worker")
        waiters = [
            asyncio.create_task(queued(crashed, Priority.ROUTINE)),
            asyncio.create_task(queued(("a", "new"), Priority.CHANGE)),
        ]
        await until(lambda: slots.waiting == 2, "both passes queued")
        controller.notify(crashed, Priority.FAILURE)
        signalled = controller._signals[crashed].is_set()
        gate.set()
        await asyncio.gather(first, *waiters)
        controller.stop()
        return admitted, signalled

    admitted, signalled = asyncio.run(scenario())
    assert admitted == ["crashed", "new"]  # ahead of the new service queued before it
    assert not signalled  # the waiting pass reads the crash; no second pass queued


def test_kopf_builds_no_diff_base_because_kvq_has_no_change_handlers() -> None:
    from kvq.handlers.operator import EssenceFree, build_registry

    registry = build_registry()
    # kopf diffs a body only for change handlers (on.create/update/field): with one, the
    # empty essence would hide every change from it.
    assert list(registry._changing.get_all_handlers()) == []
    body = {"metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"x": 1}}
    assert EssenceFree(prefix=keys.GROUP).build(body=body) == {}  # type: ignore[arg-type]


def test_a_new_service_is_decided_while_another_pass_waits_on_its_writes() -> None:
    async def scenario() -> list[str]:
        controller = Controller(workers=1)  # one decision at a time
        controller.start()
        loop = asyncio.get_running_loop()
        order: list[str] = []
        writes_done = threading.Event()
        b_decided = asyncio.Event()

        def decide(name: str) -> str:
            order.append(f"{name} decided")
            if name == "b":
                loop.call_soon_threadsafe(b_decided.set)
            return name

        async def carry_out(name: str, urgency: int) -> PassResult:
            if name == "a":
                await asyncio.wait_for(asyncio.to_thread(writes_done.wait), timeout=10)
            order.append(f"{name} carried out")
            return PassResult()

        a = asyncio.create_task(controller.serve(("n", "a"), lambda: "a", decide, carry_out))
        await until(lambda: order == ["a decided"], "a's decision")
        b = asyncio.create_task(controller.serve(("n", "b"), lambda: "b", decide, carry_out))
        await asyncio.wait_for(b_decided.wait(), timeout=10)  # while a still waits
        writes_done.set()
        await until(lambda: len(order) == 4, "both passes carried out")
        for daemon in (a, b):
            daemon.cancel()
        await asyncio.gather(a, b, return_exceptions=True)
        controller.stop()
        return order

    order = asyncio.run(scenario())
    assert order.index("b decided") < order.index("a carried out")


def test_a_deleted_service_is_not_written_for_and_a_new_one_of_its_name_takes_over() -> None:
    async def scenario() -> tuple[list[str], list[tuple[tuple[str, str], str]]]:
        controller = Controller(workers=2)
        controller.start()
        gone: list[tuple[tuple[str, str], str]] = []
        controller.on_gone = lambda key, uid: gone.append((key, uid))
        loop = asyncio.get_running_loop()
        key = ("n", "llama")
        carried: list[str] = []
        decided = threading.Event()
        deletion_seen = threading.Event()

        def decide(uid: str) -> str:
            if uid == "u1":  # the first incarnation's pass: deleted while it decides
                loop.call_soon_threadsafe(decided.set)
                assert deletion_seen.wait(timeout=10)
            return uid

        async def carry_out(uid: str, urgency: int) -> PassResult:
            carried.append(uid)
            return PassResult()

        first = asyncio.create_task(controller.serve(key, lambda: "u1", decide, carry_out, "u1"))
        await until(decided.is_set, "u1's pass to decide")
        controller.deleted(key, "u1")
        deletion_seen.set()
        await asyncio.wait_for(first, timeout=10)  # its loop ends by itself
        second = asyncio.create_task(controller.serve(key, lambda: "u2", decide, carry_out, "u2"))
        await until(lambda: carried == ["u2"], "the new incarnation's first pass")
        controller.deleted(key, "u1")  # a late event of the old one changes nothing
        controller.notify(key)
        await until(lambda: carried == ["u2", "u2"], "u2 woken by a change")
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
        controller.stop()
        return carried, gone

    carried, gone = asyncio.run(scenario())
    assert carried == ["u2", "u2"]  # u1's plan, decided before the deletion, never written
    assert gone == [(("n", "llama"), "u1")]  # cancelled (a paused replica) is not gone


def test_kvq_puts_no_finalizer_on_the_services_it_serves() -> None:
    from kvq.handlers.operator import DAEMON_ID, build_registry

    registry = build_registry()
    daemons = [h for h in registry._spawning.get_all_handlers() if h.id == DAEMON_ID]
    assert len(daemons) == 1
    assert daemons[0].requires_finalizer is False


def test_every_watch_handler_runs_on_kopfs_event_loop() -> None:
    from kopf._core.actions.invocation import is_async_fn

    from kvq.handlers.operator import build_registry

    registry = build_registry()
    handlers = [
        *registry._indexing.get_all_handlers(),
        *registry._watching.get_all_handlers(),
        *registry._spawning.get_all_handlers(),
    ]
    assert len(handlers) >= 10
    # A plain function would run in kopf's thread pool: a hop per event, and the
    # controller's asyncio objects touched from another thread.
    assert [h.id for h in handlers if not is_async_fn(h.fn)] == []
    assert len({(h.id, h.selector) for h in handlers}) == len(handlers)  # names kept apart


def test_a_pass_after_kvqs_own_status_write_decides_from_what_the_write_returned() -> None:
    from kvq.k8s.status_writer import StoredForms

    forms = StoredForms()
    read = {"metadata": {"uid": "u1", "resourceVersion": "5"}, "status": {}}
    returned = {
        "metadata": {"uid": "u1", "resourceVersion": "6", "managedFields": [{"manager": "kvq"}]},
        "status": {"observedGeneration": 1},
    }
    forms.written("u1", "5", returned)
    # The watch still shows version 5, which the write replaced: decide from version 6.
    assert forms.newest(read) == {
        "metadata": {"uid": "u1", "resourceVersion": "6"},
        "status": {"observedGeneration": 1},
    }
    # Once the watch shows anything else, it is the truth again.
    caught_up = {"metadata": {"uid": "u1", "resourceVersion": "7"}, "status": {"x": 1}}
    assert forms.newest(caught_up) is caught_up
    assert forms.newest(read) is read
