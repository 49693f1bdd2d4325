"""What a failed model download means: the init container's termination message, classified.

Pure (no huggingface_hub, no boto3): the operator's failure classifier calls
`classify_fetch_failure` with the `message` of the `kvq-fetch` init container's last
termination. `kvq fetch` writes the library's own error there (`RepositoryNotFoundError:
404 Client Error ...`, `An error occurred (AccessDenied) ...`); when the fetcher was killed
before it could, the kubelet's tail of its log (FallbackToLogsOnError) carries the same
lines. Every download failure is ModelUnavailable: another KV-cache dtype cannot fix it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvq.api.credentials import redact_text
from kvq.fallback.classifier import FailureKind

FETCH_CONTAINER = "kvq-fetch"
"""The init container's name in the engine pod."""
_EXCERPT_CHARS = 600


@dataclass(frozen=True)
class FetchFailure:
    kind: str
    """A short name for the cause (repo-not-found, access-denied, network, ...)."""
    transient: bool
    """True: the kubelet's restart of the init container may succeed on its own (wait);
    False: a person must change something (the URI, a credential, the cache size)."""
    explanation: str
    """What it means and what to do."""


# (pattern, failure): the first pattern found in the message wins, so specific causes come
# before the generic HTTP codes they also contain.
FETCH_FAILURES: tuple[tuple[re.Pattern[str], FetchFailure], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), failure)
    for pattern, failure in (
        (
            # Not "gated repo" alone: every RepositoryNotFoundError ends "If you are trying to
            # access a private or gated repo, make sure you are authenticated".
            r"GatedRepoError|Cannot access gated repo|is restricted and you are not in the "
            r"authorized list",
            FetchFailure(
                "gated",
                False,
                "the Hugging Face repository is gated: accept its license on the Hub with the "
                "account of the token in spec.model.tokenSecretRef",
            ),
        ),
        (
            r"RevisionNotFoundError|Invalid rev id|Revision Not Found",
            FetchFailure(
                "revision-not-found",
                False,
                "spec.model.revision does not exist in the repository (a branch, tag or "
                "commit of the model)",
            ),
        ),
        (
            r"RepositoryNotFoundError|Repository Not Found|RepoNotFound",
            FetchFailure(
                "repo-not-found",
                False,
                "the Hugging Face Hub has no such repository, or it is private and the token "
                "in spec.model.tokenSecretRef cannot read it",
            ),
        ),
        (
            r"EntryNotFoundError|Entry Not Found",
            FetchFailure(
                "file-not-found", False, "a file the repository lists could not be downloaded"
            ),
        ),
        (
            r"NoSuchBucket",
            FetchFailure(
                "bucket-not-found", False, "the S3 bucket of spec.model.uri does not exist"
            ),
        ),
        (
            r"NoSuchKey|no objects under",
            FetchFailure("no-objects", False, "there are no model files under the s3:// prefix"),
        ),
        (
            r"NoCredentialsError|Unable to locate credentials|LocalTokenNotFoundError",
            FetchFailure(
                "no-credentials",
                False,
                "the download found no credentials: set spec.pod.serviceAccountName (workload "
                "identity, IRSA) or AWS_* variables from a Secret in spec.model.envFrom",
            ),
        ),
        (
            r"InvalidAccessKeyId|SignatureDoesNotMatch|ExpiredToken|InvalidToken|"
            r"401 Client Error|Unauthorized|Invalid credentials|Invalid user token",
            FetchFailure(
                "credentials-refused",
                False,
                "the Hub or S3 refused the credentials: check the Secret the token or keys "
                "come from",
            ),
        ),
        (
            r"AccessDenied|Access Denied|403 Client Error|Forbidden",
            FetchFailure(
                "access-denied",
                False,
                "access was denied: the service account's role (IRSA) or the credentials may "
                "not read this model",
            ),
        ),
        (
            r"PermanentRedirect|AuthorizationHeaderMalformed|IllegalLocationConstraint",
            FetchFailure(
                "wrong-region",
                False,
                "the bucket is in another region: set AWS_REGION in spec.model.env",
            ),
        ),
        (
            r"No space left on device|ENOSPC|Disk quota exceeded",
            FetchFailure(
                "cache-full",
                False,
                "the cache volume is full: raise spec.model.cache's size (or free the "
                "existing claim)",
            ),
        ),
        (
            r"Read-only file system|Permission denied",
            FetchFailure(
                "cache-not-writable",
                False,
                "the download step (user 65532) cannot write to the cache volume: give the "
                "claim's files group 65532 or use a storage class that honours fsGroup",
            ),
        ),
        (
            r"verification failed|checksum mismatch",
            FetchFailure(
                "verification-failed",
                True,
                "a downloaded file did not match its published checksum; it was deleted and "
                "the next start downloads it again",
            ),
        ),
        (
            r"\b(500|502|503|504|429)\b|Server Error|Service Unavailable|Bad Gateway|"
            r"Gateway Timeout|Too Many Requests|SlowDown|RequestTimeout|InternalError|"
            r"ConnectError|ConnectTimeout|ReadTimeout|TimeoutException|timed out|"
            r"Connection (reset|refused|aborted)|EndpointConnectionError|"
            r"Could not connect to the endpoint|Temporary failure in name resolution|"
            r"Name or service not known|Max retries exceeded|RemoteDisconnected",
            FetchFailure(
                "unreachable",
                True,
                "the Hub or S3 could not be reached or failed (network, DNS or a server "
                "error); the kubelet restarts the download",
            ),
        ),
    )
)
UNKNOWN = FetchFailure(
    "unknown", False, "the model download failed; the init container's log has the details"
)


