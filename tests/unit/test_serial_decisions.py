"""Decisions made side by side see what the earlier ones claimed before the watch does."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from kvq.decide import decide
from kvq.handlers.serial_decisions import SerialDecisions
from kvq.placement.discovery import GpuPod
from kvq.placement.fleet import Fleet
from tests.unit.test_decide import CATALOGS, deployment_of, isvc, nodes, snapshot


def _service(name: str) -> dict[str, Any]:
    body = copy.deepcopy(isvc(placement={"pools": ["gpu-h100", "gpu-h200"]}))
    body["metadata"]["name"] = name
    body["metadata"]["uid"] = f"uid-{name}"
    return body


def _gpus(node: dict[str, Any]) -> int:
    return int(node["status"]["allocatable"]["nvidia.com/gpu"])


def _pool_of(plan: Any) -> str:
    return str(plan.status["placement"]["pool"])


def test_the_second_service_does_not_take_the_gpu_claimed_by_the_first() -> None:
    # One free GPU on the cheaper pool; neither service's Deployment is in the watch yet.
    first_choice = _pool_of(decide(snapshot(_service("a"))))
    free_one = [
        GpuPod(n["metadata"]["name"], _gpus(n) - 1, None)
        for n in nodes()
        if first_choice in n["metadata"]["labels"].values()
    ]
    fleet = Fleet(CATALOGS.gpus)  # the operator feeds it from the watches
    for node in nodes():
        fleet.node(node["metadata"]["name"], node)
    for index, pod in enumerate(free_one):
        fleet.pod(f"uid-{index}", pod)
    decisions = SerialDecisions(fleet)
    a = decisions.decide(("team-a", "a"), snapshot(_service("a"), gpu_pods=free_one), decide)
    b = decisions.decide(("team-a", "b"), snapshot(_service("b"), gpu_pods=free_one), decide)
    assert _pool_of(a) == first_choice
    assert _pool_of(b) != first_choice
    # Without the assumed claim both take it (what a fleet applied at once did).
    alone = decide(snapshot(_service("b"), gpu_pods=free_one))
    assert _pool_of(alone) == first_choice
    # A service's own claim is room for itself: its next pass stays.
    again = decisions.decide(
        ("team-a", "a"),
        replace(snapshot(_service("a"), gpu_pods=free_one), deployment=deployment_of(a)),
        decide,
    )
    assert _pool_of(again) == first_choice
    # Once it is gone, its GPU is free again.
    decisions.forget(("team-a", "a"))
    c = decisions.decide(("team-a", "c"), snapshot(_service("c"), gpu_pods=free_one), decide)
    assert _pool_of(c) == first_choice
