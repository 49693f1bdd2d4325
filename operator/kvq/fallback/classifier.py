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
  GPU hardware, tensor-parallel size, memory, image, configuration, a model the engine
  cannot build from its config, a crash after the server was ready): Degraded, with what
  to do.

A model-config error (ModelConfigError) is told by where it was raised, not by its words:
a `ValueError`, `TypeError` or validation error whose traceback runs through the building
of the model class (`__init__` in `vllm/model_executor/models/`) or of its configuration
(`vllm/config/`, `vllm/transformers_utils/`, transformers' `configuration_*.py`), and not
through attention or KV-cache code, and whose message does not name the KV cache. vLLM 0.26
on DeepSeek-V2-Lite without `n_group`/`topk_group` is one ("num_expert_group and
topk_group must be provided when use_grouped_topk is True", raised by the fused-MoE router
the model's `__init__` builds): the same under any dtype, so never DtypeSuspect. The
frames come from the log, or from kvq's evidence wrapper, which writes each cause's
innermost engine frames under it.

Each family's action and remedy, and the known failure messages (a regex, the family it
proves, the reason and its source), are data: `failures.yaml` beside this module. Known
messages are checked line by line, earliest line first, so a root cause printed before
vLLM's wrappers ("see root cause above") wins over them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kvq.api.credentials import redact_text
from kvq.fallback.evidence import FailureEvidence, bound_excerpt
from kvq.fallback.log_lines import (
    Frame,
    context_lines,
    error_lines,
    excerpt_from,
    raising_frames,
    root_cause_index,
    sentence,
    served_before_failure,
    short,
    signature_of,
)


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
    MODEL_CONFIG_ERROR = "ModelConfigError"
    DTYPE_CLEARED = "DtypeCleared"
    MODEL_UNAVAILABLE = "ModelUnavailable"
    UNKNOWN = "Unknown"


class Action(StrEnum):
    FALLBACK = "fallback"
    FALLBACK_AFTER_REPEATS = "fallback-after-repeats"
    WAIT = "wait"
    FIX = "fix"


_K = FailureKind


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


@dataclass(frozen=True)
class KnownFailures:
    """failures.yaml: each family's action and remedy, and the known messages in order."""

    remedies: Mapping[FailureKind, tuple[Action, str]]
    patterns: tuple[Pattern, ...]


def load_known_failures(path: Path | None = None) -> KnownFailures:
    """Read failures.yaml (or `path`); a family without a remedy, an unknown family or action,
    or a regex that does not compile is an error naming the row."""
    if path is None:
        text = resources.files("kvq.fallback").joinpath("failures.yaml").read_text("utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    data: dict[str, Any] = yaml.safe_load(text)
    remedies = {
        FailureKind(row["kind"]): (Action(row["action"]), str(row["remedy"]))
        for row in data["families"]
    }
    missing = [kind.value for kind in FailureKind if kind not in remedies]
    if missing:
        raise ValueError(f"failures.yaml: no family row for {', '.join(missing)}")
    patterns = []
    for index, row in enumerate(data["patterns"]):
        regex = row["regex"]
        # A list is the regex's alternatives, one per line for reading.
        joined = "|".join(regex) if isinstance(regex, list) else str(regex)
        try:
            compiled = re.compile(joined, re.IGNORECASE)
        except re.error as error:
            raise ValueError(f"failures.yaml: pattern {index} ({joined!r}): {error}") from error
        patterns.append(Pattern(compiled, FailureKind(row["kind"]), str(row["reason"])))
    return KnownFailures(remedies, tuple(patterns))


_KNOWN = load_known_failures()
# What each family means for the service: the action and what a person should do.
REMEDIES = _KNOWN.remedies
# Known messages, checked in this order on each error line.
PATTERNS = _KNOWN.patterns

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
# Our evidence wrapper notes a stop signal it passed on: the engine was stopped from
# outside (a failed startup probe, a deletion), it did not crash.
_STOPPED = re.compile(r"signal \d+ was forwarded")
# The engine core's busy loop dies with this (start-up failures say "failed to start"),
# and dumps the scheduler with requests in flight.
_DIED_SERVING = re.compile(r"encountered a fatal error|num_running_reqs=[1-9]")
# What a model's config.json gets wrong surfaces as one of these (transformers' strict
# config classes raise huggingface_hub's StrictDataclass...ValidationError; vLLM's pydantic
# configs a ValidationError).
_CONFIG_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?\w*(?:ValueError|TypeError|ValidationError)\b")
# Frames that build the model class or its configuration (vLLM 0.26 and 0.32 layouts).
_BUILDS_MODEL = re.compile(r"(?:^|/)vllm/model_executor/models/[^/]+\.py$")
_BUILDS_CONFIG = re.compile(
    r"(?:^|/)(?:vllm/config/[^/]+\.py|vllm/transformers_utils/(?:config\.py|configs/[^/]+\.py)"
    r"|transformers/configuration_utils\.py|transformers/models/[^/]+/configuration_[^/]+\.py)$"
)
# Code whose failures can depend on the KV-cache dtype: attention layers and backends, the
# platform's backend selection, the KV cache itself.
# (vllm/config/cache.py holds the KV-cache dtype.)
_DTYPE_CODE = re.compile(
    r"(?:^|/)vllm/(?:.*attention.*|platforms/.*|.*kv_cache.*|config/cache\.py)$"
)
_NAMES_KV_CACHE = re.compile(r"kv[ _-]?cache|cache[ _-]dtype|CacheConfig", re.IGNORECASE)


def classify_failure(evidence: FailureEvidence, *, kv_cache_dtype: str) -> Classification:
    """Say what failed, in one sentence, and which family (hence action) it belongs to."""
    quantized = kv_cache_dtype != "auto"
    pod_level = _classify_pod_level(evidence)
    if pod_level is not None:
        return pod_level

    lines = error_lines(evidence.text)
    # Error lines first; then the warnings and continuation lines around them (the Hub's
    # retries are warnings, and an exception's message may sit on the line after it).
    found = _first_known(lines, kv_cache_dtype)
    if found is None:
        context = context_lines(evidence.text)
        known = _first_known(context, kv_cache_dtype, refusals=False)
        if known is not None:
            lines = [context[known[2]], *lines]
            found = (known[0], known[1], 0)
    root_at = root_cause_index(lines)
    cause_at = found[2] if found else root_at
    excerpt = excerpt_from(lines, min(cause_at, root_at))
    head = short(lines[cause_at]) if lines else f"exit code {evidence.exit_code}"
    signature = signature_of(head)

    def verdict(kind: FailureKind, reason: str) -> Classification:
        return Classification(kind, redact_text(reason), excerpt, signature)

    logs = (evidence.termination_message, evidence.log_tail)
    if evidence.was_ready or any(
        served_before_failure(log) or _DIED_SERVING.search(log) for log in logs
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

    built = _model_config_error(lines, raising_frames(evidence.text), kv_cache_dtype)
    if built is not None:
        line = short(lines[built])
        return Classification(
            _K.MODEL_CONFIG_ERROR,
            redact_text(
                f"The engine could not build the model from its configuration ({line}); "
                "the same happens with any KV-cache dtype."
            ),
            excerpt_from(lines, built),
            signature_of(line),
        )

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


def dtype_cleared(excerpt: str, signature: str, kv_cache_dtype: str) -> Classification:
    """A crash the ladder proved is not the dtype's: it happened under auto too."""
    head = short(excerpt.splitlines()[0]) if excerpt else "the same error"
    return Classification(
        _K.DTYPE_CLEARED,
        redact_text(
            f"The engine crashes the same way with the auto KV cache as with the "
            f"{kv_cache_dtype} KV cache ({head}), so the {kv_cache_dtype} KV cache is not the "
            "cause."
        ),
        excerpt,
        signature,
    )


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
            f"The pod cannot be scheduled: {short(message) or 'no node fits'}.",
            message,
        )
    waiting = evidence.waiting_reason
    if waiting in _IMAGE_PULL_REASONS:
        return verdict(
            _K.IMAGE_PULL,
            f"The engine image cannot be pulled ({waiting}): {short(evidence.waiting_message)}.",
            f"{waiting}: {evidence.waiting_message}",
        )
    if waiting in _CONFIG_REASONS:
        return verdict(
            _K.CONFIG_ERROR,
            f"The engine container cannot be created ({waiting}): "
            f"{short(evidence.waiting_message)}.",
            f"{waiting}: {evidence.waiting_message}",
        )
    if evidence.terminated_reason in _CANNOT_RUN_REASONS:
        message = evidence.termination_message
        return verdict(
            _K.CONFIG_ERROR,
            f"The engine command could not be started ({evidence.terminated_reason}): "
            f"{short(message)}.",
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
            f"The pod was evicted: {short(evidence.pod_message)}.",
            evidence.pod_message,
        )
    return None


def _model_config_error(
    lines: list[str], frames: Mapping[str, tuple[Frame, ...]], dtype: str
) -> int | None:
    """The first error line raised while the model class or its config was built, if any."""
    for index, line in enumerate(lines):
        stack = frames.get(line, ())
        if not _CONFIG_EXCEPTION.match(line) or not stack:
            continue
        if _NAMES_KV_CACHE.search(line) or (dtype != "auto" and dtype.lower() in line.lower()):
            continue
        if any(_DTYPE_CODE.search(f.path) for f in stack):
            continue
        if any(
            (_BUILDS_MODEL.search(f.path) and f.function == "__init__")
            or _BUILDS_CONFIG.search(f.path)
            for f in stack
        ):
            return index
    return None


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
                reason = pattern.reason.format(dtype=dtype, line=short(line), **groups)
                return pattern, sentence(reason), index
    return None
