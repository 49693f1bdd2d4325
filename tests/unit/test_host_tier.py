"""The KV cache's CPU tier: what spec.memory.swapSpaceGiB holds, per engine and shape."""

from __future__ import annotations

from typing import Any

import pytest

from kvq.catalog.engines import DEFAULT_IMAGE, load_engine_catalog
from kvq.catalog.gpus import load_gpu_catalog
from kvq.catalog.models import load_model_catalog
from kvq.decide import decide
from kvq.planner import CapacityPlan, plan_capacity
from kvq.planner.host_tier import (
    cpu_tier_verdict,
    host_tier_figures,
    plan_host_tier,
)
from tests.unit.test_decide import h100_nodes, isvc, message, snapshot

ENGINES = load_engine_catalog()
GIB = 2**30


def capacity(model: str, dtype: str, tp: int = 1, gpu: str = "H200") -> CapacityPlan:
    found = load_model_catalog().lookup(model)
    product = load_gpu_catalog().lookup(gpu)
    assert found is not None and product is not None
    return plan_capacity(found.architecture, product, dtype, tensor_parallel=tp, max_model_len=4096)


@pytest.mark.parametrize(
    ("version", "swap", "mode", "gib", "defaulted"),
    [
        ("0.10.2", None, "swap", 4.0, True),  # vLLM's own --swap-space default
        ("0.10.2", 8, "swap", 8.0, False),
        ("0.26.0", 8, "offload", 8.0, False),
        ("0.26.0", 0.5, "offload", 0.5, False),
    ],
)
def test_the_tier_per_engine(
    version: str, swap: float | None, mode: str, gib: float, defaulted: bool
) -> None:
    verdict = cpu_tier_verdict(ENGINES.capability(version), swap, "native", DEFAULT_IMAGE)
    assert verdict is not None and verdict.ok
    tier = plan_host_tier(verdict, swap, capacity("llama-3-8b", "auto"), "auto")
    assert (tier.mode, tier.gib_per_gpu, tier.bytes, tier.defaulted) == (
        mode,
        gib,
        int(gib * GIB),
        defaulted,
    )


@pytest.mark.parametrize(
    ("version", "swap"),
    [("0.26.0", None), ("0.26.0", 0), ("0.10.2", 0), ("0.33.0", None)],
)
def test_no_tier_unless_asked_on_offload_engines_and_none_at_zero(
    version: str, swap: float | None
) -> None:
    assert cpu_tier_verdict(ENGINES.capability(version), swap, "native", DEFAULT_IMAGE) is None


@pytest.mark.parametrize(
    ("model", "dtype", "tp", "tokens"),
    [
        # Llama-3-8B: 128 KiB per token auto, 64 KiB fp8: 8 GiB per GPU holds 65,536 / 131,072.
        ("llama-3-8b", "auto", 1, 65_536),
        ("llama-3-8b", "fp8", 1, 131_072),
        # TP 2: twice the bytes (16 GiB), each rank a half of every block: twice the tokens.
        ("llama-3-8b", "auto", 2, 131_072),
    ],
)
def test_tokens_are_whole_blocks_of_the_gpu_cache(
    model: str, dtype: str, tp: int, tokens: int
) -> None:
    verdict = cpu_tier_verdict(ENGINES.capability("0.26.0"), 8, "native", DEFAULT_IMAGE)
    assert verdict is not None
    plan = capacity(model, dtype, tp)
    tier = plan_host_tier(verdict, 8, plan, dtype)
    assert tier.tokens == tokens
    assert tier.tokens % plan.block_size == 0
    assert tier.kv_cache_dtype == dtype


def test_replicated_kv_heads_hold_fewer_tokens_per_byte() -> None:
    verdict = cpu_tier_verdict(ENGINES.capability("0.26.0"), 8, "native", DEFAULT_IMAGE)
    assert verdict is not None
    # Qwen2.5-7B has 4 KV heads: on 8 GPUs each is kept twice (vLLM replicates them), so
    # eight times the bytes hold four times the tokens.
    one = plan_host_tier(verdict, 8, capacity("qwen2.5-7b", "auto"), "auto")
    eight = plan_host_tier(verdict, 8, capacity("qwen2.5-7b", "auto", 8), "auto")
    assert (one.tokens, eight.tokens) == (149_792, 599_184)
    assert eight.bytes == 8 * one.bytes


def test_plan_json_figures_and_refusals() -> None:
    figures = host_tier_figures(
        ENGINES.capability("0.26.0"),
        capacity("llama-3-8b", "fp8"),
        16,
        "native",
        DEFAULT_IMAGE,
    )
    assert figures == {
        "ok": True,
        "mode": "offload",
        "backend": "native",
        "connector": "OffloadingConnector",
        "gibPerGpu": 16,
        "bytes": 16 * GIB,
        "tokens": 262_144,
        "dtype": "fp8",
    }
    refused = host_tier_figures(
        ENGINES.capability("0.13.0"),
        capacity("llama-3-8b", "auto"),
        8,
        "native",
        DEFAULT_IMAGE,
    )
    assert refused is not None and refused["ok"] is False
    assert "native offloading works from vLLM 0.14" in str(refused["reason"])
    swap = host_tier_figures(
        ENGINES.capability("0.9.2"),
        capacity("llama-3-8b", "auto"),
        None,
        "native",
        DEFAULT_IMAGE,
    )
    assert swap is not None and swap["mode"] == "swap" and swap["gibPerGpu"] == 4.0
    assert "only the V0 engine swaps" in str(swap["note"])


@pytest.mark.parametrize(
    ("placement", "nodes", "size"),
    [
        # One node, TP 8: 16 GiB per GPU is 128 GiB for the engine.
        ({"gpusPerReplica": 8}, 1, "128"),
        # Two nodes, TP 8 x PP 2: vLLM divides by the world size, pipeline ranks too.
        ({"parallelism": {"tensor": 8, "pipeline": 2}}, 2, "256"),
    ],
)
def test_the_cpu_tier_said_is_the_size_rendered_over_every_rank(
    placement: dict[str, Any], nodes: int, size: str
) -> None:
    """vLLM 0.26.0 CPUOffloadingSpec: num_blocks = size // (worker block bytes x world size),
    world size = TP x PP: status says the bytes the engine is given, and the tokens of
    16 GiB per GPU, whatever the layout."""
    body = isvc(
        model={"uri": "hf://meta-llama/Llama-3.1-70B-Instruct"},
        engine={"image": "vllm/vllm-openai:v0.26.0"},
        placement={**placement, "pools": ["gpu-h100"]},
        memory={"maxModelLen": 8192, "swapSpaceGiB": 16},
    )
    plan = decide(snapshot(body, node_list=h100_nodes(2)))
    kinds = {o["kind"]: o for o in plan.apply}
    if nodes == 1:
        pod = kinds["Deployment"]["spec"]["template"]
    else:
        pod = kinds["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    command = pod["spec"]["containers"][0]["command"]
    assert command[command.index("--kv-offloading-size") + 1] == size
    assert f"in {float(size):.1f} GiB of host memory" in message(plan, "Placed")
