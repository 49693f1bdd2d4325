"""Plan every saved point again with the current kvq.planner: no GPU needed.

A point keeps the config.json the engine was given (`config`) and the spec's settings
(`settings`), so when the planner changes, `run.py report` recomputes the plan and its
error against what vLLM measured at the time; the plan of the run stays as
`plan_at_run`. Points of runs older than those keys are planned from the catalog row and
the settings in their saved command.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gputier.compare import capacity_record
from gputier.gpu import GpuInfo, catalog_gpu
from gputier.points import MAX_MODEL_LEN, PlanSettings, plan_config, plan_record
from gputier.shapes import config_json


def _argument(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def point_inputs(record: dict[str, Any]) -> tuple[dict[str, Any], PlanSettings]:
    """The config.json and settings a saved point was planned (and served) with."""
    config = record.get("config") or config_json(record["shape"], record.get("layers"))
    if "settings" in record:
        return config, PlanSettings(**record["settings"])
    command = record["command"]
    length = _argument(command, "--max-model-len")
    utilization = _argument(command, "--gpu-memory-utilization")
    return config, PlanSettings(
        kv_cache_dtype=record["dtype"],
        max_model_len=int(length) if length else MAX_MODEL_LEN,
        gpu_memory_utilization=float(utilization) if utilization else 0.90,
    )


def replan(document: dict[str, Any], *, planner_commit: str | None = None) -> dict[str, Any]:
    """The document with every point's plan (and capacity error) from today's planner."""
    gpu = catalog_gpu(GpuInfo(**document["gpu"]))
    for record in document["points"]:
        config, settings = point_inputs(record)
        record.setdefault("plan_at_run", record["plan"])
        record["plan"] = plan_record(plan_config(config, gpu, settings))
        capacity = record.get("capacity")
        if capacity:
            record["capacity"] = capacity_record(
                capacity["measured_kv_tokens"],
                (record.get("startup") or {}).get("max_concurrency"),
                record["plan"],
            )
    document["replanned"] = {
        "at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kvq_commit": planner_commit,
    }
    return document
