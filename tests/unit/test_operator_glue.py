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
from kvq.handlers.controller import DEFAULT_WORKERS, Controller, PassResult, Service
from kvq.handlers.indices import by_inference_service
from kvq.handlers.operator import on_pod_event
from kvq.handlers.workqueue import Priority
from kvq.k8s.apply import holds
from kvq.k8s.status_writer import without_nulls
from kvq.metrics import count_event
from tests.unit.waiting import until

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


def _served(controller: Controller, key: tuple[str, str]) -> None:
    """`key` served (its daemon runs), without workers: what is queued stays queued."""

    async def carry_out(_: None, urgency: int) -> PassResult:
        return PassResult()

    controller._services[key] = Service("", lambda: None, lambda observed: observed, carry_out)


def _woken(controller: Controller, keys_: list[tuple[str, str]]) -> set[tuple[str, str]]:
    return {key for key in keys_ if controller.queue.queued(key) is not None}


def _clear(controller: Controller) -> None:
    for key in list(controller._services):
        controller.queue.remove(key)


def _controller() -> tuple[Controller, list[tuple[str, str]]]:
    controller = Controller(pool_labels=("karpenter.sh/nodepool",))
    services = [("a", "on-h100"), ("a", "on-l4"), ("a", "waiting")]
    for key in services:
        _served(controller, key)
    controller._remember(("a", "on-h100"), PassResult(pool="gpu-h100"))
    controller._remember(("a", "on-l4"), PassResult(pool="gpu-l4"))
    controller._remember(("a", "waiting"), PassResult(pool=None, watches_capacity=True))
    return controller, services


def test_a_node_heartbeat_wakes_nobody_and_a_readiness_change_wakes_its_pool() -> None:
    controller, services = _controller()
    controller.node_changed("n1", _gpu_node("n1", "gpu-h100"))
    _clear(controller)
    controller.node_changed("n1", _gpu_node("n1", "gpu-h100", heartbeat="t1"))
    assert _woken(controller, services) == set()
    controller.node_changed("n1", _gpu_node("n1", "gpu-h100", ready=False))
    assert _woken(controller, services) == {("a", "on-h100"), ("a", "waiting")}


def test_gpus_taken_on_a_pool_wake_only_the_services_waiting_for_capacity() -> None:
    controller, services = _controller()
    controller.node_changed("n2", _gpu_node("n2", "gpu-l4"))
    _clear(controller)
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
    _clear(controller)
    controller.pod_changed("pod-uid", pod)  # the same pod again: nothing new
    assert _woken(controller, services) == set()


def test_a_fallback_waits_for_nodes_not_for_every_pod() -> None:
    controller, services = _controller()
    refused = ("a", "refused")
    _served(controller, refused)
    controller._remember(refused, PassResult(pool="gpu-l4", watches_nodes=True))
    controller.node_changed("n3", _gpu_node("n3", "gpu-h100"))
    assert refused in _woken(controller, [*services, refused])  # a pool it may move back to
    _clear(controller)
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
    _served(controller, key)
    body: dict[str, Any] = {"metadata": {"generation": 1, "labels": {"team": "a"}}}
    controller.isvc_changed(key, body)
    assert controller.queue.queued(key) == Priority.CHANGE
    _clear(controller)
    controller.isvc_changed(key, {**body, "status": {"conditions": []}})
    assert controller.queue.queued(key) is None  # status only: kvq's own write
    controller.isvc_changed(key, {"metadata": {"generation": 2, "labels": {"team": "a"}}})
    assert controller.queue.queued(key) == Priority.CHANGE  # a spec change
    _clear(controller)
    retry = {"generation": 2, "labels": {"team": "a"}, "annotations": {"kvq.dev/retry": "1"}}
    controller.isvc_changed(key, {"metadata": retry})
    assert controller.queue.queued(key) == Priority.ROUTINE


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
    _served(controller, key)
    memo = SimpleNamespace(controller=controller)
    body = _engine_pod(state)
    labels = body["metadata"]["labels"]
    on_pod_event(namespace="a", labels=labels, uid="u", body=body, type="MODIFIED", memo=memo)
    assert controller.queue.queued(key) == priority


def test_kvq_run_and_the_chart_default_to_the_controllers_workers() -> None:
    from kvq.cli.run import run
    from kvq.k8s.writers import DEFAULT_BURST, DEFAULT_QPS

    parameters = inspect.signature(run).parameters
    values = yaml.safe_load(Path("charts/kvq/values.yaml").read_text())["reconcile"]
    for flag, default in (("workers", DEFAULT_WORKERS), ("qps", DEFAULT_QPS)):
        assert parameters[flag].default == default
        assert values[flag] == default
    assert parameters["burst"].default == values["burst"] == DEFAULT_BURST


def test_a_pass_retried_after_a_conflict_keeps_its_priority() -> None:
    async def scenario() -> list[int]:
        controller = Controller(workers=1)
        controller.start()
        urgencies: list[int] = []
        results = iter([PassResult(conflict=True), PassResult()])

        async def carry_out(_: None, urgency: int) -> PassResult:
            urgencies.append(urgency)
            return next(results)

        daemon = asyncio.create_task(
            controller.serve(("a", "llama"), lambda: None, lambda observed: observed, carry_out)
        )
        await until(lambda: len(urgencies) == 2, "the pass and its retry")
        daemon.cancel()
        await asyncio.gather(daemon, return_exceptions=True)
        controller.stop()
        return urgencies

    # The first pass of a new service, then its retry: both ahead of routine passes.
    assert asyncio.run(scenario()) == [Priority.CHANGE, Priority.CHANGE]


