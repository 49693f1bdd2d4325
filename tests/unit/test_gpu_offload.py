"""The GPU tier's CPU-tier points (e2e/gpu/gputier/offload.py), here on the CPU: the
commands kvq renders for them, what kvq plans, the load's shape and the log checks."""

from __future__ import annotations

from tests.unit.gpu_tier_support import REPO  # noqa: F401  (puts e2e/gpu on sys.path)

from gputier.gpu import GpuInfo, pool_for  # isort: skip
from gputier.offload import (  # isort: skip
    OffloadConfig,
    OffloadLoad,
    log_checks,
    markdown,
    offload_command,
    planned_tiers,
)

H200 = pool_for(GpuInfo("NVIDIA H200", 143771, "580.159.04", 1))
CONFIG = OffloadConfig()
NO_TIER, TIER, FP8_TIER = CONFIG.points


def test_the_tier_points_differ_from_the_baseline_by_kvqs_tier_flags_only() -> None:
    base = offload_command(NO_TIER, H200, CONFIG)
    tier = offload_command(TIER, H200, CONFIG)
    assert base[-2:] == tier[-2:] == ["--kv-cache-memory-bytes", str(2 << 30)]
    at = tier.index("--kv-offloading-size")
    assert tier[at : at + 4] == ["--kv-offloading-size", "16", "--kv-offloading-backend", "native"]
    without = tier[:at] + tier[at + 4 :]
    assert [a.replace("tier16", "notier") for a in without] == base
    assert "--kv-offloading-size" not in base and "--swap-space" not in base


def test_kvq_plans_the_gpu_cache_at_the_shrunk_size_and_the_tier_in_the_same_dtype() -> None:
    assert planned_tiers(NO_TIER, H200, CONFIG) == {
        "gpu_tokens": 16_384,  # 2 GiB of Llama-3-8B at 128 KiB per token
        "gpu_bytes": 2 << 30,
        "kv_bytes_per_token": 131_072,
    }
    auto = planned_tiers(TIER, H200, CONFIG)["cpu_tier"]
    fp8 = planned_tiers(FP8_TIER, H200, CONFIG)["cpu_tier"]
    assert (auto["tokens"], auto["bytes"], auto["dtype"]) == (131_072, 16 << 30, "auto")
    assert (fp8["tokens"], fp8["dtype"]) == (262_144, "fp8")
    assert auto["connector"] == "OffloadingConnector"


def test_the_working_set_outgrows_every_gpu_cache_and_fits_the_tier() -> None:
    load = CONFIG.load
    for point in CONFIG.points:
        plan = planned_tiers(point, H200, CONFIG)
        # Pass 2 finds nothing left on the GPU: it holds under half of the prefixes.
        assert load.working_set_tokens >= 2 * plan["gpu_tokens"]
        if "cpu_tier" in plan:
            assert plan["cpu_tier"]["tokens"] >= load.working_set_tokens
    first, second = load.requests(1), load.requests(2)
    assert len(first) == len(second) == load.prefixes
    for a, b in zip(first, second, strict=True):
        assert a[: load.prefix_tokens] == b[: load.prefix_tokens]  # the same prefix
        assert a[load.prefix_tokens :] != b[load.prefix_tokens :]  # its own suffix
    assert len({tuple(r[: load.prefix_tokens]) for r in first}) == load.prefixes


# The lines vLLM 0.26 logs, from its format strings: kv_connector/factory.py
# ("Creating v1 connector with name: %s and engine_id: %s") and api_utils.py
# log_non_default_args ("non-default args: %s").
LOG = (
    "(APIServer pid=1) INFO 12-03 10:00:00 [api_utils.py:273] non-default args: "
    "{'model': '/models/gpu-tier/llama-3-8b', 'kv_offloading_size': 16.0, "
    "'kv_offloading_backend': 'native'}\n"
    "(EngineCore pid=2) INFO 12-03 10:00:30 [factory.py:62] Creating v1 connector with "
    "name: OffloadingConnector and engine_id: 3f2a\n"
)


def test_the_log_must_name_the_connector_and_the_size_kvq_rendered() -> None:
    assert log_checks(LOG, TIER) == {
        "connector": "OffloadingConnector",
        "kv_offloading_size_gib": 16.0,
        "expected_size_gib": 16.0,
        "names_connector": True,
        "size_matches": True,
    }
    wrong = log_checks(LOG.replace("16.0", "8.0"), TIER)
    assert not wrong["size_matches"]
    assert log_checks("INFO nothing offloaded\n", NO_TIER)["names_connector"]
    assert not log_checks("INFO nothing offloaded\n", TIER)["names_connector"]


def test_the_report_puts_both_passes_of_each_point_side_by_side() -> None:
    passes = [
        {
            "gpu_prefix_hits": 0,
            "gpu_prefix_queries": 66_560,
            "tier_prefix_hits": hits,
            "tier_prefix_queries": 66_560,
            "tier_load_bytes": hits * 131_072,
            "ttft_mean_s": ttft,
            "ttft_p50_s": ttft,
            "engine_ttft_mean_s": ttft,
            "peak_kv_usage": 0.12,
        }
        for hits, ttft in ((0, 0.081), (65_536, 0.021))
    ]
    record = {
        "point": TIER.key,
        "outcome": "served",
        "log": {"connector": "OffloadingConnector", "kv_offloading_size_gib": 16.0},
        "passes": passes,
        "plan": planned_tiers(TIER, H200, CONFIG),
        "loaded_bytes_per_token": 131_072.0,
    }
    lines = markdown([record], {"description": OffloadLoad().describe()})
    rows = [line for line in lines if line.startswith("| auto/16 |")]
    assert len(rows) == 2
    assert "65,536 / 66,560" in rows[1] and "21.0 ms" in rows[1]
    assert any("131,072.0 bytes loaded from host memory per token hit" in line for line in lines)