def fetch_failure(termination_message: str) -> tuple[FetchFailure, str]:
    """The failure and the line of the message that shows it (redacted, bounded)."""
    lines = [line.strip() for line in termination_message.splitlines() if line.strip()]
    for pattern, failure in FETCH_FAILURES:
        for line in lines:
            if pattern.search(line):
                return failure, _excerpt(line)
    return UNKNOWN, _excerpt(lines[-1] if lines else "")


def classify_fetch_failure(termination_message: str) -> tuple[str, str]:
    """(reason, message) of a failed download: always ModelUnavailable, never a dtype's fault.

    The message says what failed and what to do, then quotes the Hub's or S3's error.
    """
    failure, evidence = fetch_failure(termination_message)
    message = f"the model could not be downloaded: {failure.explanation}"
    if evidence:
        message += f" ({evidence})"
    return FailureKind.MODEL_UNAVAILABLE, message


def _excerpt(line: str) -> str:
    line = redact_text(line)
    return line if len(line) <= _EXCERPT_CHARS else line[: _EXCERPT_CHARS - 3] + "..."


def fetch_termination_message(pod: Mapping[str, Any]) -> str | None:
    """The failed download's termination message from a Pod object, or None if it has not
    failed (not run yet, running, or completed). "" when it failed without a message.

    The engine container waits in PodInitializing meanwhile, so evidence read from the
    engine alone sees nothing: read this first.
    """
    status = pod.get("status")
    statuses = status.get("initContainerStatuses") if isinstance(status, Mapping) else None
    for entry in statuses if isinstance(statuses, list) else []:
        if not isinstance(entry, Mapping) or entry.get("name") != FETCH_CONTAINER:
            continue
        state = entry.get("state") or {}
        terminated = state.get("terminated") or {}
        if terminated and terminated.get("exitCode") == 0:
            return None  # the model is in place
        last = (entry.get("lastState") or {}).get("terminated") or {}
        waiting = state.get("waiting") or {}
        failed = terminated or (last and waiting.get("reason") == "CrashLoopBackOff")
        if not failed:
            return None
        return str((terminated or last).get("message") or "")
    return None
