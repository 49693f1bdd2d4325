"""core/v1 Events about an InferenceService (what `kubectl describe kis/NAME` lists)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kvq.decide.types import EventSpec
from kvq.k8s.clients import Clients
from kvq.metrics import count_event, count_write

COMPONENT = "kvq"
# Events longer than this are cut: `describe` shows one line, and the API caps note size.
MAX_MESSAGE = 1024


def post_event(clients: Clients, isvc: Mapping[str, Any], event: EventSpec, now: datetime) -> None:
    meta = isvc["metadata"]
    stamp = now.isoformat().replace("+00:00", "Z")
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": isvc["apiVersion"],
            "kind": isvc["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "resourceVersion": meta.get("resourceVersion"),
        },
        "type": event.type,
        "reason": event.reason,
        "message": _clip(event.message),
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    clients.call("post", f"/api/v1/namespaces/{meta['namespace']}/events", body=body)
    count_write("Event", "create")
    count_event(event.reason)


def _clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
