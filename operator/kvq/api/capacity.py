"""`spec.capacity`: what each replica must hold; placement and fallback keep it."""

from __future__ import annotations

from typing import Annotated

from kvq.api.base import KubeModel
from kvq.api.rules import FieldRule


class CapacitySpec(KubeModel):
    """What the service must hold; placement and fallback keep it."""

    min_concurrent_sequences: Annotated[
        int | None,
        FieldRule(
            cel="self >= 1 && self <= 65536",
            message="minConcurrentSequences must be between 1 and 65536 (the most sequences "
            "an engine batches)",
            check=lambda v: 1 <= v <= 65_536,
        ),
    ] = None
    """Concurrent sequences of spec.memory.maxModelLen tokens each replica must fit in KV."""
