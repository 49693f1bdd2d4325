"""The operator's pure glue: what counts as a change, invalid specs in status, index keys."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY
from typer.testing import CliRunner

from kvq.api import keys
from kvq.api.validation import Violation
from kvq.cli import app
from kvq.decide.invalid import invalid_status
from kvq.handlers.indices import by_inference_service
from kvq.k8s.apply import comparable
from kvq.k8s.status import without_nulls
from kvq.metrics import count_event

LIVE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {
        "name": "a",
        "namespace": "n",
        "uid": "u1",
        "resourceVersion": "10",
        "generation": 1,
        "creationTimestamp": "2026-11-30T12:00:00Z",
        "managedFields": [{"manager": "kvq"}],
        "labels": {"x": "1"},
    },
    "data": {"k": "v"},
    "status": {"anything": True},
}


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(LIVE)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


@pytest.mark.parametrize(
    ("changed", "is_change"),
    [
        (_with(("metadata", "resourceVersion"), "11"), False),
        (_with(("metadata", "managedFields"), [{"manager": "other"}]), False),
        (_with(("metadata", "generation"), 2), False),
        (_with(("status",), {"anything": False}), False),
        (_with(("metadata", "labels"), {"x": "2"}), True),
        (_with(("metadata", "annotations"), {"a": "b"}), True),
        (_with(("metadata", "ownerReferences"), [{"uid": "o"}]), True),
        (_with(("data",), {"k": "w"}), True),
        (_with(("spec",), {"replicas": 2}), True),
    ],
)
def test_only_what_a_write_can_change_counts_as_a_change(
    changed: dict[str, Any], is_change: bool
) -> None:
    assert (comparable(changed) != comparable(LIVE)) is is_change


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
    assert [c["type"] for c in status["conditions"]] == ["Placed", "Ready"]


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
