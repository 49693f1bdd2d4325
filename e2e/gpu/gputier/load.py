"""The source document's check: one identical KV-bound load, sent all at once.

N requests of P random prompt token ids + M generated tokens (ignore_eos, fixed
max_tokens) through the OpenAI completions API, while /metrics is polled for the peak
KV-cache usage. Standard library only (threads + urllib), so it runs with the image's
Python and needs no tokenizer: the prompts are token ids, as `--skip-tokenizer-init`
requires.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gputier.vllm_output import counter, gauge, parse_metrics

KV_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions"
POLL_S = 0.2


@dataclass(frozen=True)
class LoadSpec:
    requests: int = 96
    prompt_tokens: int = 3000
    max_tokens: int = 256
    seed: int = 0
    # Token ids drawn below this (every catalog vocabulary is larger), away from the
    # special ids at the start.
    token_low: int = 1000
    token_high: int = 30000

    def describe(self) -> str:
        return (
            f"{self.requests} requests of {self.prompt_tokens:,} random prompt token ids + "
            f"{self.max_tokens} generated tokens (ignore_eos), all sent at once"
        )


@dataclass(frozen=True)
class LoadResult:
    wall_s: float
    ok: int
    failed: int
    prompt_tokens: int
    completion_tokens: int
    latencies_s: tuple[float, ...]
    peak_kv_usage: float | None
    preemptions: float
    first_error: str | None = None

    @property
    def output_tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def total_tokens_per_s(self) -> float:
        total = self.prompt_tokens + self.completion_tokens
        return total / self.wall_s if self.wall_s > 0 else 0.0

    def latency(self, q: float) -> float | None:
        return percentile(self.latencies_s, q)


def percentile(values: tuple[float, ...] | list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def prompts(spec: LoadSpec) -> list[list[int]]:
    """The same prompts for every dtype (one seed): identical load, no shared prefixes."""
    rng = random.Random(spec.seed)
    return [
        [rng.randrange(spec.token_low, spec.token_high) for _ in range(spec.prompt_tokens)]
        for _ in range(spec.requests)
    ]


def completion_body(model: str, prompt: list[int], spec: LoadSpec) -> dict[str, object]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": spec.max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }


def _post(url: str, body: dict[str, object], timeout_s: float) -> dict[str, object]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        answer: dict[str, object] = json.loads(response.read())
        return answer


def _get(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return str(response.read().decode())


def run_load(base_url: str, model: str, spec: LoadSpec, *, timeout_s: float = 300.0) -> LoadResult:
    """Sends every request at once and waits for all; polls /metrics meanwhile."""
    bodies = [completion_body(model, p, spec) for p in prompts(spec)]
    peak: list[float] = []
    done = threading.Event()
    before = parse_metrics(_get(f"{base_url}/metrics"))

    def poll() -> None:
        while not done.is_set():
            try:
                value = gauge(parse_metrics(_get(f"{base_url}/metrics")), KV_USAGE)
            except OSError:
                value = None
            if value is not None:
                peak.append(value)
            done.wait(POLL_S)

    def one(body: dict[str, object]) -> tuple[float, dict[str, object] | str]:
        start = time.monotonic()
        try:
            answer = _post(f"{base_url}/v1/completions", body, timeout_s)
        except OSError as error:
            return time.monotonic() - start, f"{type(error).__name__}: {error}"
        return time.monotonic() - start, answer

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=spec.requests) as pool:
        results = list(pool.map(one, bodies))
    wall = time.monotonic() - start
    done.set()
    poller.join(timeout=10)
    after = parse_metrics(_get(f"{base_url}/metrics"))
    return summarize(
        results,
        wall,
        max(peak) if peak else None,
        counter(after, PREEMPTIONS) - counter(before, PREEMPTIONS),
    )


def summarize(
    results: list[tuple[float, dict[str, object] | str]],
    wall_s: float,
    peak_kv_usage: float | None,
    preemptions: float,
) -> LoadResult:
    latencies: list[float] = []
    prompt_tokens = completion_tokens = failed = 0
    first_error: str | None = None
    for seconds, answer in results:
        if isinstance(answer, str):
            failed += 1
            first_error = first_error or answer
            continue
        usage = answer.get("usage")
        if not isinstance(usage, dict):
            failed += 1
            first_error = first_error or f"no usage in answer: {str(answer)[:200]}"
            continue
        latencies.append(seconds)
        prompt_tokens += int(usage.get("prompt_tokens", 0))
        completion_tokens += int(usage.get("completion_tokens", 0))
    return LoadResult(
        wall_s=wall_s,
        ok=len(latencies),
        failed=failed,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        latencies_s=tuple(latencies),
        peak_kv_usage=peak_kv_usage,
        preemptions=preemptions,
        first_error=first_error,
    )
