"""The layout kvq derives when spec.placement.parallelism gives the tensor size without the
pipeline: the fewest stages whose replica holds the weights and the capacity asked for.

One function for the operator's placement (placement/choice.py, per pool and per rung) and
for `kvq plan -f` (cli/plan.py), so the preview names the layout the operator runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvq.catalog.models import ModelArchitecture
from kvq.planner.capacity import CapacityPlan
from kvq.planner.layout import Layout, pipeline_candidates


@dataclass(frozen=True)
class DerivedLayout:
    layout: Layout
    plan: CapacityPlan
    holds: bool
    """The replica holds the weights, min_concurrency and what `fits_node` checks; False:
    the deepest layout tried, kept so that its plan says what is still missing."""


def derive_layout(
    arch: ModelArchitecture,
    tensor: int,
    gpus_per_node: int,
    plan_for: Callable[[Layout], CapacityPlan],
    min_concurrency: int | None,
    fits_node: Callable[[Layout], bool] = lambda _: True,
) -> DerivedLayout | None:
    """Tensor x 1, 2, ... stages (planner.layout.pipeline_candidates), fewest first: the
    first whose plan fits, holds `min_concurrency` sequences at the plan's maxModelLen and
    passes `fits_node` (the operator: a pod's memory on one node of the pool). None when no
    layout of `tensor` places on nodes of `gpus_per_node` GPUs at all."""
    tried: DerivedLayout | None = None
    for layout in pipeline_candidates(arch, tensor, gpus_per_node):
        plan = plan_for(layout)
        enough = min_concurrency is None or plan.max_concurrency >= min_concurrency
        tried = DerivedLayout(layout, plan, plan.fits and enough and fits_node(layout))
        if tried.holds:
            return tried
    return tried
