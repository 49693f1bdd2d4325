"""Rendering behaviour a user would notice: flags per version, refusals, pod shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvq.api import keys
from kvq.placement.pool import NodePool, Taint
from kvq.render import (
    RenderError,
    container_command,
    engine_args,
    render_manifests,
)
from kvq.render.args import WRAPPER_PATH
from tests.unit.render_cases import gpu, isvc, pool, settings

H100 = "H100-SXM-80GB"


def args_for(version: str, product: str = H100, **spec: Any) -> tuple[str, ...]:
    engine = {"image": f"vllm/vllm-openai:v{version}", **spec.pop("engine", {})}
    service = isvc(engine=engine, **spec)
    return engine_args(service, pool(product), settings(service, product)).args


def flag_value(args: tuple[str, ...], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == "Deployment"]
    return found


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment(objects)["spec"]["template"]["spec"]
    assert len(spec["containers"]) == 1
    result: dict[str, Any] = spec["containers"][0]
    return result


def render(service: Any, product: str = H100, **pool_args: Any) -> list[dict[str, Any]]:
    return render_manifests(service, pool(product, **pool_args), settings(service, product))


@pytest.mark.parametrize(
    ("version", "scales"),
    [
        ("0.8.5", True),
        ("0.17.0", True),
        ("0.18.0", True),
        ("0.26.0", True),
        ("0.27.0", False),
        ("0.33.0", False),
    ],
)
def test_flag_set_follows_the_engine_version(version: str, scales: bool) -> None:
    args = args_for(version, kvCache={"dtype": "fp8", "calculateScales": True})
    assert ("--calculate-kv-scales" in args) is scales
    assert flag_value(args, "--kv-cache-dtype") == "fp8"
    assert flag_value(args, "--gpu-memory-utilization") == "0.9"
    assert flag_value(args, "--served-model-name") == "llama"
    assert flag_value(args, "--port") == "8000"
    assert flag_value(args, "--tensor-parallel-size") == "1"


# The CPU tier (memory.swapSpaceGiB, GiB per GPU) on each engine: V0 swap up to 0.10, KV
# offloading (GiB in total over the TP ranks) from 0.14; 0.11 has neither.
_SWAP = ("--swap-space",)
_OFFLOAD = ("--kv-offloading-size", "--kv-offloading-backend")


@pytest.mark.parametrize(
    ("version", "swap", "gpus", "expected"),
    [
        ("0.8.5", 8, 1, {"--swap-space": "8"}),
        ("0.10.2", 8, 2, {"--swap-space": "8"}),  # per GPU: each worker allocates it
        ("0.10.2", 0, 1, {"--swap-space": "0"}),  # not the engine's 4 GiB default
        ("0.10.2", None, 1, {}),  # the engine's default (4 GiB), counted in the pod
        ("0.14.1", 8, 1, {"--kv-offloading-size": "8", "--kv-offloading-backend": "native"}),
        # --swap-space still parses on 0.14-0.17 but V0 is gone: it would do nothing.
        ("0.17.1", 8, 1, {"--kv-offloading-size": "8", "--kv-offloading-backend": "native"}),
        ("0.26.0", 8, 2, {"--kv-offloading-size": "16", "--kv-offloading-backend": "native"}),
        ("0.26.0", 2.5, 1, {"--kv-offloading-size": "2.5", "--kv-offloading-backend": "native"}),
        ("0.26.0", 0, 1, {}),
        ("0.26.0", None, 1, {}),
        ("0.33.0", 4, 1, {"--kv-offloading-size": "4", "--kv-offloading-backend": "native"}),
    ],
)
def test_the_cpu_tier_is_rendered_as_each_engine_keeps_it(
    version: str, swap: float | None, gpus: int, expected: dict[str, str]
) -> None:
    memory = {} if swap is None else {"swapSpaceGiB": swap}
    args = args_for(
        version,
        "H200",
        memory=memory,
        placement={"gpusPerReplica": gpus},
        model={"uri": "hf://meta-llama/Meta-Llama-3-8B-Instruct"},
    )
    found = {flag: flag_value(args, flag) for flag in (*_SWAP, *_OFFLOAD) if flag in args}
    assert found == expected


def test_a_cpu_tier_the_image_cannot_keep_is_refused_with_the_reason() -> None:
    # What the version alone decides, the CRD refuses (tests/fixtures/isvc/invalid.yaml);
    # whether the stock image ships LMCache is judged here, when rendering.
    service = isvc(
        engine={"image": "vllm/vllm-openai:v0.20.2"},
        memory={"swapSpaceGiB": 8, "offloadBackend": "lmcache"},
    )
    with pytest.raises(RenderError) as refused:
        settings(service, H100)
    assert str(refused.value) == (
        "memory.swapSpaceGiB: vLLM 0.20.2, KV offloading backend lmcache imports LMCache, and "
        "kvq has no record that vllm/vllm-openai ships it (vLLM's Dockerfile installs it only "
        "when built with INSTALL_KV_CONNECTORS=true): use backend native, or an image with "
        "LMCache in spec.engine.image"
    )


def test_lmcache_renders_with_an_image_of_ones_own_on_engines_that_run_it_in_process() -> None:
    service = isvc(
        engine={"image": "registry.local/vllm-lmcache:v0.20.2"},
        memory={"swapSpaceGiB": 8, "offloadBackend": "lmcache"},
        placement={"gpusPerReplica": 2},
        model={"uri": "hf://meta-llama/Meta-Llama-3-8B-Instruct"},
    )
    args = engine_args(service, pool(H100), settings(service, H100)).args
    assert flag_value(args, "--kv-offloading-size") == "16"
    assert flag_value(args, "--kv-offloading-backend") == "lmcache"


def test_offloading_refuses_a_kv_transfer_config_of_the_users_own() -> None:
    service = isvc(
        memory={"swapSpaceGiB": 8},
        engine={"extraArgs": ["--kv-transfer-config", '{"kv_connector":"NixlConnector"}']},
    )
    with pytest.raises(RenderError, match="sets the engine's --kv-transfer-config itself"):
        engine_args(service, pool(H100), settings(service, H100))


def test_dropped_flags_are_reported_with_a_reason() -> None:
    service = isvc(
        kvCache={"dtype": "fp8", "calculateScales": True},
        memory={"swapSpaceGiB": 8},
        engine={"image": "vllm/vllm-openai:v0.27.0"},
    )
    rendered = engine_args(service, pool(H100), settings(service, H100))
    reasons = {d.flag: d.reason for d in rendered.dropped}
    assert reasons == {
        "--calculate-kv-scales": "vLLM 0.27.0 has no --calculate-kv-scales (vLLM has it from "
        "0.8 to 0.26): fp8 scales come from the checkpoint or default to 1.0",
    }


def test_zero_swap_is_not_reported_as_dropped() -> None:
    service = isvc(memory={"swapSpaceGiB": 0})
    assert engine_args(service, pool(H100), settings(service, H100)).dropped == ()


def test_calculate_scales_is_dropped_when_the_effective_dtype_is_auto() -> None:
    service = isvc(kvCache={"dtype": "fp8", "calculateScales": True})
    effective = settings(service, H100, "auto")
    rendered = engine_args(service, pool(H100), effective)
    assert "--calculate-kv-scales" not in rendered.args
    assert [d.flag for d in rendered.dropped] == ["--calculate-kv-scales"]


@pytest.mark.parametrize(
    ("version", "product", "expected"),
    [
        ("0.22.0", "A100-SXM4-80GB", "int8_per_token_head"),
        ("0.26.0", "T4", "int8_per_token_head"),
    ],
)
def test_int8_becomes_int8_per_token_head(version: str, product: str, expected: str) -> None:
    args = args_for(version, product, kvCache={"dtype": "int8"})
    assert flag_value(args, "--kv-cache-dtype") == expected


@pytest.mark.parametrize(
    ("version", "product", "dtype", "message"),
    [
        ("0.20.0", H100, "int8", "int8_per_token_head, which vLLM has from 0.22 on"),
        ("0.26.0", H100, "fp8_e5m2", "FlashAttention-3 takes only e4m3"),
        ("0.26.0", "T4", "fp8", "Turing and Volta"),
        ("0.26.0", "A100-SXM4-80GB", "fp8", "Ampere has no fp8 path"),
    ],
)
def test_dtypes_the_engine_cannot_run_are_refused(
    version: str, product: str, dtype: str, message: str
) -> None:
    with pytest.raises(RenderError, match=message):
        args_for(version, product, kvCache={"dtype": dtype})


@pytest.mark.parametrize(
    ("version", "product", "dtype", "block", "ok"),
    [
        ("0.26.0", H100, "fp8", 128, True),  # FlashAttention-3: multiple of 16
        ("0.26.0", "L40S", "fp8", 128, False),  # FlashInfer: 16, 32 or 64
        ("0.26.0", "L40S", "fp8", 32, True),
        ("0.17.0", H100, "auto", 256, False),  # not among 0.17's choices
        ("0.26.0", H100, "auto", 256, True),
        ("0.17.0", H100, "auto", 8, False),  # a choice, but FlashAttention needs x16
    ],
)
def test_block_size_is_checked_by_version_and_backend(
    version: str, product: str, dtype: str, block: int, ok: bool
) -> None:
    spec = {"kvCache": {"dtype": dtype, "blockSize": block}}
    if ok:
        assert flag_value(args_for(version, product, **spec), "--block-size") == str(block)
    else:
        with pytest.raises(RenderError, match=r"kvCache\.blockSize"):
            args_for(version, product, **spec)


def test_extra_args_come_last() -> None:
    args = args_for("0.26.0", engine={"image": "x:v0.26.0"})
    service = isvc(engine={"image": "x:v0.26.0", "extraArgs": ["--enforce-eager", "--seed=7"]})
    rendered = engine_args(service, pool(H100), settings(service, H100)).args
    assert rendered == (*args, "--enforce-eager", "--seed=7")


@pytest.mark.parametrize("extra", [["-tp", "2"], ["--kv-cache-memory-bytes=1000000"]])
def test_extra_args_that_fight_managed_flags_are_refused(extra: list[str]) -> None:
    # The API refuses them at apply time; the renderer refuses them again for objects
    # that skipped validation (model_construct), so no path renders a fight.
    with pytest.raises(ValueError, match="extraArgs must not set flags kvq manages"):
        isvc(engine={"extraArgs": extra})
    valid = isvc()
    service = valid.model_copy(
        update={
            "spec": valid.spec.model_copy(
                update={"engine": valid.spec.engine.model_copy(update={"extra_args": extra})}
            )
        }
    )
    with pytest.raises(RenderError, match="which kvq renders from the spec"):
        engine_args(service, pool(H100), settings(service, H100))


def test_hf_model_passes_revision_and_token_by_reference() -> None:
    service = isvc(
        model={
            "uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
            "revision": "0e9e39f",
            "tokenSecretRef": {"name": "hf-token", "key": "token"},
        }
    )
    engine = container(render(service))
    command = engine["command"]
    assert flag_value(tuple(command), "--model") == "meta-llama/Llama-3.1-8B-Instruct"
    assert flag_value(tuple(command), "--revision") == "0e9e39f"
    assert engine["env"] == [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    ]


def test_awq_rung_serves_the_awq_model_without_the_base_revision() -> None:
    service = isvc(
        model={
            "uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
            "revision": "0e9e39f",
            "awq": {"uri": "hf://hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"},
        },
        kvCache={"dtype": "fp8"},
        fallback={"rungs": ["auto", "awq"]},
    )
    for product, quantization in (("T4", "awq"), ("A10G", "awq_marlin")):
        effective = settings(service, product, "awq")
        args = engine_args(service, pool(product), effective).args
        assert flag_value(args, "--model") == "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"
        assert flag_value(args, "--quantization") == quantization
        assert flag_value(args, "--kv-cache-dtype") == "auto"
        assert "--revision" not in args


def test_pvc_model_is_mounted_read_only() -> None:
    service = isvc(model={"uri": "pvc://models/llama/8b"})
    objects = render(service)
    engine = container(objects)
    assert flag_value(tuple(engine["command"]), "--model") == "/models/models/llama/8b"
    assert {"name": "model", "mountPath": "/models/models", "readOnly": True} in engine[
        "volumeMounts"
    ]
    volumes = deployment(objects)["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
    } in volumes


def test_s3_model_is_streamed() -> None:
    args = args_for("0.26.0", model={"uri": "s3://bucket/llama-8b"})
    assert flag_value(args, "--model") == "s3://bucket/llama-8b"
    assert flag_value(args, "--load-format") == "runai_streamer"
    with pytest.raises(RenderError, match="--load-format"):
        args_for(
            "0.26.0",
            model={"uri": "s3://bucket/llama-8b"},
            engine={"image": "x:v0.26.0", "extraArgs": ["--load-format", "dummy"]},
        )


def test_load_format_is_the_users_for_hub_models() -> None:
    service = isvc(engine={"extraArgs": ["--load-format", "dummy"]})
    args = engine_args(service, pool(H100), settings(service, H100)).args
    assert args[-2:] == ("--load-format", "dummy")


def test_tensor_parallel_sets_gpu_limit_and_must_fit_a_node() -> None:
    service = isvc(placement={"gpusPerReplica": 4})
    engine = container(render(service))
    assert flag_value(tuple(engine["command"]), "--tensor-parallel-size") == "4"
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "4"
    with pytest.raises(RenderError, match="does not fit on one node"):
        render(service, gpus_per_node=2)


def test_pool_and_spec_placement_are_merged() -> None:
    service = isvc(
        placement={
            "nodeSelector": {"topology.kubernetes.io/zone": "eu-west-1a"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            ],
        }
    )
    pod = deployment(render(service))["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "topology.kubernetes.io/zone": "eu-west-1a",
    }
    assert pod["tolerations"] == [
        {"effect": "NoSchedule", "key": "dedicated", "operator": "Equal", "value": "ml"},
        {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists"},
    ]


def test_contradicting_node_selector_is_refused() -> None:
    service = isvc(placement={"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}})
    with pytest.raises(RenderError, match="no node could match both"):
        render(service)


def test_pool_taints_are_never_copied_into_the_pod() -> None:
    """Only the GPU taint and the spec's tolerations: a pool's other taints (spot, a
    transient disruption) must not change the pod template, and must be tolerated on purpose."""
    from kvq.placement.pool import GpuNode

    tainted = NodePool(
        name="h100-spot",
        gpu=gpu(H100),
        gpus_per_node=8,
        nodes=(GpuNode("n1", 8, True), GpuNode("n2", 8, True)),
        node_selector={"karpenter.sh/nodepool": "h100-spot"},
        taints=(Taint("karpenter.sh/capacity-type", "spot", "NoSchedule"),),
    )
    service = isvc()
    objects = render_manifests(service, tainted, settings(service, H100))
    pod = deployment(objects)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"karpenter.sh/nodepool": "h100-spot"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]


def test_pod_shape() -> None:
    objects = render(isvc())
    assert [o["kind"] for o in objects] == ["ConfigMap", "Deployment", "Service"]
    engine = container(objects)
    startup = engine["startupProbe"]
    assert startup["httpGet"] == {"path": "/health", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60
    assert engine["readinessProbe"]["httpGet"]["path"] == "/health"
    assert engine["livenessProbe"]["httpGet"]["path"] == "/health"
    assert engine["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert engine["securityContext"]["allowPrivilegeEscalation"] is False
    assert engine["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    pod = deployment(objects)["spec"]["template"]["spec"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in pod["volumes"]
    assert pod["enableServiceLinks"] is False
    labels = deployment(objects)["spec"]["template"]["metadata"]["labels"]
    assert labels[keys.LABEL_NAME] == "vllm"
    assert labels[keys.LABEL_INSTANCE] == "llama"
    assert labels[keys.LABEL_MANAGED_BY] == "kvq"
    assert labels[keys.LABEL_INFERENCESERVICE] == "llama"


def test_pdb_only_above_one_replica() -> None:
    assert "PodDisruptionBudget" not in [o["kind"] for o in render(isvc(replicas=1))]
    objects = render(isvc(replicas=2))
    (pdb,) = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": deployment(objects)["spec"]["selector"]["matchLabels"]},
    }


def test_evidence_wrapper_wraps_the_engine_from_its_configmap() -> None:
    objects = render(isvc())
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap"]
    command = container(objects)["command"]
    assert command[:3] == ["python3", WRAPPER_PATH, "--"]
    assert command[3:6] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert Path(WRAPPER_PATH).name in configmap["data"]
    volumes = deployment(objects)["spec"]["template"]["spec"]["volumes"]
    assert {"name": "kvq-evidence", "configMap": {"name": configmap["metadata"]["name"]}} in (
        volumes
    )


def test_container_command_for_a_local_run_uses_the_same_arguments() -> None:
    service = isvc()
    effective = settings(service, H100)
    local = container_command(
        service,
        pool(H100),
        effective,
        python="/venv/bin/python",
        wrapper_path="/tmp/w.py",
        port=18013,
    )
    assert local[:3] == ["/venv/bin/python", "/tmp/w.py", "--"]
    assert tuple(local[6:]) == engine_args(service, pool(H100), effective, port=18013).args
    in_pod = container(render(service))["command"]
    assert [a for a in local[6:] if a != "18013"] == [a for a in in_pod[6:] if a != "8000"]


def spec_hash_of(objects: list[dict[str, Any]]) -> str:
    annotations = deployment(objects)["spec"]["template"]["metadata"]["annotations"]
    value: str = annotations[keys.ANNOTATION_SPEC_HASH]
    return value


def test_spec_hash_is_stable_and_follows_the_pod_inputs() -> None:
    first = spec_hash_of(render(isvc(kvCache={"dtype": "fp8"})))
    assert first == spec_hash_of(render(isvc(kvCache={"dtype": "fp8"})))
    assert len(first) == 64
    assert first != spec_hash_of(render(isvc(kvCache={"dtype": "auto"})))
    # Replicas change the Deployment, not the pods: no rollout.
    assert first == spec_hash_of(render(isvc(kvCache={"dtype": "fp8"}, replicas=3)))


def test_image_without_a_version_tag_needs_spec_engine_version() -> None:
    with pytest.raises(RenderError, match=r"set spec\.engine\.version"):
        settings(isvc(engine={"image": "vllm/vllm-openai:latest"}), H100)


@pytest.mark.parametrize(
    "engine",
    [
        {"image": "vllm/vllm-openai:v0.7.3"},
        {"image": "vllm/vllm-openai:latest", "version": "0.34.0"},
    ],
)
def test_engine_versions_outside_the_catalog_are_refused(engine: dict[str, str]) -> None:
    service = isvc(engine=engine)
    with pytest.raises(RenderError, match="outside kvq's engine catalog"):
        render_manifests(service, pool(H100), settings(service, H100))


def test_version_from_spec_wins_over_the_tag() -> None:
    service = isvc(
        engine={"image": "registry.local/vllm:v0.26.0-custom", "version": "0.10.2"},
        memory={"swapSpaceGiB": 4},
    )
    effective = settings(service, H100)
    assert effective.engine_version == "0.10.2"
    assert "--swap-space" in engine_args(service, pool(H100), effective).args


@pytest.mark.parametrize(
    ("capability", "expected"),
    [((10, 0), "awq_marlin"), ((9, 0), "awq_marlin"), ((8, 0), "awq_marlin"),
     ((7, 5), "awq"), ((7, 0), None)],
)  # fmt: skip
def test_awq_kernel_by_compute_capability(
    capability: tuple[int, int], expected: str | None
) -> None:
    from kvq.render.settings import awq_quantization

    assert awq_quantization(capability) == expected
