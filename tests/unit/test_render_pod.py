"""The engine pod beyond its command: cache and download step, environment by reference,
resources, /dev/shm, start-up budget, pod-level settings."""

from __future__ import annotations

from typing import Any

import pytest

from kvq.api import keys
from kvq.render import RenderError, render_manifests
from kvq.render.pod import GIB
from kvq.render.settings import EffectiveSettings
from tests.unit.render_cases import isvc, pool, settings

H100 = "H100-SXM-80GB"
LLAMA_70B = "hf://meta-llama/Llama-3.1-70B-Instruct"


def render(service: Any, product: str = H100, rung: str = "requested", **kw: Any) -> list[Any]:
    return render_manifests(service, pool(product), settings(service, product, rung), **kw)


def pod_of(objects: list[Any]) -> dict[str, Any]:
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    return dict(deployment["spec"]["template"]["spec"])


def engine_of(objects: list[Any]) -> dict[str, Any]:
    return dict(pod_of(objects)["containers"][0])


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def cached(**model: Any) -> Any:
    body = {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct", **model}
    return isvc(model=body)


def test_cached_hf_model_is_fetched_at_its_revision_and_read_offline() -> None:
    service = cached(
        revision="main",
        tokenSecretRef={"name": "hf", "key": "token"},
        cache={"claimName": "models"},
        env=[{"name": "HF_ENDPOINT", "value": "https://hub.internal"}],
    )
    objects = render(service)
    pod = pod_of(objects)
    [fetch] = pod["initContainers"]
    assert fetch["name"] == "kvq-fetch"
    assert fetch["image"] == "kvq/operator:0.1.0"
    assert fetch["command"][:4] == [
        "kvq",
        "fetch",
        "--uri",
        "hf://meta-llama/Llama-3.1-8B-Instruct",
    ]
    assert fetch["command"][-2:] == ["--revision", "main"]
    assert env_of(fetch)["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert env_of(fetch)["HF_ENDPOINT"] == "https://hub.internal"
    assert fetch["securityContext"]["runAsNonRoot"] is True
    assert fetch["securityContext"]["readOnlyRootFilesystem"] is True
    engine = engine_of(objects)
    command = engine["command"]
    assert command[command.index("--model") + 1] == "/kvq-model/model"
    assert "--revision" not in command  # the download pinned it
    env = env_of(engine)
    assert env["HF_HUB_OFFLINE"] == "1"
    assert "HF_TOKEN" not in env and "HF_ENDPOINT" not in env  # only the download step
    assert {"name": "kvq-cache", "persistentVolumeClaim": {"claimName": "models"}} in pod["volumes"]
    mounts = {m["name"]: m for m in engine["volumeMounts"]}
    assert mounts["kvq-cache"] == {"name": "kvq-cache", "mountPath": "/kvq-cache", "readOnly": True}
    assert pod["securityContext"] == {"fsGroup": 65532, "fsGroupChangePolicy": "OnRootMismatch"}
    assert [o["kind"] for o in objects].count("PersistentVolumeClaim") == 0


def test_without_a_cache_the_engine_downloads_with_the_token_and_model_env() -> None:
    service = cached(
        tokenSecretRef={"name": "hf", "key": "token"},
        envFrom=[{"secretRef": {"name": "hub-mirror"}}],
    )
    objects = render(service)
    assert "initContainers" not in pod_of(objects)
    engine = engine_of(objects)
    assert env_of(engine)["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert engine["envFrom"] == [{"secretRef": {"name": "hub-mirror"}}]
    assert "HF_HUB_OFFLINE" not in env_of(engine)


def test_kvq_owned_claim_is_sized_from_the_models_and_renamed_when_immutable_parts_change() -> None:
    service = isvc(
        model={
            "uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
            "awq": {"uri": "hf://hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"},
            "cache": {"volumeClaim": {}},
        },
        fallback={"rungs": ["auto", "awq"]},
    )
    effective = settings(service, H100)
    assert effective.footprint is not None
    both = effective.footprint.cached_weight_bytes
    assert both > effective.footprint.served_weight_bytes  # bf16 and AWQ weights
    [claim] = [o for o in render(service) if o["kind"] == "PersistentVolumeClaim"]
    size = claim["spec"]["resources"]["requests"]["storage"]
    assert size == f"{-(-int(both * 1.2 + GIB) // GIB)}Gi"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["metadata"]["name"].startswith("llama-kvq-cache-")
    # The awq rung keeps the same claim (the size covers both models).
    [awq_claim] = [
        o for o in render(service, "A10G", "awq") if o["kind"] == "PersistentVolumeClaim"
    ]
    assert awq_claim == claim
    bigger = isvc(
        model={**service.spec.model.to_kube(), "cache": {"volumeClaim": {"size": "500Gi"}}}
    )
    [other] = [o for o in render(bigger) if o["kind"] == "PersistentVolumeClaim"]
    assert other["metadata"]["name"] != claim["metadata"]["name"]


def test_awq_rung_fetches_the_awq_repository_without_the_revision() -> None:
    service = isvc(
        model={
            "uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
            "revision": "main",
            "awq": {"uri": "hf://hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"},
            "cache": {"emptyDir": {"sizeLimit": "40Gi"}},
        },
        fallback={"rungs": ["awq"]},
    )
    objects = render(service, "A10G", "awq")
    [fetch] = pod_of(objects)["initContainers"]
    assert "hf://hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4" in fetch["command"]
    assert "--revision" not in fetch["command"]
    assert {"name": "kvq-cache", "emptyDir": {"sizeLimit": "40Gi"}} in pod_of(objects)["volumes"]


def test_s3_model_with_a_cache_is_downloaded_not_streamed() -> None:
    service = isvc(
        model={
            "uri": "s3://acme/qwen",
            "architecture": {
                "numLayers": 28,
                "numKvHeads": 4,
                "headDim": 128,
                "numParams": 7_000_000_000,
            },
            "cache": {"emptyDir": {}},
        }
    )
    engine = engine_of(render(service))
    assert "--load-format" not in engine["command"]
    streamed = isvc(model={**service.spec.model.to_kube(), "cache": None})
    assert "runai_streamer" in engine_of(render(streamed))["command"]


def test_memory_and_cpu_are_derived_from_the_model_and_the_engine() -> None:
    small = engine_of(render(isvc()))["resources"]
    assert small == {
        "requests": {"cpu": "4", "memory": "21Gi"},  # 2 + 3 + 14.96 weights + 1 shm
        "limits": {"memory": "21Gi", "nvidia.com/gpu": "1"},
    }
    big = engine_of(render(isvc(model={"uri": LLAMA_70B}, placement={"gpusPerReplica": 4})))
    assert big["resources"]["requests"] == {"cpu": "10", "memory": "150Gi"}


@pytest.mark.parametrize(
    ("image", "memory", "gpus", "expected"),
    [
        # V0 swap (vLLM 0.10): the engine's 4 GiB per GPU unless the spec says.
        ("vllm/vllm-openai:v0.10.2", {}, 1, "25Gi"),
        ("vllm/vllm-openai:v0.10.2", {"swapSpaceGiB": 0}, 1, "21Gi"),
        ("vllm/vllm-openai:v0.10.2", {"swapSpaceGiB": 8}, 2, "41Gi"),  # 2 + 6 + 14.96 + 2 + 16
        # --swap-space still parses on 0.17 but allocates nothing (V1): not counted.
        ("vllm/vllm-openai:v0.17.1", {}, 1, "21Gi"),
        # KV offloading: nothing unless asked; then GiB per GPU x GPUs, pinned host memory.
        ("vllm/vllm-openai:v0.26.0", {}, 1, "21Gi"),
        ("vllm/vllm-openai:v0.26.0", {"swapSpaceGiB": 16}, 1, "37Gi"),
        ("vllm/vllm-openai:v0.26.0", {"swapSpaceGiB": 16}, 2, "57Gi"),  # 2 + 6 + 14.96 + 2 + 32
    ],
)
def test_the_cpu_tier_is_in_the_memory_request_and_limit(
    image: str, memory: dict[str, float], gpus: int, expected: str
) -> None:
    service = isvc(engine={"image": image}, memory=memory, placement={"gpusPerReplica": gpus})
    resources = engine_of(render(service, "L40S"))["resources"]
    assert resources["requests"]["memory"] == expected
    assert resources["limits"]["memory"] == expected


def test_a_memory_limit_that_cannot_hold_the_cpu_tier_is_refused() -> None:
    service = isvc(
        memory={"swapSpaceGiB": 32}, engine={"resources": {"limits": {"memory": "24Gi"}}}
    )
    with pytest.raises(RenderError, match="cannot hold the KV cache's CPU tier"):
        render(service)


def test_resources_from_the_spec_win_and_are_checked() -> None:
    asked = isvc(
        engine={"resources": {"requests": {"cpu": "6"}, "limits": {"memory": "16Gi", "cpu": "12"}}}
    )
    assert engine_of(render(asked))["resources"] == {
        "requests": {"cpu": "6", "memory": "16Gi"},  # the derived 21Gi lowered to the limit
        "limits": {"cpu": "12", "memory": "16Gi", "nvidia.com/gpu": "1"},
    }
    wrong = isvc(
        engine={"resources": {"requests": {"memory": "64Gi"}, "limits": {"memory": "32Gi"}}}
    )
    with pytest.raises(RenderError, match=r"requests\.memory 64Gi is above limits\.memory 32Gi"):
        render(wrong)


def test_shm_is_sized_for_tensor_parallelism() -> None:
    pod = pod_of(render(isvc(model={"uri": LLAMA_70B}, placement={"gpusPerReplica": 4})))
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}} in pod["volumes"]
    pod = pod_of(render(isvc(engine={"shmSize": "16Gi"})))
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]


