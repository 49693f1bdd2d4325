"""Figures vLLM prints at start-up and exposes on /metrics, read from their text.

Pure: tested against the captured H200 logs (tests/fixtures/vllm/h200-v0.26.0-*) and the
captured /metrics pages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

_NUMBER = r"([\d,]+(?:\.\d+)?)"
_PATTERNS = {
    "kv_tokens": re.compile(rf"GPU KV cache size: {_NUMBER} tokens"),
    "available_kv_gib": re.compile(rf"Available KV cache memory: {_NUMBER} GiB"),
    "weights_gib": re.compile(rf"Model loading took {_NUMBER} GiB"),
    "max_num_batched_tokens": re.compile(rf"max_num_batched_tokens={_NUMBER}"),
    "init_engine_s": re.compile(
        rf"init engine \(profile, create kv cache, warmup model\) took "
        rf"{_NUMBER} s"
    ),
}
_CONCURRENCY = re.compile(rf"Maximum concurrency for {_NUMBER} tokens per request: {_NUMBER}x")
_BACKEND = re.compile(r"Using (\w+) attention backend")
# The hybrid KV-cache manager (vllm/v1/core/kv_cache_utils.py, 0.26): sliding-window /
# chunked / Mamba groups unified to one page size by padding layers.
_PADDING = re.compile(rf"Add (\d+) padding layers, may waste at most {_NUMBER}% KV cache memory")
_HYBRID_OFF = "Hybrid KV cache manager is disabled for this hybrid model"
# vllm/platforms/interface.py (0.26): a hybrid Mamba model's attention block size is raised
# until an attention page holds a Mamba state; the state page is padded to match.
_BLOCK_SIZE = re.compile(r"Setting attention block size to (\d+) tokens")
_MAMBA_PADDING = re.compile(rf"Padding mamba page size by {_NUMBER}%")
# Start-up lines about the KV cache, kept verbatim (the message after vLLM's log prefix).
_KV_LINE = re.compile(
    r"KV cache|padding layers|attention block size|mamba page size|Maximum concurrency|"
    r"max_model_len|[Hh]ybrid|kv_cache_dtype|chunked local attention|sliding window"
)
_LOG_PREFIX = re.compile(r"^(?:\([^)]*\)\s+)?(?:[A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]*\] )?")
_FA_VERSION = re.compile(r"Using FlashAttention version (\d+)")
# gpu_worker.py's summary after start-up (vLLM 0.2x).
_USAGE = re.compile(
    rf"Free memory on device \({_NUMBER}/{_NUMBER} GiB\) on startup\. Desired GPU memory "
    rf"utilization is \({_NUMBER}, {_NUMBER} GiB\)\. Actual usage is {_NUMBER} GiB for weight, "
    rf"{_NUMBER} GiB for peak activation, {_NUMBER} GiB for non-torch memory, and {_NUMBER} GiB "
    r"for CUDAGraph memory"
)
SERVING_MARKER = "Application startup complete"


def _number(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass(frozen=True)
class StartupFigures:
    """What one vLLM start-up printed (None where the log does not say)."""

    kv_tokens: int | None = None
    available_kv_gib: float | None = None
    max_model_len: int | None = None
    max_concurrency: float | None = None
    weights_gib: float | None = None
    peak_activation_gib: float | None = None
    non_torch_gib: float | None = None
    cudagraph_gib: float | None = None
    cuda_free_gib: float | None = None
    cuda_total_gib: float | None = None
    requested_gib: float | None = None
    max_num_batched_tokens: int | None = None
    attention_backend: str | None = None
    flash_attention_version: int | None = None
    init_engine_s: float | None = None
    padding_layers: int | None = None
    padding_waste_pct: float | None = None
    attention_block_size: int | None = None
    mamba_padding_pct: float | None = None
    hybrid_manager_disabled: bool = False
    kv_cache_lines: tuple[str, ...] = ()
    serving: bool = False


def parse_startup(log: str) -> StartupFigures:
    found: dict[str, object] = {}
    for key, pattern in _PATTERNS.items():
        match = pattern.search(log)
        if match:
            value = _number(match.group(1))
            found[key] = int(value) if key in ("kv_tokens", "max_num_batched_tokens") else value
    if match := _CONCURRENCY.search(log):
        found["max_model_len"] = int(_number(match.group(1)))
        found["max_concurrency"] = _number(match.group(2))
    if match := _BACKEND.search(log):
        found["attention_backend"] = match.group(1)
    if match := _FA_VERSION.search(log):
        found["flash_attention_version"] = int(match.group(1))
    if match := _USAGE.search(log):
        free, total, _util, requested, weights, activation, non_torch, graphs = (
            _number(g) for g in match.groups()
        )
        found.update(
            cuda_free_gib=free,
            cuda_total_gib=total,
            requested_gib=requested,
            weights_gib=weights,
            peak_activation_gib=activation,
            non_torch_gib=non_torch,
            cudagraph_gib=graphs,
        )
    if match := _PADDING.search(log):
        found["padding_layers"] = int(match.group(1))
        found["padding_waste_pct"] = _number(match.group(2))
    if match := _BLOCK_SIZE.search(log):
        found["attention_block_size"] = int(match.group(1))
    if match := _MAMBA_PADDING.search(log):
        found["mamba_padding_pct"] = _number(match.group(1))
    found["hybrid_manager_disabled"] = _HYBRID_OFF in log
    found["kv_cache_lines"] = kv_cache_lines(log)
    found["serving"] = SERVING_MARKER in log
    return StartupFigures(**found)  # type: ignore[arg-type]


def kv_cache_lines(log: str, limit: int = 40) -> tuple[str, ...]:
    """The start-up log's lines about the KV cache, without the log prefix, each once."""
    seen: dict[str, None] = {}
    for line in log.splitlines():
        if _KV_LINE.search(line) and "Avg prompt throughput" not in line:
            seen.setdefault(_LOG_PREFIX.sub("", line.strip())[:300], None)
    return tuple(seen)[:limit]


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_metrics(text: str) -> list[Sample]:
    """Every sample of a Prometheus text page (counters keep their `_total` name)."""
    return [
        Sample(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def gauge(samples: list[Sample], name: str) -> float | None:
    """The largest value of a gauge across its label sets (one engine: its only value)."""
    values = [s.value for s in samples if s.name == name]
    return max(values) if values else None


def counter(samples: list[Sample], name: str) -> float:
    """A counter summed over its label sets (0 when absent)."""
    total = name if name.endswith("_total") else f"{name}_total"
    return sum(s.value for s in samples if s.name in (name, total))


@dataclass(frozen=True)
class CacheConfig:
    cache_dtype: str
    block_size: int
    num_gpu_blocks: int

    @property
    def kv_tokens(self) -> int:
        return self.block_size * self.num_gpu_blocks


def cache_config(samples: list[Sample]) -> CacheConfig | None:
    """`vllm:cache_config_info`'s labels: the dtype and the KV blocks the engine allocated."""
    for s in samples:
        if s.name == "vllm:cache_config_info":
            blocks = s.labels.get("num_gpu_blocks", "None")
            if not blocks.isdigit():
                return None
            return CacheConfig(
                cache_dtype=s.labels.get("cache_dtype", ""),
                block_size=int(s.labels.get("block_size", "0")),
                num_gpu_blocks=int(blocks),
            )
    return None
