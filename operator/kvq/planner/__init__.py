"""kvq.planner: pure memory and KV-capacity arithmetic (see README.md here)."""

from kvq.planner.capacity import CapacityPlan, plan_all_dtypes, plan_capacity, plan_cpu_capacity

__all__ = ["CapacityPlan", "plan_all_dtypes", "plan_capacity", "plan_cpu_capacity"]
