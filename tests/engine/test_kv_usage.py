"""The seed's own check that compression works, on real vLLM: the same load takes about
half the KV cache with fp8 as with auto.

Load: LOAD_REQUESTS requests of PROMPT_TOKENS random token ids (seeded, so no two
share a prefix block) each generating MAX_TOKENS tokens, sent at once. The probe model's
engines get 8 MiB of KV cache (auto: 64 blocks of 128 tokens; fp8: 128), so the load
fills a visible share of it. `vllm:kv_cache_usage_perc` is sampled with
`vllm:num_requests_running` while the load runs; the figure is the usage of the sample
with all requests running together. A load whose samples never saw that (a cold engine
or a busy machine can admit the first requests and finish them before the last arrive:
CI once saw 2 of 8) is sent again, up to LOAD_ATTEMPTS times.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.engine.conftest import EnginePool, require_fp8
from tests.engine.launch import PROBE_MODEL, EngineCase, ServedEngine, cpu_features

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]

LOAD_REQUESTS = 8
PROMPT_TOKENS = 400
MAX_TOKENS = 64
LOAD_SEED = 11
SAMPLE_INTERVAL_S = 0.02
LOAD_ATTEMPTS = 3
# Token ids drawn for prompts: the byte-level alphabet (256 ids after the 3 special
# tokens), which every vocabulary of train_model.py holds.
TOKEN_IDS = range(3, 3 + 256)
# Expected ratio of fp8 to auto usage: half the bytes per token, the same blocks per request.
RATIO_RANGE = (0.4, 0.6)


@dataclass(frozen=True)
class Peak:
    usage: float
    running: int

    @property
    def per_request(self) -> float:
        """Each request holds the same blocks (prompt and output fit 4 of 128 tokens)."""
        return self.usage / self.running


def gauges(served: ServedEngine) -> tuple[float, int]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(served.engine.get_text("/metrics")):
        if family.name in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running"):
            values[family.name] = family.samples[0].value
    return values["vllm:kv_cache_usage_perc"], int(values["vllm:num_requests_running"])


def send_load_and_sample(served: ServedEngine) -> Peak:
    """Sends the fixed load at once; samples the gauges until every request has answered.

    The peak is the sample with the most requests running, the fullest of those.
    """
    rng = random.Random(LOAD_SEED)
    prompts = [[rng.choice(TOKEN_IDS) for _ in range(PROMPT_TOKENS)] for _ in range(LOAD_REQUESTS)]
    errors: list[BaseException] = []

    def request(prompt: list[int]) -> None:
        try:
            served.engine.post_json(
                "/v1/completions",
                {
                    "model": served.served_model_name,
                    "prompt": prompt,
                    "max_tokens": MAX_TOKENS,
                    "ignore_eos": True,
                    "temperature": 0,
                },
                timeout_s=600,
            )
        except BaseException as error:  # reported by the test, not lost in a thread
            errors.append(error)

    workers = [threading.Thread(target=request, args=(p,)) for p in prompts]
    for worker in workers:
        worker.start()
    peak = Peak(0.0, 0)
    done = threading.Event()
    watcher = threading.Thread(target=lambda: ([w.join() for w in workers], done.set()))
    watcher.start()
    while not done.wait(SAMPLE_INTERVAL_S):
        usage, running = gauges(served)
        if (running, usage) > (peak.running, peak.usage):
            peak = Peak(usage, running)
    watcher.join()
    assert not errors, errors
    return peak


def peak_of_whole_load(served: ServedEngine) -> Peak:
    """The peak of the first load seen running all together (or of the last attempt)."""
    peak = Peak(0.0, 0)
    for _ in range(LOAD_ATTEMPTS):
        peak = send_load_and_sample(served)
        if peak.running == LOAD_REQUESTS:
            break
    return peak


@pytest.fixture(scope="module")
def auto_peak(engines: EnginePool) -> Peak:
    return peak_of_whole_load(engines.serve(EngineCase(PROBE_MODEL, "auto")))


def test_the_fixed_load_fills_a_visible_share_of_the_auto_cache(auto_peak: Peak) -> None:
    # All requests were running together at the peak: the figure is the whole load's.
    assert auto_peak.running == LOAD_REQUESTS, (
        f"no sample of {LOAD_ATTEMPTS} loads saw all {LOAD_REQUESTS} requests running"
    )
    assert 0.2 < auto_peak.usage < 0.95


def test_fp8_holds_the_same_load_in_about_half_the_cache(
    engines: EnginePool,
    cpu_backend: cpu_features.CpuBackend,
    auto_peak: Peak,
    capsys: pytest.CaptureFixture[str],
) -> None:
    require_fp8(cpu_backend)
    fp8_peak = peak_of_whole_load(engines.serve(EngineCase(PROBE_MODEL, "fp8")))
    # Per running request, so the ratio stands even where a load never ran all together.
    ratio = fp8_peak.per_request / auto_peak.per_request
    with capsys.disabled():
        print(
            f"\nKV cache usage for {LOAD_REQUESTS} x ({PROMPT_TOKENS} + {MAX_TOKENS}) tokens: "
            f"auto {auto_peak.usage:.4f}, fp8 {fp8_peak.usage:.4f}, ratio {ratio:.3f}"
        )

    assert RATIO_RANGE[0] <= ratio <= RATIO_RANGE[1]
    assert fp8_peak.running == LOAD_REQUESTS
