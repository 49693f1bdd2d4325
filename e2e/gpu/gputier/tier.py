"""Runs the tier's points on this machine's GPU, one vLLM server at a time.

For each point: write the pod's files (the wrapper the ConfigMap would mount, the model
directory the PVC would hold), start kvq's rendered command with e2e/engine/server.py,
read what vLLM reports, run the load where asked, stop it, and keep every figure. A
result document is written after each point, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gputier.compare import capacity_record, classify, judge
from gputier.gpu import GpuInfo, pool_for
from gputier.load import LoadSpec, run_load
from gputier.points import (
    DTYPES,
    MAX_MODEL_LEN,
    Point,
    PointKey,
    RenderedPoint,
    check_point,
    parse_shape,
    plan_command,
    plan_config,
    plan_record,
    predict,
    render_point,
    settings_of,
)
from gputier.shapes import DEFAULT_SHAPES, layer_period, tier_config, write_model_dir
from gputier.vllm_output import cache_config, parse_metrics, parse_startup
from kvq.placement.pool import NodePool
from kvq.render.args import ENGINE_PORT, WRAPPER_PATH
from kvq.render.manifests import evidence_script

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "e2e" / "engine"))
import server  # noqa: E402

START_DEADLINE_S = 240.0
# A point takes about this long (start, probe, stop); no new point starts with less left.
POINT_BUDGET_S = 75.0
LOAD_BUDGET_S = 40.0
GPU_IDLE_MIB = 2048
GIB = 1 << 30
HARNESS_ADDS = (
    "KVQ_TERMINATION_LOG=<run dir>/<point>.termination-log (a pod uses /dev/termination-log)",
    "the wrapper written to /opt/kvq/evidence_wrapper.py (a pod mounts it from kvq's ConfigMap)",
    "config.json written to /models/gpu-tier/<shape> (a pod mounts the PVC there)",
    "PYTHONPATH with the offline vLLM bundle and kvq (a pod has vLLM in its image)",
)


@dataclass(frozen=True)
class TierConfig:
    shapes: tuple[str, ...] = DEFAULT_SHAPES
    """Catalog names, each optionally `:len=N`, `:layers=N`, `:tp=N`, `:pp=N`
    (gputier.points.parse_shape)."""
    dtypes: tuple[str, ...] = DTYPES
    max_model_len: int = MAX_MODEL_LEN
    layers: int | None = None
    load_points: frozenset[tuple[str, str]] = frozenset(
        {("llama-3-8b", "auto"), ("llama-3-8b", "fp8"), ("llama-3-8b", "int8")}
    )
    load: LoadSpec = field(default_factory=LoadSpec)
    python: str = "python3"
    deadline_s: float = 540.0
    start_deadline_s: float = START_DEADLINE_S
    point_budget_s: float = POINT_BUDGET_S
    """What one point (start, probe, stop) is expected to take: no point starts with less
    left before `deadline_s`. 75 s fits the dense shapes; a large MoE or a hybrid model
    with Triton kernels to compile takes longer."""
    label: str = ""
    port: int = ENGINE_PORT
    skip: frozenset[PointKey] = frozenset()
    """Points an earlier run already measured (run.py --skip-done): `Point.key`s."""
    pod_root: Path = Path("/")
    """Where the pod's files go: `/` on the GPU machine; elsewhere (tests) the command's
    /opt/kvq and /models paths are pointed there."""

    def points(self) -> list[Point]:
        shapes = [parse_shape(s, self.max_model_len, self.layers) for s in self.shapes]
        points = [
            Point(s.shape, d, s.max_model_len, s.layers, s.tensor, s.pipeline)
            for s in shapes
            for d in self.dtypes
        ]
        return [p for p in points if p.key not in self.skip]

    def checked_points(self, info: GpuInfo) -> list[Point]:
        """The points, PointError for the first one this machine cannot run as asked."""
        points = self.points()
        for point in points:
            check_point(point, info.count, info.name)
        return points


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def versions() -> dict[str, str | None]:
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    commit = os.environ.get("KVQ_COMMIT")
    if commit is None and shutil.which("git"):
        done = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        )
        commit = done.stdout.strip() or None
    return {
        "vllm": version("vllm"),
        "torch": version("torch"),
        "triton": version("triton"),
        "transformers": version("transformers"),
        "python": platform.python_version(),
        "kvq_commit": commit,
    }


def describe_point(rendered: RenderedPoint, pool: NodePool) -> dict[str, Any]:
    """Everything known before the engine starts: command, prediction, plan."""
    point = rendered.point
    prediction = predict(point, pool)
    config, changes = tier_config(point.shape, point.layers)
    settings = settings_of(point)
    full_layers = int(tier_config(point.shape)[0]["num_hidden_layers"])
    return {
        "shape": point.shape,
        "dtype": point.dtype,
        "max_model_len": point.max_model_len,
        "layers": point.layers,
        "tensor_parallel": point.tensor,
        "pipeline_parallel": point.pipeline,
        "model_layers": full_layers,
        "layer_period": layer_period(config),
        "config_changes": changes,
        "inference_service": point.name,
        "rendered_for": rendered.rendered_for,
        "substitution": rendered.substitution,
        "command": list(rendered.command),
        "env": rendered.env,
        "prediction": asdict(prediction),
        "config": config,
        "settings": asdict(settings),
        "plan": plan_record(plan_config(config, pool.gpu, settings)),
        "plan_command": plan_command(point, pool),
        "outcome": "not run",
    }


def pod_path(path: str, pod_root: Path) -> str:
    return path if pod_root == Path("/") else str(pod_root / path.lstrip("/"))


def command_under(rendered: RenderedPoint, pod_root: Path) -> list[str]:
    """The rendered command; with a pod root other than `/`, its pod paths moved there."""
    if pod_root == Path("/"):
        return list(rendered.command)
    moved = (WRAPPER_PATH, rendered.model_dir)
    return [pod_path(arg, pod_root) if arg in moved else arg for arg in rendered.command]


def install_pod_files(rendered: RenderedPoint, pod_root: Path) -> None:
    """What the pod would have: the wrapper from the ConfigMap, the model on the PVC."""
    wrapper = Path(pod_path(WRAPPER_PATH, pod_root))
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(evidence_script())
    point = rendered.point
    write_model_dir(point.shape, Path(pod_path(rendered.model_dir, pod_root)), point.layers)


def gpu_memory_used_mib() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return max(int(float(v)) for v in out.split())


def wait_gpu_idle(timeout_s: float = 90.0) -> bool:
    """The last engine's memory is back before the next one measures what is free."""
    return server.wait_until(lambda: gpu_memory_used_mib() < GPU_IDLE_MIB, timeout_s, 0.5)


