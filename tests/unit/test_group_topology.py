"""A multi-node group prefers one topology domain (issue 24): the most specific of
nvidia.com/gpu.clique and topology.kubernetes.io/zone that the pool's nodes carry and one
of whose domains holds a whole group; preferred, never required."""

from __future__ import annotations

from typing import Any

import pytest

from kvq.decide import decide
from tests.unit.test_decide import LLAMA_405B, TWO_NODES, group_of, h100_nodes, isvc, snapshot

ZONE = "topology.kubernetes.io/zone"
CLIQUE = "nvidia.com/gpu.clique"


def labelled(labels: list[dict[str, str]]) -> list[dict[str, Any]]:
    nodes = h100_nodes(len(labels))
    for node, extra in zip(nodes, labels, strict=True):
        node["metadata"]["labels"].pop(ZONE)  # the test's own, per node
        node["metadata"]["labels"] |= extra
    return nodes


def preferred(nodes: list[dict[str, Any]], affinity: dict[str, Any] | None = None) -> list[Any]:
    placement = {**TWO_NODES, **({"affinity": affinity} if affinity else {})}
    plan = decide(snapshot(isvc(model=LLAMA_405B, placement=placement), node_list=nodes))
    template = group_of(plan)["spec"]["leaderWorkerTemplate"]
    found = []
    for role in ("leaderTemplate", "workerTemplate"):
        pod_affinity = template[role]["spec"].get("affinity", {}).get("podAffinity", {})
        found.append(pod_affinity.get("preferredDuringSchedulingIgnoredDuringExecution", []))
    assert found[0] == found[1]  # every rank prefers the same
    return list(found[0])


def term(key: str) -> dict[str, Any]:
    return {
        "weight": 100,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": {"leaderworkerset.sigs.k8s.io/name": "llama-group"}},
            "matchLabelKeys": ["leaderworkerset.sigs.k8s.io/group-key"],
            "topologyKey": key,
        },
    }


@pytest.mark.parametrize(
    ("labels", "key"),
    [
        # Nodes that say nothing of their topology: nothing to prefer.
        ([{}, {}, {}, {}], None),
        # Two zones of two nodes: a group prefers its leader's zone.
        ([{ZONE: "a"}, {ZONE: "a"}, {ZONE: "b"}, {ZONE: "b"}], ZONE),
        # NVLink cliques of two nodes inside the zones: the clique, the more specific.
        (
            [
                {ZONE: "a", CLIQUE: "u.1"},
                {ZONE: "a", CLIQUE: "u.1"},
                {ZONE: "a", CLIQUE: "u.2"},
                {ZONE: "a", CLIQUE: "u.2"},
            ],
            CLIQUE,
        ),
        # Cliques of one node cannot hold a group of two: the zone.
        (
            [
                {ZONE: "a", CLIQUE: "u.1"},
                {ZONE: "a", CLIQUE: "u.2"},
                {ZONE: "b", CLIQUE: "u.3"},
                {ZONE: "b", CLIQUE: "u.4"},
            ],
            ZONE,
        ),
        # Every node in one zone: nothing to choose, the template stays as it was.
        ([{ZONE: "a"}, {ZONE: "a"}, {ZONE: "a"}, {ZONE: "a"}], None),
        # One zone per node: no zone holds a group, nothing is preferred.
        ([{ZONE: "a"}, {ZONE: "b"}, {ZONE: "c"}, {ZONE: "d"}], None),
        # A node without the label: the pool does not say, nothing is preferred.
        ([{ZONE: "a"}, {ZONE: "a"}, {ZONE: "b"}, {}], None),
    ],
)
def test_a_group_prefers_one_topology_domain_the_nodes_name(
    labels: list[dict[str, str]], key: str | None
) -> None:
    assert preferred(labelled(labels)) == ([] if key is None else [term(key)])


def test_the_preference_joins_the_specs_own_affinity() -> None:
    own = {
        "weight": 10,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": {"app": "cache"}},
            "topologyKey": ZONE,
        },
    }
    nodes = labelled([{ZONE: "a"}, {ZONE: "a"}, {ZONE: "b"}, {ZONE: "b"}])
    found = preferred(
        nodes, {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [own]}}
    )
    assert found == [own, term(ZONE)]


def test_the_preference_never_keeps_a_group_from_nodes_of_two_zones() -> None:
    """Preferred, not required: a group whose zone has one free node is still placed."""
    nodes = labelled([{ZONE: "a"}, {ZONE: "b"}, {ZONE: "b"}])
    plan = decide(snapshot(isvc(model=LLAMA_405B, placement=TWO_NODES), node_list=nodes))
    spec = group_of(plan)["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in spec["affinity"]["podAffinity"]