def test_startup_budget_scales_with_the_model() -> None:
    def budget(service: Any, effective: EffectiveSettings | None = None) -> int:
        effective = effective or settings(service, H100)
        probe = engine_of(render_manifests(service, pool(H100), effective))["startupProbe"]
        return int(probe["periodSeconds"] * probe["failureThreshold"])

    cached_8b = budget(cached(cache={"claimName": "m"}))
    cached_70b = budget(
        isvc(model={"uri": LLAMA_70B, "cache": {"claimName": "m"}}, placement={"gpusPerReplica": 4})
    )
    downloading_70b = budget(isvc(model={"uri": LLAMA_70B}, placement={"gpusPerReplica": 4}))
    assert cached_8b == 600  # the floor: 5 minutes + 2.5 minutes of loading
    assert cached_70b > 25 * 60  # 131 GiB at 100 MiB/s + 5 minutes
    assert downloading_70b > cached_70b + 80 * 60  # and the download at 25 MiB/s
    unknown = isvc(model={"uri": "pvc://models/x"})
    assert budget(unknown) == 1800  # no size known: kvq's fixed 30 minutes


def test_pod_settings_identity_scheduling_labels_annotations() -> None:
    service = isvc(
        replicas=2,
        pod={
            "serviceAccountName": "reader",
            "imagePullSecrets": [{"name": "registry"}],
            "labels": {"team": "search"},
            "annotations": {"example.com/owner": "search"},
        },
        placement={
            "priorityClassName": "inference",
            "topologySpreadConstraints": [{"topologyKey": "topology.kubernetes.io/zone"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            }
                        ]
                    }
                }
            },
        },
    )
    objects = render(service)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    template = deployment["spec"]["template"]
    pod = template["spec"]
    assert pod["serviceAccountName"] == "reader"
    assert pod["automountServiceAccountToken"] is False
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["priorityClassName"] == "inference"
    assert pod["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
        }
    ]
    # Empty lists the spec's defaults hold are left out, as the API server stores it.
    assert pod["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
    assert template["metadata"]["labels"]["team"] == "search"
    assert template["metadata"]["labels"][keys.LABEL_NAME] == "vllm"
    assert template["metadata"]["annotations"]["example.com/owner"] == "search"
    plain = next(o for o in render(isvc(replicas=2)) if o["kind"] == "Deployment")
    assert (
        plain["spec"]["template"]["metadata"]["annotations"][keys.ANNOTATION_SPEC_HASH]
        != template["metadata"]["annotations"][keys.ANNOTATION_SPEC_HASH]
    )


def test_engine_runs_as_non_root_only_when_asked() -> None:
    root = engine_of(render(isvc()))["securityContext"]
    assert "runAsNonRoot" not in root and root["capabilities"] == {"drop": ["ALL"]}
    engine = engine_of(render(isvc(engine={"runAsUser": 1000})))
    assert engine["securityContext"]["runAsNonRoot"] is True
    assert engine["securityContext"]["runAsUser"] == 1000
    assert env_of(engine)["HOME"] == "/home/kvq"
    assert {"name": "kvq-home", "mountPath": "/home/kvq"} in engine["volumeMounts"]


def test_engine_env_by_reference() -> None:
    service = isvc(
        engine={
            "env": [
                {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "v", "key": "k"}}},
                {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
            ],
            "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "VLLM_"}],
        }
    )
    engine = engine_of(render(service))
    assert engine["env"] == [
        {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "v", "key": "k"}}},
        {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
    ]
    assert engine["envFrom"] == [{"configMapRef": {"name": "settings"}, "prefix": "VLLM_"}]


def test_fetch_image_is_the_operators() -> None:
    objects = render(
        cached(cache={"emptyDir": {}}), fetch_image="registry.example/kvq/operator@sha256:ab"
    )
    assert (
        pod_of(objects)["initContainers"][0]["image"] == "registry.example/kvq/operator@sha256:ab"
    )
