"""Failure evidence and classification, on real vLLM output and realistic Pod objects."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvq.fallback.classifier import PATTERNS, FailureKind, classify_failure
from kvq.fallback.evidence import FailureEvidence, bound_excerpt, evidence_from_pod
from kvq.render.evidence_wrapper import Evidence, summarize

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm"
HEAD80_FP8 = "cpu-v0.32.0-tiny-head80-fp8-crash.log"
HEAD16_AUTO = "cpu-v0.32.0-tiny-head16-auto-crash-after-ready.log"
H200_E5M2 = "h200-v0.26.0-llama3-8b-fp8_e5m2-crash.log"
OK_LOGS = (
    "cpu-v0.32.0-tiny-head32-fp8-ok.log",
    "cpu-v0.32.0-tiny-head80-auto-ok.log",
    "h200-v0.26.0-llama3-8b-auto-ok.log",
    "h200-v0.26.0-llama3-8b-fp8-ok.log",
)
# What the kubelet keeps with terminationMessagePolicy FallbackToLogsOnError.
KUBELET_TAIL_BYTES = 2048


def log(name: str) -> str:
    return (FIXTURES / name).read_text()


def kubelet_tail(name: str) -> str:
    return (FIXTURES / name).read_bytes()[-KUBELET_TAIL_BYTES:].decode(errors="replace")


def wrapper_message(exit_code: int, *lines: str) -> str:
    """A compact termination message like the failure-evidence wrapper writes."""
    return "\n".join([f"vllm exited with code {exit_code}", *lines])


# --- Pod objects as the API server returns them ---------------------------------------


def crashed_pod(
    message: str = "",
    *,
    exit_code: int = 1,
    reason: str = "Error",
    started: str = "2026-11-30T10:00:00Z",
    finished: str = "2026-11-30T10:01:30Z",
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An engine in CrashLoopBackOff whose last run terminated as given."""
    return {
        "metadata": {"name": "chat-7f9c-abcde", "namespace": "team-a"},
        "status": {
            "phase": "Running",
            "conditions": conditions
            or [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
            ],
            "containerStatuses": [
                {
                    "name": "vllm",
                    "ready": False,
                    "started": False,
                    "restartCount": 3,
                    "state": {
                        "waiting": {
                            "reason": "CrashLoopBackOff",
                            "message": "back-off 40s restarting failed container=vllm",
                        }
                    },
                    "lastState": {
                        "terminated": {
                            "exitCode": exit_code,
                            "reason": reason,
                            "message": message,
                            "startedAt": started,
                            "finishedAt": finished,
                        }
                    },
                }
            ],
        },
    }


def waiting_pod(reason: str, message: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "chat-7f9c-abcde"},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "vllm",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"waiting": {"reason": reason, "message": message}},
                    "lastState": {},
                }
            ],
        },
    }


UNSCHEDULABLE_POD: dict[str, Any] = {
    "metadata": {"name": "chat-7f9c-abcde"},
    "status": {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. "
                "preemption: 0/3 nodes are available: 3 No preemption victims found.",
            }
        ],
    },
}

EVICTED_POD: dict[str, Any] = {
    "metadata": {"name": "chat-7f9c-abcde"},
    "status": {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "The node was low on resource: ephemeral-storage.",
    },
}


# --- evidence_from_pod ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "container_status"),
    [
        ("creating", {"state": {"waiting": {"reason": "ContainerCreating"}}, "ready": False}),
        ("starting", {"state": {"running": {"startedAt": "2026-11-30T10:00:00Z"}}}),
        ("serving", {"state": {"running": {}}, "ready": True, "started": True}),
        (
            "serving again after a crash",
            {
                "state": {"running": {}},
                "ready": True,
                "restartCount": 1,
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
            },
        ),
    ],
)
def test_no_evidence_while_the_engine_starts_or_serves(
    name: str, container_status: dict[str, Any]
) -> None:
    pod = {
        "metadata": {"name": "p"},
        "status": {"phase": "Running", "containerStatuses": [{"name": "vllm", **container_status}]},
    }
    assert evidence_from_pod(pod) is None, name


