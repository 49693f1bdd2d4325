"""The topology domain a multi-node group prefers: one NVLink clique or zone for all its
nodes, where the pool's nodes say which they are in.

Preferred, never required: a group that fits no single domain still runs across domains
(a required affinity would leave it Pending while nodes are free elsewhere). The key is read
from the pool's nodes, not from their free GPUs, so the pod template (and its hash) does not
change, and restart every group, each time GPUs are taken or freed.
"""

from __future__ import annotations

from collections import Counter

from kvq.placement.pool import NodePool

# Most specific first. nvidia.com/gpu.clique: GPU Feature Discovery's NVLink domain
# (multi-node NVLink, GB200 NVL72: "<cluster UUID>.<clique id>"); topology.kubernetes.io/zone:
# the well-known zone label every cloud sets.
TOPOLOGY_KEYS = ("nvidia.com/gpu.clique", "topology.kubernetes.io/zone")


def group_topology_key(pool: NodePool, nodes: int) -> str | None:
    """The most specific of TOPOLOGY_KEYS that every node of the pool carries, with more
    than one domain over the pool and one domain of at least `nodes` nodes (room for a
    whole group); None for a single-node replica, or when no key does (nothing to prefer)."""
    if nodes < 2 or not pool.nodes:
        return None
    for key in TOPOLOGY_KEYS:
        values = [node.domains.get(key) for node in pool.nodes]
        if None in values:
            continue
        counts = Counter(values)
        # One domain for the whole pool: nothing to choose (and no term in the template).
        if len(counts) > 1 and max(counts.values()) >= nodes:
            return key
    return None
