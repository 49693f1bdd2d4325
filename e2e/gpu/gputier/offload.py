"""The CPU tier on a real GPU: kvq's command with memory.swapSpaceGiB, against the same
command without it, under a load whose shared prefixes do not fit in the GPU's KV cache.

Each point starts kvq's rendered command for the Llama-3-8B shape (dummy weights), with
the GPU KV cache shrunk by vLLM's own `--kv-cache-memory-bytes` (appended by the harness:
a stand-in for a smaller GPU, as the engine tier does; kvq manages that flag, so its CRD
refuses it in extraArgs) so the working set is quick to build. Then two passes of the
same prefixes, one request at a time:

- pass 1: each of N prefixes of P tokens once, with its own suffix: the GPU cache fills
  and evicts (least recently used first); with the tier, every block is also stored in
  host memory;
- pass 2: the same prefixes in the same order, new suffixes: without the tier the GPU
  has long evicted each prefix before it comes back (N x P is several times the GPU
  cache) and recomputes it; with the tier the prefix is loaded from host memory.

Per pass: vLLM's prefix-cache counters (`vllm:prefix_cache_*`: hits in the GPU cache;
`vllm:external_prefix_cache_*`: hits the KV connector served, i.e. from host memory),
the bytes moved each way (`vllm:kv_offload_load_bytes`, `..._store_bytes`), time to first
token (each request asks for one token, so its latency is its TTFT; and vLLM's own
`vllm:time_to_first_token_seconds` mean), and the peak `vllm:kv_cache_usage_perc`.
The log must name the connector (`Creating v1 connector with name: OffloadingConnector`)
and the size kvq rendered (vLLM's `non-default args` line).
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gputier.load import KV_USAGE, POLL_S
from gputier.points import Point, inference_service, model_path, plan_point, settings_for
from gputier.vllm_output import Sample, counter, gauge, parse_metrics, parse_startup
from kvq.api.resource import InferenceService
from kvq.placement.pool import NodePool
from kvq.planner.host_tier import plan_host_tier
from kvq.render import container_command
from kvq.render.args import ENGINE_PORT

SHAPE = "llama-3-8b"
KV_CACHE_FLAG = "--kv-cache-memory-bytes"
CONNECTOR_LINE = "Creating v1 connector with name: "
# The counters read per pass, by the name vLLM gives them (the page adds `_total`).
COUNTERS = {
    "gpu_prefix_queries": "vllm:prefix_cache_queries",
    "gpu_prefix_hits": "vllm:prefix_cache_hits",
    "tier_prefix_queries": "vllm:external_prefix_cache_queries",
    "tier_prefix_hits": "vllm:external_prefix_cache_hits",
    "tier_load_bytes": "vllm:kv_offload_load_bytes",
    "tier_store_bytes": "vllm:kv_offload_store_bytes",
    "ttft_sum_s": "vllm:time_to_first_token_seconds_sum",
    "ttft_count": "vllm:time_to_first_token_seconds_count",
}


@dataclass(frozen=True)
class OffloadLoad:
    """The working set: `prefixes` x `prefix_tokens` shared tokens, each prefix asked twice."""

    prefixes: int = 32
    prefix_tokens: int = 2048
    suffix_tokens: int = 32
    seed: int = 7
    token_low: int = 1000
    token_high: int = 30000

    @property
    def working_set_tokens(self) -> int:
        return self.prefixes * self.prefix_tokens

    def describe(self) -> str:
        return (
            f"{self.prefixes} prefixes of {self.prefix_tokens:,} random token ids "
            f"({self.working_set_tokens:,} tokens), each + a {self.suffix_tokens}-token "
            "suffix of its own, one request at a time asking for 1 token; pass 2 repeats "
            "the prefixes in the same order with new suffixes"
        )

    def requests(self, pass_number: int) -> list[list[int]]:
        prefixes = random.Random(self.seed)
        suffixes = random.Random(self.seed * 1000 + pass_number)
        out = []
        for _ in range(self.prefixes):
            prefix = [
                prefixes.randrange(self.token_low, self.token_high)
                for _ in range(self.prefix_tokens)
            ]
            suffix = [
                suffixes.randrange(self.token_low, self.token_high)
                for _ in range(self.suffix_tokens)
            ]
            out.append(prefix + suffix)
        return out


@dataclass(frozen=True)
class OffloadPoint:
    """One engine start: a KV dtype, with or without the CPU tier."""

    dtype: str
    swap_space_gib: float | None

    @property
    def name(self) -> str:
        tier = f"tier{self.swap_space_gib:g}" if self.swap_space_gib else "notier"
        return f"offload-{self.dtype.replace('_', '-')}-{tier}"

    @property
    def key(self) -> str:
        return f"{self.dtype}/{self.swap_space_gib or 0:g}"


@dataclass(frozen=True)
class OffloadConfig:
    points: tuple[OffloadPoint, ...] = (
        OffloadPoint("auto", None),
        OffloadPoint("auto", 16.0),
        OffloadPoint("fp8", 16.0),
    )
    gpu_kv_cache_bytes: int = 2 << 30
    """The GPU KV cache (auto: 16,384 tokens of Llama-3-8B, a quarter of the working set)."""
    load: OffloadLoad = field(default_factory=OffloadLoad)


def offload_service(point: OffloadPoint) -> InferenceService:
    """The InferenceService a user would write: the tier's usual one, plus the CPU tier."""
    base = inference_service(Point(SHAPE, point.dtype), name=point.name)
    if point.swap_space_gib is None:
        return base
    document = base.to_kube()
    document["spec"]["memory"]["swapSpaceGiB"] = point.swap_space_gib
    return InferenceService.model_validate(document)


