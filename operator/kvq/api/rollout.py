"""`spec.rollout`: how the engine Deployment replaces pods."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kvq.api.base import KubeModel
from kvq.api.rules import Rule


class RolloutSpec(KubeModel):
    """How the engine Deployment replaces pods when what they run changes.

    By default kvq surges (one new replica first, no replica taken down) when the pool has a
    free GPU slot for it, and otherwise replaces one replica at a time (a single-replica
    service is briefly down: no spare GPU means no second replica can start).
    """

    kube_rules = (
        Rule(
            cel="!has(self.maxSurge) || !has(self.maxUnavailable) "
            "|| self.maxSurge > 0 || self.maxUnavailable > 0",
            message="maxSurge and maxUnavailable cannot both be 0: the rollout could never "
            "make progress",
            check=lambda r: (
                r.max_surge is None
                or r.max_unavailable is None
                or r.max_surge + r.max_unavailable > 0
            ),
        ),
    )

    max_surge: Annotated[int | None, Field(ge=0, le=1000)] = None
    """Replicas started above spec.replicas during a rollout (needs free GPUs); with only
    maxUnavailable given, 0 (1 when maxUnavailable is 0)."""
    max_unavailable: Annotated[int | None, Field(ge=0, le=1000)] = None
    """Replicas that may be down during a rollout; with only maxSurge given, 0 (1 when
    maxSurge is 0)."""
