"""Conditions that keep their lastTransitionTime until their status really changes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import get_args

from kvq.api.status import Condition, ConditionStatus, ConditionType

CONDITION_ORDER: tuple[ConditionType, ...] = get_args(ConditionType)


@dataclass(frozen=True)
class ConditionUpdate:
    type: str
    status: ConditionStatus
    reason: str
    message: str


def merge_conditions(
    previous: Sequence[Condition],
    updates: Sequence[ConditionUpdate],
    *,
    generation: int,
    now: str,
) -> list[Condition]:
    """New conditions; a condition whose status is unchanged keeps its transition time.

    Conditions not in `updates` are kept as they were (another part of kvq owns them).
    """
    by_type = {c.type: c for c in previous}
    for update in updates:
        old = by_type.get(update.type)
        since = old.last_transition_time if old and old.status == update.status else now
        by_type[update.type] = Condition(
            type=update.type,
            status=update.status,
            reason=update.reason,
            message=update.message[:4096],
            last_transition_time=since,
            observed_generation=generation,
        )
    order: dict[str, int] = {name: i for i, name in enumerate(CONDITION_ORDER)}
    return sorted(by_type.values(), key=lambda c: (order.get(c.type, len(order)), c.type))


def condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)