def run_point(
    rendered: RenderedPoint,
    record: dict[str, Any],
    run_dir: Path,
    config: TierConfig,
    gpu_idle: Callable[[], bool],
) -> None:
    point = rendered.point
    install_pod_files(rendered, config.pod_root)
    record["gpu_idle_before"] = gpu_idle()
    termination_log = run_dir / f"{point.name}.termination-log"
    termination_log.unlink(missing_ok=True)
    env = {**rendered.env, "KVQ_TERMINATION_LOG": str(termination_log)}
    log_path = run_dir / f"{point.name}.log"
    started_at = time.monotonic()
    try:
        started = server.start_server(
            command_under(rendered, config.pod_root),
            config.port,
            log_path,
            env=env,
            startup_deadline_s=config.start_deadline_s,
        )
    except TimeoutError as error:
        record.update(outcome="timeout", error=str(error))
        if log_path.exists():  # what it printed before the deadline (KV cache lines)
            record["startup"] = asdict(parse_startup(log_path.read_text(errors="replace")))
        return
    record["start_s"] = round(time.monotonic() - started_at, 1)
    if isinstance(started, server.StartupFailure):
        message = termination_log.read_text() if termination_log.exists() else ""
        verdict = classify(message, started.exit_code, point.dtype)
        record.update(
            outcome="crashed",
            startup=asdict(parse_startup(started.log)),
            failure={
                "exit_code": started.exit_code,
                "termination_message": message,
                "class": str(verdict.kind),
                "fallback": verdict.fallback,
                "reason": verdict.reason,
            },
            verdict=judge(record["prediction"]["runs"], False, verdict.fallback),
        )
        return
    try:
        figures = parse_startup(started.log())
        cache = cache_config(parse_metrics(started.get_text("/metrics")))
        measured = figures.kv_tokens or (cache.kv_tokens if cache else None)
        record.update(
            outcome="served",
            startup=asdict(figures),
            cache_config_info=asdict(cache) if cache else None,
            verdict=judge(record["prediction"]["runs"], True, None),
        )
        if measured:
            record["capacity"] = capacity_record(measured, figures.max_concurrency, record["plan"])
        if (point.shape, point.dtype) in config.load_points:
            result = run_load(started.base_url, point.name, config.load)
            record["load"] = {
                **{k: v for k, v in asdict(result).items() if k != "latencies_s"},
                "p50_s": result.latency(50),
                "p95_s": result.latency(95),
                "output_tokens_per_s": round(result.output_tokens_per_s, 1),
                "total_tokens_per_s": round(result.total_tokens_per_s, 1),
            }
    finally:
        exit_code = started.stop()
        record["stop_exit_code"] = exit_code
        if termination_log.exists():
            record["termination_message_after_stop"] = termination_log.read_text()