def offload_command(
    point: OffloadPoint,
    pool: NodePool,
    config: OffloadConfig,
    *,
    python: str = "python3",
    port: int = ENGINE_PORT,
) -> list[str]:
    """kvq's container command, with the GPU cache shrunk (the harness's one addition)."""
    isvc = offload_service(point)
    command = container_command(isvc, pool, settings_for(isvc, pool), python=python, port=port)
    return [*command, KV_CACHE_FLAG, str(config.gpu_kv_cache_bytes)]


def planned_tiers(point: OffloadPoint, pool: NodePool, config: OffloadConfig) -> dict[str, Any]:
    """What kvq predicts for the point: the GPU cache at the shrunk size, the CPU tier."""
    isvc = offload_service(point)
    plan = plan_point(Point(SHAPE, point.dtype), pool)
    gpu_tokens = (config.gpu_kv_cache_bytes // plan.block_bytes_per_gpu) * plan.block_size
    out: dict[str, Any] = {
        "gpu_tokens": gpu_tokens,
        "gpu_bytes": config.gpu_kv_cache_bytes,
        "kv_bytes_per_token": plan.kv_bytes_per_token,
    }
    tier = settings_for(isvc, pool).cpu_tier
    if tier is not None:
        engine_dtype = container_command(isvc, pool, settings_for(isvc, pool))
        dtype = engine_dtype[engine_dtype.index("--kv-cache-dtype") + 1]
        host = plan_host_tier(tier, point.swap_space_gib, plan, dtype)
        out["cpu_tier"] = {
            "mode": host.mode,
            "backend": host.backend,
            "connector": host.connector,
            "tokens": host.tokens,
            "bytes": host.bytes,
            "dtype": host.kv_cache_dtype,
        }
    return out


def log_checks(log: str, point: OffloadPoint) -> dict[str, Any]:
    """The connector the log names, and whether vLLM took the size kvq rendered."""
    connector = None
    for line in log.splitlines():
        if CONNECTOR_LINE in line:
            connector = line.split(CONNECTOR_LINE, 1)[1].split(" ", 1)[0]
            break
    size = None
    for line in log.splitlines():
        if "non-default args" in line and "kv_offloading_size" in line:
            tail = line.split("'kv_offloading_size':", 1)[1]
            size = float(tail.split(",", 1)[0].split("}", 1)[0])
            break
    return {
        "connector": connector,
        "kv_offloading_size_gib": size,
        "expected_size_gib": point.swap_space_gib,
        "names_connector": connector is not None if point.swap_space_gib else connector is None,
        "size_matches": size == point.swap_space_gib if point.swap_space_gib else size is None,
    }


def _post(url: str, body: dict[str, object], timeout_s: float = 120.0) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def _metrics(base_url: str) -> list[Sample]:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as response:
        return parse_metrics(response.read().decode())


def _counters(samples: list[Sample]) -> dict[str, float]:
    return {key: counter(samples, name) for key, name in COUNTERS.items()}


def run_pass(base_url: str, model: str, prompts: list[list[int]]) -> dict[str, Any]:
    """The prompts one at a time (1 token each); the counters' movement and the TTFTs."""
    peak: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:
                value = gauge(_metrics(base_url), KV_USAGE)
            except OSError:
                value = None
            if value is not None:
                peak.append(value)
            done.wait(POLL_S)

    before = _counters(_metrics(base_url))
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    ttfts: list[float] = []
    errors = 0
    started = time.monotonic()
    for prompt in prompts:
        body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
        t0 = time.monotonic()
        try:
            _post(f"{base_url}/v1/completions", body)
        except OSError:
            errors += 1
            continue
        ttfts.append(time.monotonic() - t0)
    wall = time.monotonic() - started
    done.set()
    poller.join(timeout=10)
    # The engine publishes counters each logging step: wait until the TTFT count moved.
    deadline = time.monotonic() + 15
    after = _counters(_metrics(base_url))
    while after["ttft_count"] - before["ttft_count"] < len(ttfts) and time.monotonic() < deadline:
        time.sleep(0.5)
        after = _counters(_metrics(base_url))
    moved = {key: after[key] - before[key] for key in COUNTERS}
    ordered = sorted(ttfts)
    return {
        "requests": len(prompts),
        "errors": errors,
        "wall_s": round(wall, 3),
        "ttft_mean_s": round(sum(ttfts) / len(ttfts), 4) if ttfts else None,
        "ttft_p50_s": round(ordered[len(ordered) // 2], 4) if ordered else None,
        "engine_ttft_mean_s": round(moved["ttft_sum_s"] / moved["ttft_count"], 4)
        if moved["ttft_count"]
        else None,
        "peak_kv_usage": max(peak) if peak else None,
        "gpu_hit_rate": _rate(moved["gpu_prefix_hits"], moved["gpu_prefix_queries"]),
        "tier_hit_rate": _rate(moved["tier_prefix_hits"], moved["tier_prefix_queries"]),
        **{key: int(value) for key, value in moved.items() if not key.startswith("ttft")},
    }


def _rate(hits: float, queries: float) -> float | None:
    return round(hits / queries, 4) if queries else None


def run_offload_point(
    point: OffloadPoint,
    record: dict[str, Any],
    started: Any,
    config: OffloadConfig,
) -> None:
    """With a started engine: the log checks, both passes, the stored bytes per token."""
    log = started.log()
    record["startup"] = asdict(parse_startup(log))
    record["log"] = log_checks(log, point)
    passes = [run_pass(started.base_url, point.name, config.load.requests(n)) for n in (1, 2)]
    record["passes"] = passes
    second = passes[1]
    if second["tier_prefix_hits"] and record["plan"].get("cpu_tier"):
        # What one token costs in host memory, measured: bytes loaded back per token hit.
        record["loaded_bytes_per_token"] = round(
            second["tier_load_bytes"] / second["tier_prefix_hits"], 1
        )


def describe(
    point: OffloadPoint, pool: NodePool, config: OffloadConfig, python: str
) -> dict[str, Any]:
    return {
        "point": point.key,
        "name": point.name,
        "dtype": point.dtype,
        "swap_space_gib": point.swap_space_gib,
        "command": offload_command(point, pool, config, python=python),
        "plan": planned_tiers(point, pool, config),
        "model_dir": model_path(SHAPE),
        "outcome": "not run",
    }


def dry_run_lines(pool: NodePool, config: OffloadConfig, python: str) -> list[str]:
    lines = [
        f"# CPU tier (offload) points: {len(config.points)} engine starts; load: "
        f"{config.load.describe()}; GPU KV cache {config.gpu_kv_cache_bytes:,} bytes "
        "(--kv-cache-memory-bytes, appended by the harness)"
    ]
    for point in config.points:
        record = describe(point, pool, config, python)
        plan = record["plan"]
        tier = plan.get("cpu_tier")
        lines.append(
            f"# {point.key}: GPU {plan['gpu_tokens']:,} tokens"
            + (
                f"; CPU tier {tier['mode']} {tier['backend']} ({tier['connector']}): "
                f"{tier['tokens']:,} tokens, {tier['bytes']:,} bytes, {tier['dtype']}"
                if tier
                else "; no CPU tier"
            )
        )
        lines.append(" ".join(record["command"]))
    return lines


def markdown(records: list[dict[str, Any]], load: dict[str, Any]) -> list[str]:
    """The side-by-side table of the report."""
    if not records:
        return []
    out = [
        "",
        "## The CPU tier (memory.swapSpaceGiB): KV offloading under shared prefixes",
        "",
        f"Load: {load.get('description', '')}.",
        "",
        "| point | connector (log) | size (log) | pass | GPU prefix hits | CPU-tier hits | "
        "loaded from host | TTFT mean | TTFT p50 | vLLM TTFT mean | peak KV usage |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for record in records:
        checks = record.get("log") or {}
        for number, found in enumerate(record.get("passes") or [], start=1):
            out.append(
                f"| {record['point']} | {checks.get('connector') or '-'} | "
                f"{checks.get('kv_offloading_size_gib') or '-'} | {number} | "
                f"{_share(found['gpu_prefix_hits'], found['gpu_prefix_queries'])} | "
                f"{_share(found['tier_prefix_hits'], found['tier_prefix_queries'])} | "
                f"{found['tier_load_bytes'] / 2**20:,.0f} MiB | "
                f"{_ms(found['ttft_mean_s'])} | {_ms(found['ttft_p50_s'])} | "
                f"{_ms(found['engine_ttft_mean_s'])} | {_percent(found['peak_kv_usage'])} |"
            )
        if record.get("outcome") != "served":
            out.append(f"| {record['point']} | {record.get('outcome')} | | | | | | | | | |")
    for record in records:
        if record.get("loaded_bytes_per_token"):
            tier = record["plan"]["cpu_tier"]
            out.append(
                f"\n{record['point']}: {record['loaded_bytes_per_token']:,} bytes loaded from host "
                f"memory per token hit: the tier stores {tier['dtype']} as the GPU cache does "
                f"(kvq plans {record['plan']['kv_bytes_per_token']:,} bytes per token), and holds "
                f"{tier['tokens']:,} tokens in {tier['bytes'] / 2**30:.0f} GiB by kvq's plan."
            )
    return out


def _percent(share: float | None) -> str:
    # The gauge is polled every POLL_S; a pass of one-token requests can end between polls.
    return "-" if share is None else f"{share:.1%}"


def _share(hits: int, queries: int) -> str:
    return f"{hits:,} / {queries:,}" if queries else "-"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.1f} ms"


__all__ = [
    "OffloadConfig",
    "OffloadLoad",
    "OffloadPoint",
    "describe",
    "dry_run_lines",
    "log_checks",
    "markdown",
    "offload_command",
    "offload_service",
    "planned_tiers",
    "run_offload_point",
    "run_pass",
]


def run_offload(
    pool: NodePool,
    document: dict[str, Any],
    config: OffloadConfig,
    run_dir: Path,
    write: Any,
    *,
    python: str = "python3",
    port: int = ENGINE_PORT,
    deadline_s: float = 540.0,
) -> dict[str, Any]:
    """Every offload point, one engine at a time; the document is rewritten after each."""
    from gputier.shapes import write_model_dir
    from gputier.tier import START_DEADLINE_S, server, wait_gpu_idle
    from kvq.render.args import WRAPPER_PATH
    from kvq.render.manifests import evidence_script

    started_at = time.monotonic()
    records = [describe(p, pool, config, python) for p in config.points]
    document["offload"] = {
        "load": {**asdict(config.load), "description": config.load.describe()},
        "gpu_kv_cache_bytes": config.gpu_kv_cache_bytes,
        "points": records,
    }
    write(document)
    wrapper = Path(WRAPPER_PATH)
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(evidence_script())
    write_model_dir(SHAPE, Path(model_path(SHAPE)))
    for point, record in zip(config.points, records, strict=True):
        if time.monotonic() - started_at + 150 > deadline_s:
            record["why_not_run"] = f"time budget ({deadline_s:.0f} s)"
            continue
        record["gpu_idle_before"] = wait_gpu_idle()
        log_path = run_dir / f"{point.name}.log"
        termination = run_dir / f"{point.name}.termination-log"
        t0 = time.monotonic()
        try:
            started = server.start_server(
                record["command"],
                port,
                log_path,
                env={"VLLM_USE_FLASHINFER_SAMPLER": "0", "KVQ_TERMINATION_LOG": str(termination)},
                startup_deadline_s=START_DEADLINE_S,
            )
        except TimeoutError as error:
            record.update(outcome="timeout", error=str(error))
            write(document)
            continue
        record["start_s"] = round(time.monotonic() - t0, 1)
        if isinstance(started, server.StartupFailure):
            message = termination.read_text() if termination.exists() else ""
            record.update(
                outcome="crashed", exit_code=started.exit_code, termination_message=message
            )
            write(document)
            continue
        try:
            record["outcome"] = "served"
            run_offload_point(point, record, started, config)
        finally:
            record["stop_exit_code"] = started.stop()
        write(document)
    document["finished_offload"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write(document)
    return document