def test_evidence_reads_the_last_termination_of_the_engine_container() -> None:
    pod = crashed_pod("ValueError: boom", exit_code=1)
    pod["status"]["containerStatuses"].insert(
        0, {"name": "sidecar", "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}
    )
    evidence = evidence_from_pod(pod, log_tail="tail")
    assert evidence is not None
    assert evidence.pod == "chat-7f9c-abcde"
    assert (evidence.exit_code, evidence.terminated_reason) == (1, "Error")
    assert evidence.waiting_reason == "CrashLoopBackOff"
    assert evidence.termination_message == "ValueError: boom"
    assert evidence.restart_count == 3
    assert evidence.started_at == datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    assert evidence.log_tail == "tail"
    assert not evidence.was_ready


def test_evidence_reads_another_container_name() -> None:
    pod = crashed_pod("ValueError: boom")
    pod["status"]["containerStatuses"][0]["name"] = "engine"
    assert evidence_from_pod(pod) is None
    assert evidence_from_pod(pod, container="engine") is not None


READY_AT_09_00 = [
    {"type": "PodScheduled", "status": "True"},
    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T09:00:00Z"},
]
READY_AT_10_01 = [
    {"type": "PodScheduled", "status": "True"},
    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T10:01:00Z"},
]
READY_AT_10_05 = [
    {"type": "PodScheduled", "status": "True"},
    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T10:05:00Z"},
]


@pytest.mark.parametrize(
    ("case", "conditions", "expected"),
    [
        ("never seen ready", None, False),
        ("Ready condition inside the run", READY_AT_10_01, True),
        ("ready in an earlier run", READY_AT_09_00, False),
        ("ready in a later run", READY_AT_10_05, False),
    ],
)  # fmt: skip
def test_was_ready_means_a_ready_moment_inside_the_failed_run(
    case: str, conditions: list[dict[str, Any]] | None, expected: bool
) -> None:
    pod = crashed_pod("RuntimeError: x", conditions=conditions)
    evidence = evidence_from_pod(pod)
    assert evidence is not None
    assert evidence.was_ready is expected, case


def test_bound_excerpt_keeps_one_kib_and_whole_characters() -> None:
    text = "KVキャッシュ" * 400
    cut = bound_excerpt(text)
    assert len(cut.encode()) <= 1024
    assert cut.endswith("[...]")
    assert text.startswith(cut.removesuffix(" [...]"))
    assert bound_excerpt("short") == "short"


# --- classification of pods -----------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    pod: dict[str, Any]
    dtype: str
    kind: FailureKind
    fallback: bool
    names: tuple[str, ...]  # words the reason a user sees must contain
    log_tail: str | None = None


HEAD80_ROOT = "NotImplementedError: FP8 KV cache requires head_size divisible by 32 on CPU."
HEAD16_ROOT = (
    "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0"
)
E5M2_ROOT = (
    "torch._dynamo.exc.Unsupported: Data-dependent assertion failed (cannot compile partial graph)"
)
ENGINE_INIT = (
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
)

CASES = [
    # Real vLLM output: the full previous log as the tail the caller read.
    Case("head80 fp8, full log", crashed_pod(kubelet_tail(HEAD80_FP8)), "fp8",
         FailureKind.DTYPE_REJECTED, True, ("fp8", "head_size divisible by 32"),
         log_tail=log(HEAD80_FP8)),
    # Our wrapper's compact message alone.
    Case("head80 fp8, wrapper message", crashed_pod(wrapper_message(1, HEAD80_ROOT, ENGINE_INIT)),
         "fp8", FailureKind.DTYPE_REJECTED, True, ("head_size divisible by 32",)),
    # Only what FallbackToLogsOnError keeps: the cause is not in it, so it is a suspect.
    Case("head80 fp8, kubelet tail only", crashed_pod(kubelet_tail(HEAD80_FP8)), "fp8",
         FailureKind.DTYPE_SUSPECT, False, ("fp8", "Engine core initialization failed")),
    # The H200 e5m2 crash: its message never names the dtype, but the traceback's
    # user-code frame is the failed `assert self.kv_cache_dtype in {...}`.
    Case(
        "h200 e5m2, full log",
        crashed_pod(kubelet_tail(H200_E5M2)),
        "fp8_e5m2",
        FailureKind.DTYPE_REJECTED,
        True,
        ("fp8_e5m2", "assert self.kv_cache_dtype"),
        log_tail=log(H200_E5M2),
    ),
    # Without that frame (kubelet tail, or a message with the exception line only)
    # it is an unknown start-up crash under a quantized dtype: a suspect.
    Case(
        "h200 e5m2, kubelet tail only",
        crashed_pod(kubelet_tail(H200_E5M2)),
        "fp8_e5m2",
        FailureKind.DTYPE_SUSPECT,
        False,
        ("fp8_e5m2", "Engine core initialization failed"),
    ),
    Case("h200 e5m2, wrapper message", crashed_pod(wrapper_message(1, E5M2_ROOT, ENGINE_INIT)),
         "fp8_e5m2", FailureKind.DTYPE_SUSPECT, False, ("Data-dependent assertion failed",)),
    # The same unknown crash under auto: nothing to fall back from.
    Case("h200 crash under auto", crashed_pod(wrapper_message(1, E5M2_ROOT)), "auto",
         FailureKind.UNKNOWN, False, ("Data-dependent assertion failed",)),
    # head_dim 16 serves, then dies at the first request: the log shows it was up.
    Case("head16 auto, crash after ready (log)", crashed_pod(kubelet_tail(HEAD16_AUTO)), "auto",
         FailureKind.CRASH_AFTER_READY, False, ("after", "head_dim=16"),
         log_tail=log(HEAD16_AUTO)),
    Case("head16 under fp8, crash after ready (log)", crashed_pod(""), "fp8",
         FailureKind.CRASH_AFTER_READY, False, ("after", "head_dim=16"),
         log_tail=log(HEAD16_AUTO)),
    # Wrapper message alone; the Pod's Ready condition proves it had been ready.
    Case("head16, crash after ready (pod)",
         crashed_pod(wrapper_message(1, HEAD16_ROOT), conditions=READY_AT_10_01), "fp8",
         FailureKind.CRASH_AFTER_READY, False, ("after", "head_dim=16")),
    # Kubernetes-level failures: another dtype cannot help.
    Case("OOMKilled under fp8", crashed_pod("", exit_code=137, reason="OOMKilled"), "fp8",
         FailureKind.OOM_KILLED, False, ("OOMKilled", "memory limit")),
    Case("ImagePullBackOff", waiting_pod(
        "ImagePullBackOff", 'Back-off pulling image "vllm/vllm-openai:v0.99.0"'), "fp8",
         FailureKind.IMAGE_PULL, False, ("ImagePullBackOff", "vllm/vllm-openai:v0.99.0")),
    Case("ErrImagePull", waiting_pod(
        "ErrImagePull", "failed to pull and unpack image: not found"), "fp8",
         FailureKind.IMAGE_PULL, False, ("ErrImagePull", "not found")),
    Case("Unschedulable", UNSCHEDULABLE_POD, "fp8",
         FailureKind.UNSCHEDULABLE, False, ("scheduled", "Insufficient nvidia.com/gpu")),
    Case("CreateContainerConfigError", waiting_pod(
        "CreateContainerConfigError", 'secret "hf-token" not found'), "fp8",
         FailureKind.CONFIG_ERROR, False, ("CreateContainerConfigError", "hf-token")),
    Case("ContainerCannotRun", crashed_pod(
        'exec: "vllm": executable file not found in $PATH', exit_code=127,
        reason="ContainerCannotRun"), "fp8",
         FailureKind.CONFIG_ERROR, False, ("could not be started", "executable file not found")),
    Case("Evicted", EVICTED_POD, "fp8",
         FailureKind.EVICTED, False, ("evicted", "ephemeral-storage")),
    Case("killed by the startup probe", crashed_pod("", exit_code=137), "fp8",
         FailureKind.KILLED, False, ("stopped", "137")),
    Case("stopped through the wrapper", crashed_pod(wrapper_message(
        1, "(killed by signal 15) after signal 15 was forwarded to it", ENGINE_INIT)), "fp8",
         FailureKind.KILLED, False, ("stopped",)),
    Case("stopped gracefully", crashed_pod("", exit_code=0, reason="Completed"), "fp8",
         FailureKind.KILLED, False, ("stopped", "exit code 0")),
    Case("segfault under fp8", crashed_pod(
        "engine exited with code 139 (killed by signal 11)\nno error line found; last lines:\n"
        "Segmentation fault (core dumped)", exit_code=139), "fp8",
         FailureKind.DTYPE_SUSPECT, False, ("fp8", "Segmentation fault")),
    # argparse exits at once on a flag this engine version does not have.
    Case("swap-space removed", crashed_pod(wrapper_message(
        2, "usage: vllm serve [model_tag] [options]",
        "vllm serve: error: unrecognized arguments: --swap-space 4"), exit_code=2), "fp8",
         FailureKind.CONFIG_ERROR, False, ("--swap-space 4",)),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_classify_pod_failures(case: Case) -> None:
    evidence = evidence_from_pod(case.pod, log_tail=case.log_tail)
    assert evidence is not None
    result = classify_failure(evidence, kv_cache_dtype=case.dtype)
    assert (result.kind, result.fallback) == (case.kind, case.fallback), result.reason
    for word in case.names:
        assert word in result.reason, (word, result.reason)
    assert len(result.excerpt.encode()) <= 1024


@pytest.mark.parametrize("name", [HEAD80_FP8, H200_E5M2, HEAD16_AUTO])
def test_excerpt_of_a_real_crash_starts_at_the_root_cause(name: str) -> None:
    evidence = FailureEvidence(pod="p", exit_code=1, log_tail=log(name))
    result = classify_failure(evidence, kv_cache_dtype="fp8")
    first = result.excerpt.splitlines()[0]
    assert first in {HEAD80_ROOT, E5M2_ROOT, HEAD16_ROOT}
    assert "WARNING" not in result.excerpt and "INFO" not in result.excerpt


@pytest.mark.parametrize(
    ("name", "dtype", "kind"),
    [
        (HEAD80_FP8, "fp8", FailureKind.DTYPE_REJECTED),
        (H200_E5M2, "fp8_e5m2", FailureKind.DTYPE_REJECTED),
        (HEAD16_AUTO, "auto", FailureKind.CRASH_AFTER_READY),
        (HEAD16_AUTO, "fp8", FailureKind.CRASH_AFTER_READY),
    ],
)
def test_the_real_wrapper_message_alone_is_enough(name: str, dtype: str, kind: FailureKind) -> None:
    # The wrapper the renderer puts around the engine, fed the real log: its 4 KiB
    # termination message must lead to the same verdict as the whole log.
    scanned = Evidence()
    for line in log(name).splitlines():
        scanned.add_line(line)
    message = summarize(1, scanned)
    from_message = classify_failure(
        FailureEvidence(pod="p", exit_code=1, termination_message=message), kv_cache_dtype=dtype
    )
    from_log = classify_failure(
        FailureEvidence(pod="p", exit_code=1, log_tail=log(name)), kv_cache_dtype=dtype
    )
    assert from_message.kind is from_log.kind is kind
    assert from_message.excerpt.splitlines()[0] == from_log.excerpt.splitlines()[0]


@pytest.mark.parametrize("name", OK_LOGS)
def test_logs_of_healthy_engines_name_no_known_failure(name: str) -> None:
    # Healthy logs mention kv_cache_dtype, fp8 and OSError in INFO/WARNING lines;
    # none of it may be read as a cause.
    evidence = FailureEvidence(pod="p", exit_code=1, log_tail=log(name))
    result = classify_failure(evidence, kv_cache_dtype="fp8")
    assert result.kind in {FailureKind.DTYPE_SUSPECT, FailureKind.CRASH_AFTER_READY}
    assert "refused" not in result.reason


# --- classification of messages -------------------------------------------------------

# (message line, KV dtype, kind, fallback, word the reason names). Lines are quoted from
# vLLM, torch, Triton, argparse and huggingface_hub as they print them.
MESSAGES = [
    ("ValueError: Model architecture not supported for kv_cache_dtype='fp8'", "fp8",
     FailureKind.DTYPE_REJECTED, True, "architecture"),
    (HEAD80_ROOT, "fp8", FailureKind.DTYPE_REJECTED, True, "head size"),
    ('assert self.kv_cache_dtype in {"fp8", "fp8_e4m3", "nvfp4"}', "fp8_e5m2",
     FailureKind.DTYPE_REJECTED, True, "assertion"),
    ("ValueError: fp8_e5m2 kv-cache is not supported with fp8 checkpoints.", "fp8_e5m2",
     FailureKind.DTYPE_REJECTED, True, "fp8_e5m2"),
    ("NotImplementedError: FlashAttention does not support fp8 kv-cache on this device.", "fp8",
     FailureKind.DTYPE_REJECTED, True, "FlashAttention"),
    ("NotImplementedError: FP8 KV cache dtype is not supported.", "fp8",
     FailureKind.DTYPE_REJECTED, True, "fp8 KV cache"),
    ("ValueError: Selected backend AttentionBackendEnum.FLASH_ATTN is not valid for this "
     "configuration. Reason: ['kv_cache_dtype not supported']", "int8_per_token_head",
     FailureKind.DTYPE_REJECTED, True, "FLASH_ATTN"),
    ("ValueError: No valid attention backend found for cuda with AttentionSelectorConfig("
     "head_size=128, dtype=torch.bfloat16, kv_cache_dtype=nvfp4, block_size=16). Reasons: "
     "{FLASH_ATTN: [kv_cache_dtype not supported], FLASHINFER: [nvfp4 KV cache in FlashInfer "
     "requires SM100]}", "nvfp4", FailureKind.DTYPE_REJECTED, True, "nvfp4"),
    ("ValueError: No valid attention backend found for cuda with AttentionSelectorConfig("
     "head_size=128, dtype=torch.bfloat16, kv_cache_dtype=fp8, block_size=106). Reasons: "
     "{FLASH_ATTN: [kv_cache_dtype not supported, block_size not supported], FLASHINFER: "
     "[block_size not supported], TRITON_ATTN: [block_size not supported]}", "fp8",
     FailureKind.CONFIG_ERROR, False, "block_size"),
    ("RuntimeError: Unsupported KV cache dtype: fp8_e5m2", "fp8_e5m2",
     FailureKind.DTYPE_REJECTED, True, "fp8_e5m2"),
    ("ValueError: Unrecognized FP8 dtype: fp8_e5m2", "fp8_e5m2",
     FailureKind.DTYPE_REJECTED, True, "fp8_e5m2"),
    ("ValueError(\"type fp8e4nv not supported in this architecture. The supported fp8 dtypes "
     "are ('fp8e4b15', 'fp8e5')\")", "fp8", FailureKind.DTYPE_REJECTED, True, "8.9"),
    # The same Triton refusal with an auto KV cache comes from fp8 weights, not the cache.
    ("ValueError(\"type fp8e4nv not supported in this architecture. The supported fp8 dtypes "
     "are ('fp8e4b15', 'fp8e5')\")", "auto", FailureKind.UNKNOWN, False, "already auto"),
    ("vllm serve: error: argument --kv-cache-dtype: invalid choice: 'int8' (choose from auto, "
     "fp8, fp8_e4m3, fp8_e5m2)", "int8", FailureKind.DTYPE_REJECTED, True, "int8"),
    # Shaped like vLLM's backend refusals; no upstream release prints this exact line.
    ("NotImplementedError: int8_per_token_head KV cache is not supported by FLASHINFER",
     "int8_per_token_head", FailureKind.DTYPE_REJECTED, True, "int8"),
    ("ValueError: nvfp4 KV cache is not supported with MLA (Multi-head Latent Attention) "
     "backends.", "nvfp4", FailureKind.DTYPE_REJECTED, True, "nvfp4"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a "
     "total capacity of 79.19 GiB of which 1.02 GiB is free.", "fp8",
     FailureKind.GPU_OUT_OF_MEMORY, False, "out of memory"),
    ("ValueError: No available memory for the cache blocks. Try increasing "
     "`gpu_memory_utilization` when initializing the engine.", "fp8",
     FailureKind.GPU_OUT_OF_MEMORY, False, "no GPU memory"),
    ("ValueError: To serve at least one request with the models's max seq len (131072), "
     "(16.00 GiB KV cache is needed, which is larger than the available KV cache memory "
     "(9.64 GiB).", "fp8", FailureKind.GPU_OUT_OF_MEMORY, False, "maxModelLen"),
    ("ValueError: Free memory on device (20.1/79.2 GiB) on startup is less than desired GPU "
     "memory utilization (0.9, 71.3 GiB).", "fp8",
     FailureKind.GPU_OUT_OF_MEMORY, False, "gpuMemoryUtilization"),
    ("api_server.py: error: unrecognized arguments: --calculate-kv-scales", "fp8",
     FailureKind.CONFIG_ERROR, False, "--calculate-kv-scales"),
    ("vllm serve: error: argument --block-size: invalid choice: 7 (choose from 1, 8, 16, 32)",
     "fp8", FailureKind.CONFIG_ERROR, False, "--block-size"),
    ("huggingface_hub.errors.GatedRepoError: 401 Client Error. Cannot access gated repo for "
     "url https://huggingface.co/meta-llama/Llama-3.1-8B/resolve/main/config.json.", "fp8",
     FailureKind.HUB_AUTH, False, "gated"),
    ("huggingface_hub.errors.LocalTokenNotFoundError: Token is required (`token=True`), but no "
     "token found.", "fp8", FailureKind.HUB_AUTH, False, "token"),
    ("OSError: acme/no-such-model is not a local folder and is not a valid model identifier "
     "listed on 'https://huggingface.co/models'", "fp8",
     FailureKind.MODEL_NOT_FOUND, False, "acme/no-such-model"),
    ("huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to "
     "locate the files on the Hub and we cannot find the appropriate snapshot folder.", "fp8",
     FailureKind.HUB_UNAVAILABLE, False, "downloaded"),
    # huggingface_hub/utils/_http.py with HF_HUB_OFFLINE=1: a setting, not the network.
    ("huggingface_hub.errors.OfflineModeIsEnabled: Cannot reach https://huggingface.co/api/"
     "models/acme/llm/revision/main: offline mode is enabled. To disable it, please unset the "
     "`HF_HUB_OFFLINE` environment variable.", "fp8",
     FailureKind.CONFIG_ERROR, False, "HF_HUB_OFFLINE"),
    ("ValueError: Model architectures ['FancyForCausalLM'] are not supported for now.", "fp8",
     FailureKind.CONFIG_ERROR, False, "FancyForCausalLM"),
    ("ValueError: The repository acme/custom contains custom code which must be executed to "
     "correctly load the model. Please pass the argument `trust_remote_code=True`.", "fp8",
     FailureKind.CONFIG_ERROR, False, "trust_remote_code"),
    ("ValueError: User-specified max_model_len (200000) is greater than the derived "
     "max_model_len (max_position_embeddings=131072 or model_max_length=None in model's "
     "config.json).", "fp8", FailureKind.CONFIG_ERROR, False, "maxModelLen"),
    ("RuntimeError: The NVIDIA driver on your system is too old. CUDA driver version is "
     "insufficient for CUDA runtime version", "fp8",
     FailureKind.CONFIG_ERROR, False, "driver"),
    ("RuntimeError: something nobody has seen before", "fp8",
     FailureKind.DTYPE_SUSPECT, False, "something nobody has seen before"),
    ("RuntimeError: something nobody has seen before", "auto",
     FailureKind.UNKNOWN, False, "something nobody has seen before"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "dtype", "kind", "fallback", "word"), MESSAGES)
def test_classify_messages(
    line: str, dtype: str, kind: FailureKind, fallback: bool, word: str
) -> None:
    for message in (
        wrapper_message(1, line),
        f"(EngineCore pid=7) ERROR 11-30 09:34:34 [core.py:1] {line}",
    ):
        evidence = FailureEvidence(pod="p", exit_code=1, termination_message=message)
        result = classify_failure(evidence, kv_cache_dtype=dtype)
        assert (result.kind, result.fallback) == (kind, fallback), result.reason
        assert word in result.reason, result.reason
        assert result.reason.endswith(".")


def test_every_pattern_is_exercised() -> None:
    corpus = yaml.safe_load((FIXTURES.parent / "failures/corpus.yaml").read_text())
    lines = [message[0] for message in MESSAGES] + [
        line for entry in corpus for line in str(entry.get("text", "")).splitlines()
    ]
    unused = [p.regex.pattern for p in PATTERNS if not any(p.regex.search(x) for x in lines)]
    assert unused == []


def test_warnings_are_not_causes() -> None:
    # From the real CPU logs: a WARNING naming OSError must not decide anything.
    warning = (
        "(APIServer pid=17622) WARNING 11-30 09:48:41 [system_utils.py:255] Found ulimit of "
        "20000 and failed to automatically increase with error current limit exceeds maximum "
        "limit. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`."
    )
    evidence = FailureEvidence(pod="p", exit_code=1, log_tail=warning)
    result = classify_failure(evidence, kv_cache_dtype="fp8")
    assert result.kind is FailureKind.DTYPE_SUSPECT
    assert "exit code 1" in result.reason


# --- model-config errors: told by where they were raised (issue 21) ---------------------

VLLM = Path(__file__).parents[1] / "fixtures" / "vllm"
# vLLM 0.26.0 on DeepSeek-V2-Lite without n_group/topk_group, as kvq's evidence wrapper writes
# it: the message is router_factory.py's own; the frames are the call chain of the wheel
# (deepseek_v2.py 1250 DeepseekV2DecoderLayer.__init__ -> 362 DeepseekV2MoE.__init__ ->
# fused_moe/layer.py 283 FusedMoE -> router_factory.py 142).
DEEPSEEK_V2_026 = """engine exited with code 1
error lines, most specific first:
ValueError: num_expert_group and topk_group must be provided when use_grouped_topk is True
  File "vllm/model_executor/models/deepseek_v2.py", line 1250, in __init__
  File "vllm/model_executor/models/deepseek_v2.py", line 362, in __init__
  File "vllm/model_executor/layers/fused_moe/layer.py", line 283, in FusedMoE
  File "vllm/model_executor/layers/fused_moe/router/router_factory.py", line 142, in \
create_fused_moe_router
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"""


def _fixture(name: str) -> str:
    return (VLLM / name).read_text()


_GELU = "cpu-v0.32.0-tiny-llama-gelu-fp8-config-error"
_HEADS = "cpu-v0.32.0-tiny-llama-heads-fp8-config-error"
_LAYER_TYPES = "cpu-v0.32.0-tiny-gemma3-layer-types-fp8-config-error"
_TM = ".termination-message.txt"
_NO_FRAMES = DEEPSEEK_V2_026.split("\n  File", maxsplit=1)[0]
_IN_ATTENTION = DEEPSEEK_V2_026.replace("fused_moe/layer.py", "attention/attention.py")
_NAMES_CACHE = DEEPSEEK_V2_026.replace("use_grouped_topk is True", "the fp8 kv cache is used")
_M, _S = "ModelConfigError", "DtypeSuspect"


@pytest.mark.parametrize(
    ("text", "dtype", "kind", "names"),
    [
        # built the model class: the worker's traceback runs through llama.py __init__
        pytest.param(_fixture(_GELU + ".log"), "fp8", _M, "gelu", id="gelu-log"),
        pytest.param(_fixture(_GELU + _TM), "fp8", _M, "gelu", id="gelu-wrapper"),
        pytest.param(_fixture(_GELU + _TM), "auto", _M, "gelu", id="gelu-wrapper-auto"),
        # built the config: transformers' configuration classes
        pytest.param(_fixture(_HEADS + ".log"), "fp8", _M, "size (320)", id="heads-log"),
        pytest.param(_fixture(_HEADS + _TM), "int8", _M, "size (320)", id="heads-wrapper"),
        pytest.param(_fixture(_LAYER_TYPES + ".log"), "fp8_e5m2", _M, "layer_types", id="lt-log"),
        pytest.param(_fixture(_LAYER_TYPES + _TM), "fp8", _M, "layer_types", id="lt-wrapper"),
        pytest.param(DEEPSEEK_V2_026, "fp8", _M, "topk_group must", id="deepseek-v2-0.26"),
        # the same words without frames (the wrapper before frames): nothing says where
        pytest.param(_fixture(_GELU + ".old-wrapper" + _TM), "fp8", _S, "gelu", id="gelu-bare"),
        pytest.param(_NO_FRAMES, "fp8", _S, "topk_group must", id="deepseek-bare"),
        # raised while building an attention layer inside the model: may be the dtype's
        pytest.param(_IN_ATTENTION, "fp8", _S, "topk_group must", id="attention-frame"),
        # the message names the KV cache: not a model-config error
        pytest.param(_NAMES_CACHE, "fp8", _S, "kv cache", id="names-kv-cache"),
        # a crash in the model's forward, not its construction (the H200 fp8_e5m2 crash)
        pytest.param(
            _fixture("h200-v0.26.0-llama3-8b-fp8_e5m2-crash.log"),
            "fp8_e5m2",
            "DtypeRejected",
            "kv_cache_dtype",
            id="e5m2-forward",
        ),
    ],
)
def test_model_config_errors_are_told_by_the_traceback(
    text: str, dtype: str, kind: str, names: str
) -> None:
    verdict = classify_failure(
        FailureEvidence(pod="p", exit_code=1, termination_message=text), kv_cache_dtype=dtype
    )
    assert str(verdict.kind) == kind, verdict.reason
    assert names in verdict.reason + verdict.excerpt
    if kind == "ModelConfigError":
        assert str(verdict.action) == "fix" and "config.json" in verdict.remedy


def test_the_wrapper_writes_where_each_cause_was_raised() -> None:
    evidence = Evidence()
    for line in _fixture("cpu-v0.32.0-tiny-llama-gelu-fp8-config-error.log").splitlines():
        evidence.add_line(line)
    summary = summarize(1, evidence)
    cause = summary.index("ValueError: Unsupported activation: gelu")
    frames = summary[cause:].split("\nRuntimeError")[0]
    assert 'File "vllm/model_executor/models/llama.py", line 113, in __init__' in frames
    assert "site-packages" not in summary
    # the generic wrapper line gets no frames
    assert summary.rstrip().endswith("Failed core proc(s): {'EngineCore': 1}")