def run_tier(
    info: GpuInfo,
    config: TierConfig,
    run_dir: Path,
    write: Callable[[dict[str, Any]], None],
    *,
    clock: Callable[[], float] = time.monotonic,
    gpu_idle: Callable[[], bool] = wait_gpu_idle,
) -> dict[str, Any]:
    pool = pool_for(info)
    started = clock()
    document = new_document(info, pool, config)
    rendered_points = [
        render_point(p, pool, python=config.python, port=config.port)
        for p in config.checked_points(info)
    ]
    records = [describe_point(r, pool) for r in rendered_points]
    document["points"] = records
    write(document)
    for rendered, record in zip(rendered_points, records, strict=True):
        needed = config.point_budget_s + (LOAD_BUDGET_S if _loads(rendered, config) else 0)
        if clock() - started + needed > config.deadline_s:
            record["outcome"] = "not run"
            record["why_not_run"] = f"time budget ({config.deadline_s:.0f} s for this run)"
            continue
        point_started = clock()
        run_point(rendered, record, run_dir, config, gpu_idle)
        record["total_s"] = round(clock() - point_started, 1)
        write(document)
    document["finished"] = utc_now()
    document["wall_s"] = round(clock() - started, 1)
    write(document)
    return document


def _loads(rendered: RenderedPoint, config: TierConfig) -> bool:
    return (rendered.point.shape, rendered.point.dtype) in config.load_points


def new_document(info: GpuInfo, pool: NodePool, config: TierConfig) -> dict[str, Any]:
    return {
        "tier": "kvq GPU tier (make test-gpu)",
        "started": utc_now(),
        "label": config.label,
        "gpu": asdict(info),
        "pool": {
            "name": pool.name,
            "product": pool.gpu.product,
            "compute_capability": pool.gpu.compute_capability_str,
            "catalog_memory_mib": pool.gpu.memory_mib,
            "catalog_cuda_total_mib": pool.gpu.cuda_total_mib,
            "gpus_per_node": pool.gpus_per_node,
        },
        "versions": versions(),
        "weights": "dummy (--load-format dummy): random weights from kvq's catalog shapes; "
        "no tokenizer (--skip-tokenizer-init), prompts are token ids",
        "harness_adds": list(HARNESS_ADDS),
        "load": {**asdict(config.load), "description": config.load.describe()},
        "load_points": sorted(f"{s}/{d}" for s, d in config.load_points),
    }


