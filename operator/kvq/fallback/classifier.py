"""Classify why an engine pod failed, and whether a KV-cache dtype fallback can help.

The rule the ladder relies on: fall back only when the evidence points at the KV
cache dtype. A rejection the engine names is DTYPE_REJECTED. A start-up crash with a
message we do not know, under a non-auto dtype, is DTYPE_SUSPECT: the real H200
fp8_e5m2 crash dies in torch.compile with a message that never names the dtype (only
a traceback frame does, and a short tail does not hold it). Everything that a
different dtype cannot fix (memory, image, scheduling, configuration, a crash after
the server was ready) is reported, never retried with another dtype.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from kvq.fallback.evidence import FailureEvidence, bound_excerpt


class FailureKind(StrEnum):
    DTYPE_REJECTED = "DtypeRejected"
    DTYPE_SUSPECT = "DtypeSuspect"
    OOM_KILLED = "OOMKilled"
    GPU_OUT_OF_MEMORY = "GPUOutOfMemory"
    IMAGE_PULL = "ImagePull"
    UNSCHEDULABLE = "Unschedulable"
    EVICTED = "Evicted"
    KILLED = "Killed"
    CRASH_AFTER_READY = "CrashAfterReady"
    CONFIG_ERROR = "ConfigError"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class Classification:
    kind: FailureKind
    fallback: bool
    reason: str
    excerpt: str


@dataclass(frozen=True)
class Pattern:
    """One known failure message. `reason` may use {dtype}, {line} and named groups."""

    regex: re.Pattern[str]
    kind: FailureKind
    reason: str


def _p(regex: str, kind: FailureKind, reason: str) -> Pattern:
    return Pattern(re.compile(regex, re.IGNORECASE), kind, reason)


_K = FailureKind

# Known messages, checked in this order on each error line. Each names its source.
PATTERNS: tuple[Pattern, ...] = (
    # --- the engine names the KV-cache dtype ---
    # The seed document's example of a model that refuses a quantized cache.
    _p(
        r"architecture not supported for kv_cache_dtype",
        _K.DTYPE_REJECTED,
        "The engine refused the {dtype} KV cache for this model architecture: {line}",
    ),
    # vllm/v1/attention/backends/cpu_attn.py (fixture cpu-v0.32.0-tiny-head80-fp8-crash.log).
    _p(
        r"FP8 KV cache requires head_size divisible by 32",
        _K.DTYPE_REJECTED,
        "The CPU attention backend refused the {dtype} KV cache "
        "(head size not divisible by 32): {line}",
    ),
    # vllm model_executor/layers/attention/attention.py, _init_kv_cache_quant.
    _p(
        r"fp8_e5m2 kv-cache is not supported",
        _K.DTYPE_REJECTED,
        "The engine refuses fp8_e5m2 with this checkpoint's quantization: {line}",
    ),
    # vllm/v1/attention/backends/flash_attn.py: FA2 has no fp8 path (needs FlashAttention 3).
    _p(
        r"does not support fp8 kv-cache",
        _K.DTYPE_REJECTED,
        "The attention backend has no {dtype} KV-cache kernel on this device: {line}",
    ),
    # vllm/v1/attention/backends/pallas.py and other backends without a quantized cache.
    _p(
        r"FP8 KV cache dtype is not supported",
        _K.DTYPE_REJECTED,
        "The attention backend does not support an fp8 KV cache: {line}",
    ),
    # vllm/platforms/cuda.py backend selection: a backend whose only objection is the
    # dtype, e.g. "Selected backend ...FLASH_ATTN is not valid for this configuration.
    # Reason: ['kv_cache_dtype not supported']" or "FLASH_ATTN: [kv_cache_dtype not supported]".
    _p(
        r"(?:\w+: \[kv_cache_dtype not supported\]|Reason: \['kv_cache_dtype not supported'\])",
        _K.DTYPE_REJECTED,
        "No attention backend accepts the {dtype} KV cache here: {line}",
    ),
    # vllm/platforms/cuda.py when every backend has other objections too (block size,
    # head size, ...): another dtype cannot fix it.
    _p(
        r"No valid attention backend found",
        _K.CONFIG_ERROR,
        "No attention backend accepts this configuration: {line}",
    ),
    # vllm csrc (ROCm paged attention TORCH_CHECK), Triton unified-attention asserts.
    _p(
        r"unsupported kv[ _-]?cache dtype",
        _K.DTYPE_REJECTED,
        "The attention kernel does not support the {dtype} KV cache: {line}",
    ),
    # vllm/v1/attention/backends/flashinfer.py and flash_attn.py get_fp8_dtype_for_*.
    _p(
        r"Unrecognized FP8 dtype",
        _K.DTYPE_REJECTED,
        "The attention backend does not know the {dtype} KV-cache format: {line}",
    ),
    # Triton's compiler on GPUs below compute capability 8.9 (A100, A10G): e4m3 kernels
    # cannot be built. The same message appears for fp8 weights, hence the auto check
    # in classify_failure.
    _p(
        r"type fp8e4nv not supported in this architecture",
        _K.DTYPE_REJECTED,
        "Triton cannot build fp8 e4m3 kernels on this GPU (needs compute capability 8.9+): {line}",
    ),
    # argparse in vllm/engine/arg_utils.py: this engine version does not know the value.
    _p(
        r"argument --kv-cache-dtype: invalid choice",
        _K.DTYPE_REJECTED,
        "This engine version does not offer kv_cache_dtype {dtype}: {line}",
    ),
    # int8_per_token_head (vLLM 0.22+) is Triton-only; other backends refuse it, e.g.
    # "per-token/head KV quantization is not supported".
    _p(
        r"(?:int8_per_token_head|per-token/head KV quantization).*not supported"
        r"|not supported.*int8_per_token_head",
        _K.DTYPE_REJECTED,
        "The attention backend refuses the per-token-head int8 KV cache: {line}",
    ),
    # Generic backend refusals that name the KV cache dtype (FlashInfer, MLA backends,
    # e.g. "nvfp4 KV cache is not supported with MLA", "... KV cache in FlashInfer requires SM100").
    _p(
        r"kv[ _-]?cache[ _-]dtype\b.*\b(?:not supported|unsupported|not valid|requires)"
        r"|\b(?:fp8|fp4|nvfp4|int8|int4|quantized)\w*[ _-]kv[ _-]?cache\b.*"
        r"\b(?:not supported|unsupported|requires|only supported)",
        _K.DTYPE_REJECTED,
        "The engine refused the {dtype} KV cache: {line}",
    ),
    # A failed assertion about the KV dtype, as a traceback prints it: the H200 fp8_e5m2
    # crash (vLLM 0.26, Triton backend) ends in torch.compile's "Data-dependent assertion
    # failed" whose user-code frame is `assert self.kv_cache_dtype in {"fp8", ...}`.
    _p(
        r"^assert\b.*\bkv_cache_dtype\b",
        _K.DTYPE_REJECTED,
        "An engine assertion on the KV-cache dtype failed, so {dtype} is not accepted on "
        "this code path: {line}",
    ),
    # --- capacity, not dtype: a smaller cache would not be the fix ---
    # torch: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ..."
    _p(
        r"CUDA out of memory|HIP out of memory|OutOfMemoryError",
        _K.GPU_OUT_OF_MEMORY,
        "The GPU ran out of memory while loading the model: {line}",
    ),
    # vllm/v1/core/kv_cache_utils.py: weights leave no room for any KV block.
    _p(
        r"No available memory for the cache blocks",
        _K.GPU_OUT_OF_MEMORY,
        "The model weights leave no GPU memory for the KV cache: {line}",
    ),
    # vllm/v1/core/kv_cache_utils.py: max_model_len does not fit in the KV memory.
    _p(
        r"larger than the available KV cache memory",
        _K.GPU_OUT_OF_MEMORY,
        "One request at maxModelLen does not fit in the GPU's KV-cache memory: {line}",
    ),
    # vllm/v1/worker/gpu_worker.py: the GPU is shared or too small for the utilization.
    _p(
        r"Free memory on device .* is less than desired GPU memory utilization",
        _K.GPU_OUT_OF_MEMORY,
        "The GPU has less free memory than gpuMemoryUtilization asks for: {line}",
    ),
    # --- configuration unrelated to the KV cache ---
    # argparse: a flag this engine version does not have (--swap-space went in 0.18).
    _p(
        r"error: unrecognized arguments: (?P<args>.*)",
        _K.CONFIG_ERROR,
        "The engine does not accept the argument(s) {args}: "
        "this engine version does not have that flag",
    ),
    # argparse: a bad value for some other flag.
    _p(
        r"error: argument (?P<flag>--[\w-]+)",
        _K.CONFIG_ERROR,
        "The engine rejected the value of {flag}: {line}",
    ),
    # huggingface_hub GatedRepoError (401/403).
    _p(
        r"GatedRepoError|Cannot access gated repo|trying to access a gated repo"
        r"|Access to model .* is restricted",
        _K.CONFIG_ERROR,
        "The model repository is gated and the token has no access to it: {line}",
    ),
    # huggingface_hub LocalTokenNotFoundError / HTTP 401 without a usable token.
    _p(
        r"LocalTokenNotFoundError|no token found|401 Client Error|Invalid user token"
        r"|Invalid credentials in Authorization header",
        _K.CONFIG_ERROR,
        "Hugging Face refused the request for lack of a valid token "
        "(check model.tokenSecretRef): {line}",
    ),
    # huggingface_hub RepositoryNotFoundError; transformers/vllm for a wrong path.
    _p(
        r"RepositoryNotFoundError|Repository Not Found"
        r"|is not a local folder and is not a valid model identifier"
        r"|Invalid repository ID or local directory"
        r"|does not appear to have (?:a )?file named",
        _K.CONFIG_ERROR,
        "The model path or repository does not exist or holds no model: {line}",
    ),
    # huggingface_hub offline / no network to the Hub.
    _p(
        r"LocalEntryNotFoundError|OfflineModeIsEnabled|couldn't connect to 'https://huggingface.co'",
        _K.CONFIG_ERROR,
        "The model could not be downloaded (no access to the Hub and no local copy): {line}",
    ),
    # vllm model registry: the engine does not implement this architecture at all.
    _p(
        r"Model architectures? .* (?:are|is) not supported",
        _K.CONFIG_ERROR,
        "This engine version does not support the model's architecture: {line}",
    ),
    # transformers: custom code in the repo needs trust_remote_code.
    _p(
        r"trust_remote_code",
        _K.CONFIG_ERROR,
        "The model needs trust_remote_code: {line}",
    ),
    # vllm/config: maxModelLen above what the model supports.
    _p(
        r"max_model_len.*(?:greater than|exceeds).*derived max_model_len",
        _K.CONFIG_ERROR,
        "maxModelLen is longer than the model supports: {line}",
    ),
    # CUDA runtime: the image's CUDA is newer than the node's driver.
    _p(
        r"CUDA driver version is insufficient|forward compatibility was attempted",
        _K.CONFIG_ERROR,
        "The image needs a newer NVIDIA driver than the node has: {line}",
    ),
)

_IMAGE_PULL_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "ImageInspectError",
        "RegistryUnavailable",
        "SignatureValidationFailed",
    }
)
_CONFIG_REASONS = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
# The runtime could not start the command at all (bad command, exec format).
_CANNOT_RUN_REASONS = frozenset({"ContainerCannotRun", "StartError"})
# SIGKILL, SIGTERM, or a clean exit (a graceful stop writes no wrapper note): the
# engine was stopped, it did not crash.
_STOP_EXIT_CODES = frozenset({0, 137, 143})

# "(Worker pid=17683) ERROR 11-30 09:49:16 [multiproc_executor.py:1063] " and friends.
_LOG_PREFIX = re.compile(
    r"^(?:\([\w .-]+ pid=\d+\)\s*)?"
    r"(?:(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)"
    r"(?::|\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\])\s*)?"
)
_QUIET_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "WARN"})
# A line that states an error: "ValueError: ...", "torch._dynamo.exc.Unsupported: ...",
# 'ValueError("type fp8e4nv ...")', "api_server.py: error: ...", crashes without an
# exception ("Segmentation fault (core dumped)"), and the source line of a failed
# assertion on the KV dtype, which tracebacks print (the H200 e5m2 crash).
_ERROR_LINE = re.compile(
    r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Unsupported)\b\s*[:(]|^[^:]{1,80}: error: "
    r"|CUDA error: |NCCL error|Segmentation fault|core dumped"
    r"|^assert\b.*\bkv_cache_dtype\b"
)
# Our evidence wrapper notes a stop signal it passed on: the engine was stopped from
# outside (a failed startup probe, a deletion), it did not crash.
_STOPPED = re.compile(r"signal \d+ was forwarded")
# vLLM's re-raises that point elsewhere: "See root cause above", "for the root cause".
_POINTER_LINE = re.compile(r"root cause|See stack trace", re.IGNORECASE)
# The OpenAI server logs this once the engine is up and the port answers.
_SERVER_READY = re.compile(r"Application startup complete")


def classify_failure(evidence: FailureEvidence, *, kv_cache_dtype: str) -> Classification:
    """Say what failed, in one sentence, and whether another KV-cache dtype may fix it."""
    quantized = kv_cache_dtype != "auto"
    pod_level = _classify_pod_level(evidence)
    if pod_level is not None:
        return pod_level

    lines = _error_lines(evidence.text)
    found = _first_known(lines, kv_cache_dtype)
    root_at = _root_cause_index(lines)
    cause_at = found[2] if found else root_at
    excerpt = _excerpt(lines, min(cause_at, root_at))
    head = _short(lines[cause_at]) if lines else f"exit code {evidence.exit_code}"

    logs = (evidence.termination_message, evidence.log_tail)
    if evidence.was_ready or any(_served_before_failure(log) for log in logs):
        return Classification(
            _K.CRASH_AFTER_READY,
            False,
            f"The engine crashed after it had started serving ({head}); "
            "a different KV-cache dtype is not expected to help.",
            excerpt,
        )

    if found is not None:
        pattern, reason, _ = found
        if pattern.kind is _K.DTYPE_REJECTED and not quantized:
            return Classification(
                _K.UNKNOWN,
                False,
                f"{reason.rstrip('.')}; the KV cache is already auto, "
                "so there is no dtype to fall back from.",
                excerpt,
            )
        return Classification(pattern.kind, pattern.kind is _K.DTYPE_REJECTED, reason, excerpt)

    code = evidence.exit_code
    if code in _STOP_EXIT_CODES or _STOPPED.search(evidence.termination_message):
        return Classification(
            _K.KILLED,
            False,
            f"The engine was stopped (exit code {code}) before it was ready, "
            "usually by the kubelet after the startup probe ran out of time.",
            excerpt,
        )
    if evidence.crashed and quantized:
        return Classification(
            _K.DTYPE_SUSPECT,
            True,
            f"The engine crashed during start-up with the {kv_cache_dtype} KV cache and "
            f"an error that names no known cause ({head}); treating the dtype as suspect.",
            excerpt,
        )
    return Classification(
        _K.UNKNOWN,
        False,
        f"The engine failed for a reason kvq does not recognise ({head}).",
        excerpt,
    )


def _classify_pod_level(evidence: FailureEvidence) -> Classification | None:
    """Failures the kubelet or scheduler reports; the engine never ran or was killed."""
    if evidence.unschedulable:
        message = evidence.unschedulable_message or ""
        return Classification(
            _K.UNSCHEDULABLE,
            False,
            f"The pod cannot be scheduled: {_short(message) or 'no node fits'}.",
            bound_excerpt(message),
        )
    waiting = evidence.waiting_reason
    if waiting in _IMAGE_PULL_REASONS:
        return Classification(
            _K.IMAGE_PULL,
            False,
            f"The engine image cannot be pulled ({waiting}): {_short(evidence.waiting_message)}.",
            bound_excerpt(f"{waiting}: {evidence.waiting_message}"),
        )
    if waiting in _CONFIG_REASONS:
        return Classification(
            _K.CONFIG_ERROR,
            False,
            f"The engine container cannot be created ({waiting}): "
            f"{_short(evidence.waiting_message)}.",
            bound_excerpt(f"{waiting}: {evidence.waiting_message}"),
        )
    if evidence.terminated_reason in _CANNOT_RUN_REASONS:
        message = evidence.termination_message
        return Classification(
            _K.CONFIG_ERROR,
            False,
            f"The engine command could not be started ({evidence.terminated_reason}): "
            f"{_short(message)}.",
            bound_excerpt(message),
        )
    if evidence.terminated_reason == "OOMKilled":
        return Classification(
            _K.OOM_KILLED,
            False,
            "The engine was killed for exceeding its memory limit (OOMKilled, "
            f"exit code {evidence.exit_code}); raise the memory limit, not the dtype.",
            bound_excerpt(f"OOMKilled (exit code {evidence.exit_code})"),
        )
    if evidence.pod_reason == "Evicted":
        return Classification(
            _K.EVICTED,
            False,
            f"The pod was evicted: {_short(evidence.pod_message)}.",
            bound_excerpt(evidence.pod_message),
        )
    return None


def _error_lines(text: str) -> list[str]:
    """Distinct lines that state an error, log prefixes and quiet levels removed, in order."""
    seen: set[str] = set()
    out: list[str] = []
    for raw in text.splitlines():
        match = _LOG_PREFIX.match(raw)
        level = match.group("level") if match else None
        if level in _QUIET_LEVELS:
            continue
        line = raw[match.end() if match else 0 :].strip()
        if not line or line in seen or not _ERROR_LINE.search(line):
            continue
        seen.add(line)
        out.append(line)
    return out


def _first_known(lines: list[str], dtype: str) -> tuple[Pattern, str, int] | None:
    """The earliest error line a pattern knows: (pattern, reason, line index)."""
    for index, line in enumerate(lines):
        for pattern in PATTERNS:
            match = pattern.regex.search(line)
            if match is not None:
                groups = {k: (v or "").strip() for k, v in match.groupdict().items()}
                reason = pattern.reason.format(dtype=dtype, line=_short(line), **groups)
                return pattern, _sentence(reason), index
    return None


def _root_cause_index(lines: list[str]) -> int:
    """The first line that is not one of vLLM's wrappers pointing "above" to the cause."""
    for index, line in enumerate(lines):
        if not _POINTER_LINE.search(line):
            return index
    return 0


def _served_before_failure(text: str) -> bool:
    """The log shows the server finished starting before the first error line."""
    ready_at = _SERVER_READY.search(text)
    if ready_at is None:
        return False
    before = text[: ready_at.start()]
    return not _error_lines(before)


def _excerpt(lines: list[str], start: int) -> str:
    return bound_excerpt("\n".join(lines[start:]))


def _sentence(text: str) -> str:
    return text if text.endswith((".", "!", "?")) else text + "."


def _short(line: str, limit: int = 300) -> str:
    line = line.strip().rstrip(".")
    return line if len(line) <= limit else line[: limit - 3] + "..."