async def _behind_a_busy_worker(script: Any) -> list[str]:
    """One worker, held by another service's pass while `script(controller)` queues work;
    returns the passes after it, as "name:urgency"."""
    controller = Controller(workers=1)
    controller.start()
    passes: list[str] = []
    gate = asyncio.Event()

    async def carry_out(name: str, urgency: int) -> PassResult:
        passes.append(f"{name}:{Priority(urgency).name}")
        if name == "busy":
            await gate.wait()
        return PassResult()

    def served(name: str) -> asyncio.Task[None]:
        key = ("a", name)
        return asyncio.create_task(controller.serve(key, lambda: name, lambda o: o, carry_out))

    daemons = [served("llama"), served("crashed")]
    await until(lambda: len(passes) == 2 and controller.queue.idle_workers == 1, "first passes")
    daemons.append(served("busy"))
    await until(lambda: passes[-1] == "busy:CHANGE", "the busy pass")
    await script(controller, served, daemons)
    gate.set()
    await until(lambda: controller.queue.depth == 0 and controller.queue.idle_workers == 1,
                "the queue to drain")  # fmt: skip
    for daemon in daemons:
        daemon.cancel()
    await asyncio.gather(*daemons, return_exceptions=True)
    controller.stop()
    return passes[3:]


def test_a_burst_of_routine_events_becomes_one_pass() -> None:
    async def burst(controller: Controller, served: Any, daemons: Any) -> None:
        for _ in range(5):  # a rollout's pod and Deployment events, while it waits
            controller.notify(("a", "llama"))

    assert asyncio.run(_behind_a_busy_worker(burst)) == ["llama:ROUTINE"]


def test_a_crash_while_its_pass_waits_moves_that_pass_up_instead_of_queueing_another() -> None:
    async def crash(controller: Controller, served: Any, daemons: Any) -> None:
        controller.notify(("a", "crashed"))  # a routine event first
        daemons.append(served("new"))  # a new service, queued before the crash
        controller.notify(("a", "crashed"), Priority.FAILURE)

    passes = asyncio.run(_behind_a_busy_worker(crash))
    assert passes == ["crashed:FAILURE", "new:CHANGE"]  # one pass each, the crash first


def test_kopf_builds_no_diff_base_because_kvq_has_no_change_handlers() -> None:
    from kvq.handlers.operator import EssenceFree, build_registry

    registry = build_registry()
    # kopf diffs a body only for change handlers (on.create/update/field): with one, the
    # empty essence would hide every change from it.
    assert list(registry._changing.get_all_handlers()) == []
    body = {"metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"x": 1}}
    assert EssenceFree(prefix=keys.GROUP).build(body=body) == {}  # type: ignore[arg-type]


def test_a_new_service_is_reconciled_while_another_pass_waits_on_its_writes() -> None:
    async def scenario() -> list[str]:
        controller = Controller(workers=2)
        controller.start()
        order: list[str] = []
        writes_done = threading.Event()

        async def carry_out(name: str, urgency: int) -> PassResult:
            if name == "a":
                await asyncio.wait_for(asyncio.to_thread(writes_done.wait), timeout=10)
            order.append(f"{name} carried out")
            return PassResult()

        a = asyncio.create_task(controller.serve(("n", "a"), lambda: "a", lambda o: o, carry_out))
        await until(lambda: controller.queue.processing(("n", "a")), "a's pass")
        b = asyncio.create_task(controller.serve(("n", "b"), lambda: "b", lambda o: o, carry_out))
        await until(lambda: order == ["b carried out"], "b's pass, while a still waits")
        writes_done.set()
        await until(lambda: len(order) == 2, "both passes carried out")
        for daemon in (a, b):
            daemon.cancel()
        await asyncio.gather(a, b, return_exceptions=True)
        controller.stop()
        return order

    assert asyncio.run(scenario()) == ["b carried out", "a carried out"]


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


def test_a_failing_service_backs_off_alone() -> None:
    async def scenario() -> tuple[list[str], float]:
        controller = Controller(workers=1)
        controller.start()
        passes: list[str] = []

        def decide(name: str) -> str:
            if name == "broken":
                raise RuntimeError("a bug in one service's pass")
            return name

        async def carry_out(name: str, urgency: int) -> PassResult:
            passes.append(name)
            return PassResult()

        def served(name: str) -> asyncio.Task[None]:
            key = ("a", name)
            return asyncio.create_task(controller.serve(key, lambda: name, decide, carry_out))

        daemons = [served("broken"), served("healthy")]
        broken = ("a", "broken")
        await until(lambda: passes == ["healthy"] and controller.queue.has_timer(broken),
                    "the healthy pass, and the broken one's back-off")  # fmt: skip
        controller.notify(("a", "healthy"))  # the one worker is not held by the broken one
        await until(lambda: passes == ["healthy", "healthy"], "the healthy service again")
        backoff = controller.queue.add_rate_limited(broken)  # its second failure's back-off
        for daemon in daemons:
            daemon.cancel()
        await asyncio.gather(*daemons, return_exceptions=True)
        controller.stop()
        return passes, backoff

    passes, backoff = asyncio.run(scenario())
    assert passes == ["healthy", "healthy"] and backoff == 2.0
