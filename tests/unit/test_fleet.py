"""The operator's Fleet, fed event by event, gives the pools discover_pools gives for the
same nodes, pods and GPU claims, whatever the order of the events."""

from __future__ import annotations

import copy
import itertools
from typing import Any

from e2e.devcluster.profiles import load_profile, node_manifests
from hypothesis import given, settings
from hypothesis import strategies as st

from kvq.api import keys
from kvq.catalog.gpus import load_gpu_catalog
from kvq.placement.claims import GpuClaim
from kvq.placement.discovery import GpuPod, discover_pools
from kvq.placement.fleet import Fleet
from kvq.placement.pool import OwnerKey

CATALOG = load_gpu_catalog()
TEMPLATES = {
    pool: next(n for n in node_manifests(load_profile("hetero")) if pool in n["metadata"]["name"])
    for pool in ("h100", "l4")
}
POOLS = {"h100": "gpu-h100", "l4": "l4-pool"}
OWNERS: list[OwnerKey] = [("team", f"svc-{i}") for i in range(4)]
NODE_NAMES = [f"{pool}-node-{i}" for pool in TEMPLATES for i in range(3)]
_versions = itertools.count(1)


def _node(name: str, gpus: int, ready: bool, cordoned: bool) -> dict[str, Any]:
    pool = name.split("-", maxsplit=1)[0]
    node = copy.deepcopy(TEMPLATES[pool])
    node["metadata"]["name"] = name
    node["metadata"]["resourceVersion"] = str(next(_versions))
    node["status"]["allocatable"][keys.GPU_RESOURCE] = str(gpus)
    node["status"]["conditions"] = [{"type": "Ready", "status": str(ready)}]
    node["spec"]["unschedulable"] = cordoned
    return node


node_events = st.tuples(
    st.just("node"),
    st.sampled_from(NODE_NAMES),
    st.one_of(st.none(), st.tuples(st.integers(0, 8), st.booleans(), st.booleans())),
)
pod_events = st.tuples(
    st.just("pod"),
    st.integers(0, 9),
    st.one_of(
        st.none(),
        st.tuples(st.sampled_from(NODE_NAMES), st.integers(1, 4), st.sampled_from([*OWNERS, None])),
    ),
)
claims = st.tuples(
    st.sampled_from(OWNERS),
    st.sampled_from(sorted(POOLS.values())),
    st.integers(0, 3),
    st.sampled_from([1, 2, 4]),
)
deployment_events = st.tuples(
    st.just("deployment"), st.integers(0, 5), st.one_of(st.none(), claims)
)
assume_events = st.tuples(
    st.just("assume"),
    st.sampled_from(OWNERS),
    st.one_of(st.none(), st.lists(claims.map(lambda r: r[1:]), max_size=2)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(node_events, pod_events, deployment_events, assume_events), max_size=40))
def test_the_fleet_event_by_event_is_the_fleet_discovered_at_once(events: list[Any]) -> None:
    fleet = Fleet(CATALOG)
    nodes: dict[str, dict[str, Any]] = {}
    pods: dict[str, GpuPod] = {}
    watched: dict[tuple[str, str], GpuClaim] = {}
    assumed: dict[OwnerKey, list[GpuClaim]] = {}
    for index, (kind, key, value) in enumerate(events):
        if kind == "node":
            body = _node(key, *value) if value is not None else None
            fleet.node(key, body)
            if body is None:
                nodes.pop(key, None)
            else:
                nodes[key] = body
        elif kind == "pod":
            pod = GpuPod(*value) if value is not None else None
            fleet.pod(f"uid-{key}", pod)
            if pod is None:
                pods.pop(f"uid-{key}", None)
            else:
                pods[f"uid-{key}"] = pod
        elif kind == "deployment":
            found = GpuClaim(*value) if value is not None else None
            fleet.deployment(("team", f"deploy-{key}"), found)
            if found is None:
                watched.pop(("team", f"deploy-{key}"), None)
            else:
                watched[("team", f"deploy-{key}")] = found
        else:
            decided = [GpuClaim(key, *r) for r in value] if value is not None else None
            fleet.assume(key, decided)
            if decided is None:
                assumed.pop(key, None)
            else:
                assumed[key] = decided
        if index % 7 == 0:
            fleet.inventory()  # reads between events keep only what was touched fresh
    effective = [r for r in watched.values() if r.owner not in assumed]
    effective += [r for decided in assumed.values() for r in decided]

    expected = discover_pools(list(nodes.values()), CATALOG, gpu_pods=pods.values(),
                              claims=effective)  # fmt: skip

    assert fleet.inventory() == expected
    assert sorted(map(repr, fleet.claims())) == sorted(map(repr, effective))