def dry_run(info: GpuInfo, config: TierConfig) -> list[str]:
    """The commands the tier would run, one block per point, nothing started."""
    pool = pool_for(info)
    lines = [f"# GPU {info.name} ({info.memory_mib} MiB) x{info.count} -> pool {pool.name}"]
    for point in config.checked_points(info):
        rendered = render_point(point, pool, python=config.python, port=config.port)
        record = describe_point(rendered, pool)
        env = " ".join(f"{k}={v}" for k, v in sorted(rendered.env.items()))
        layers = (
            "" if point.layers is None else f", {point.layers} of {record['model_layers']} layers"
        )
        layout = f", TP {point.tensor} x PP {point.pipeline}" if point.gpus > 1 else ""
        lines.append(
            f"# {point.name} ({point.shape}{layers}{layout}, max len {point.max_model_len:,}): "
            "predicted "
            f"{'runs' if record['prediction']['runs'] else 'refused'}; "
            f"plan {record['plan']['kv_tokens']:,} KV tokens, "
            f"concurrency {record['plan']['max_concurrency']:.2f}x"
        )
        lines += [f"#   config.json: {change}" for change in record["config_changes"]]
        if rendered.substitution:
            lines.append(f"#   {rendered.substitution}")
        if record["prediction"]["slow_warning"]:
            lines.append(f"#   catalog warning: {record['prediction']['slow_warning']}")
        lines.append(
            f"{env} KVQ_TERMINATION_LOG=<run dir>/{point.name}.termination-log "
            + " ".join(rendered.command)
        )
        lines += plan_lines(record["plan"], point)
        lines.append(f"#   plan: {record['plan_command']}")
        if _loads(rendered, config):
            lines.append(f"#   load: {config.load.describe()}")
    return lines


def plan_lines(plan: dict[str, Any], point: Point) -> list[str]:
    """What kvq plans for one GPU of the replica, and for one GPU of each stage."""
    if point.gpus == 1:
        return []

    def gib(n: int) -> str:
        return f"{n / GIB:.2f} GiB"

    lines = [
        f"#   per GPU ({point.gpus} GPUs: TP {point.tensor} x PP {point.pipeline}): weights "
        f"{gib(plan['weight_bytes'])}, activations {gib(plan['activation_bytes'])}, KV "
        f"{gib(plan['available_kv_bytes'])}, KV bytes per token "
        f"{plan['kv_bytes_per_token_per_gpu']:,} on a GPU ({plan['kv_bytes_per_token']:,} "
        f"the whole model), {plan['num_blocks']:,} blocks"
        + (f" (stage {plan['bounding_stage']} bounds)" if plan["stages"] else "")
    ]
    for i, stage in enumerate(plan["stages"]):
        last = stage["first_layer"] + stage["layers"] - 1
        lines.append(
            f"#   stage {i}: layers {stage['first_layer']}-{last}, weights "
            f"{gib(stage['weight_bytes'])}, activations {gib(stage['activation_bytes'])}, KV "
            f"{gib(stage['available_kv_bytes'])}, {stage['num_blocks']:,} blocks per GPU"
        )
    return lines


def write_json(path: Path) -> Callable[[dict[str, Any]], None]:
    def write(document: dict[str, Any]) -> None:
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
        partial.replace(path)

    return write


def parse_points(items: Iterable[str]) -> frozenset[tuple[str, str]]:
    """`shape/dtype` strings -> pairs."""
    pairs = set()
    for item in items:
        shape, _, dtype = item.partition("/")
        if not dtype:
            raise ValueError(f"expected shape/dtype, got {item!r}")
        pairs.add((shape, dtype))
    return frozenset(pairs)
