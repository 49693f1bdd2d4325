"""Cluster profiles: GPU node pools as data (e2e/clusters/*.yaml), expanded to KWOK Nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from e2e.devcluster.paths import e2e_dir
from pydantic import BaseModel, ConfigDict, Field

# KWOK manages only nodes that carry this annotation (see kwok's
# --manage-nodes-with-annotation-selector in cluster.py).
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")


class Taint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class Pool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    nodes: int = Field(ge=1)
    labels: dict[str, str]
    capacity: dict[str, str]
    allocatable: dict[str, str] | None = None
    taints: list[Taint] = []


# KWOK's pod IPs by default: loopback, so a test can bind a real server to a pod's IP and
# anything that dials one stays on this machine (tests/infra/servers.py).
LOOPBACK_POD_CIDR = "127.10.0.0/16"


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str
    description: str = ""
    pools: list[Pool] = Field(min_length=1)
    pod_cidr: str = Field(default=LOOPBACK_POD_CIDR, alias="podCIDR")
    """Where KWOK takes pod IPs. The API server refuses loopback EndpointSlice addresses, so
    with the default every Service's slice controller retries (and posts a Warning) until it
    gives up; a profile whose pods nobody dials can take routable-looking ones instead."""


def profiles_dir() -> Path:
    return e2e_dir() / "clusters"


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (e2e/clusters/NAME.yaml) or by path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix not in {".yaml", ".yml"}:
        path = profiles_dir() / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in profiles_dir().glob("*.yaml"))
        raise FileNotFoundError(f"no cluster profile {name_or_path!r} (known: {', '.join(known)})")
    return Profile.model_validate(yaml.safe_load(path.read_text()))


def scale_profile(profile: Profile, nodes: int) -> Profile:
    """The same pools with `nodes` nodes in all, shared in proportion to the profile's own
    counts (largest remainder first; every pool keeps at least one node)."""
    if nodes < len(profile.pools):
        raise ValueError(
            f"profile {profile.name!r} has {len(profile.pools)} pools: it needs at least "
            f"{len(profile.pools)} nodes, not {nodes}"
        )
    weights = [pool.nodes for pool in profile.pools]
    spare = nodes - len(weights)  # one node per pool is given first
    shares = [spare * w / sum(weights) for w in weights]
    counts = [1 + int(share) for share in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: int(shares[i]) - shares[i])
    for i in by_remainder[: nodes - sum(counts)]:
        counts[i] += 1
    pools = [p.model_copy(update={"nodes": n}) for p, n in zip(profile.pools, counts, strict=True)]
    return profile.model_copy(update={"pools": pools})


def node_manifests(profile: Profile) -> list[dict[str, Any]]:
    """One KWOK-managed Node per pool member, named `<pool>-<index>`."""
    return [_node(pool, f"{pool.name}-{i}") for pool in profile.pools for i in range(pool.nodes)]


def _node(pool: Pool, name: str) -> dict[str, Any]:
    labels = {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "kubernetes.io/hostname": name,
        "type": "kwok",
        **pool.labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1],
                "node.alpha.kubernetes.io/ttl": "0",
            },
        },
        "spec": {"taints": [t.model_dump(exclude_none=True) for t in pool.taints]},
        "status": {
            "capacity": dict(pool.capacity),
            "allocatable": dict(pool.allocatable or pool.capacity),
        },
    }
