"""Pure decisions: a snapshot of the world in, a plan (objects, status, events) out."""

from kvq.decide.decide import decide
from kvq.decide.types import Catalogs, EventSpec, ObjectRef, OperatorConfig, Plan, Snapshot

__all__ = ["Catalogs", "EventSpec", "ObjectRef", "OperatorConfig", "Plan", "Snapshot", "decide"]
