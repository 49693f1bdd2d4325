"""The init container's failures, as huggingface_hub, botocore and kvq fetch word them:
each is ModelUnavailable with what to do, transient ones wait, and no secret leaks."""

from __future__ import annotations

import pytest

from kvq.fetch.failures import classify_fetch_failure, fetch_failure, fetch_termination_message

HEAD = "kvq fetch hf://meta-llama/Llama-3.1-8B-Instruct failed\n"
CASES = [
    (
        "huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. (Request ID: "
        "Root=1-6745)\n\nRepository Not Found for url: https://huggingface.co/api/models/"
        "acme/private/revision/main.\nPlease make sure you specified the correct `repo_id` "
        "and `repo_type`.\nIf you are trying to access a private or gated repo, make sure you "
        "are authenticated and your token has the required permissions.",
        "repo-not-found",
        False,
    ),
    (
        "huggingface_hub.errors.GatedRepoError: 403 Client Error. (Request ID: Root=1-67)\n\n"
        "Cannot access gated repo for url https://huggingface.co/api/models/meta-llama/"
        "Llama-3.1-8B/revision/main.\nAccess to model meta-llama/Llama-3.1-8B is restricted "
        "and you are not in the authorized list.",
        "gated",
        False,
    ),
    (
        "huggingface_hub.errors.RevisionNotFoundError: 404 Client Error. (Request ID: x)\n\n"
        "Revision Not Found for url: https://huggingface.co/api/models/a/b/revision/v9.\n"
        "Invalid rev id: v9",
        "revision-not-found",
        False,
    ),
    (
        "huggingface_hub.errors.HfHubHTTPError: 401 Client Error: Unauthorized for url: "
        "https://huggingface.co/api/models/a/b (Request ID: x)\nInvalid credentials in "
        "Authorization header",
        "credentials-refused",
        False,
    ),
    (
        "huggingface_hub.errors.HfHubHTTPError: 503 Server Error: Service Unavailable for "
        "url: https://huggingface.co/api/models/a/b/revision/main",
        "unreachable",
        True,
    ),
    ("httpx2.ConnectError: [Errno -3] Temporary failure in name resolution", "unreachable", True),
    (
        "botocore.exceptions.ClientError: An error occurred (AccessDenied) when calling the "
        "ListObjectsV2 operation: Access Denied",
        "access-denied",
        False,
    ),
    (
        "botocore.exceptions.ClientError: An error occurred (NoSuchBucket) when calling the "
        "ListObjectsV2 operation: The specified bucket does not exist",
        "bucket-not-found",
        False,
    ),
    (
        "botocore.exceptions.NoCredentialsError: Unable to locate credentials",
        "no-credentials",
        False,
    ),
    (
        "botocore.exceptions.ClientError: An error occurred (InvalidAccessKeyId) when calling "
        "the ListObjectsV2 operation: The AWS Access Key Id you provided does not exist",
        "credentials-refused",
        False,
    ),
    (
        'botocore.exceptions.EndpointConnectionError: Could not connect to the endpoint URL: "'
        'https://s3.us-east-1.amazonaws.com/acme?list-type=2"',
        "unreachable",
        True,
    ),
    (
        "kvq.fetch.s3.NoObjectsError: NoSuchKey: no objects under s3://acme/llama",
        "no-objects",
        False,
    ),
    (
        "kvq.fetch.report.CacheFullError: the cache volume at /kvq-cache has 3.0 GiB free, "
        "the model needs 15.0 GiB more: No space left on device",
        "cache-full",
        False,
    ),
    (
        "PermissionError: [Errno 13] Permission denied: '/kvq-cache/hub'",
        "cache-not-writable",
        False,
    ),
    (
        "kvq.fetch.verify.VerificationError: verification failed: model.safetensors has "
        "sha256 ab, the Hub publishes cd; the file was deleted and is downloaded again",
        "verification-failed",
        True,
    ),
    ("ValueError: something nobody expected", "unknown", False),
]


@pytest.mark.parametrize(("message", "kind", "transient"), CASES, ids=[c[1] for c in CASES])
def test_failure_kind_and_whether_it_passes(message: str, kind: str, transient: bool) -> None:
    failure, evidence = fetch_failure(HEAD + message)
    assert (failure.kind, failure.transient) == (kind, transient)
    assert evidence  # a line of the library's own words
    reason, text = classify_fetch_failure(HEAD + message)
    assert reason == "ModelUnavailable"
    assert text.startswith(f"the model could not be downloaded: {failure.explanation} (")


def test_tokens_in_the_message_are_redacted() -> None:
    message = (
        "huggingface_hub.errors.HfHubHTTPError: 401 Client Error: Unauthorized "
        "(Authorization: Bearer hf_abcdefghijklmnopqrstuvwxyz0123)"
    )
    _, text = classify_fetch_failure(message)
    assert "hf_abcdefghijklmnop" not in text
    assert "<redacted>" in text


def test_an_empty_message_is_still_model_unavailable() -> None:
    assert classify_fetch_failure("") == (
        "ModelUnavailable",
        "the model could not be downloaded: the model download failed; the init container's "
        "log has the details",
    )


def _pod(init_status: dict[str, object] | None) -> dict[str, object]:
    statuses = [] if init_status is None else [{"name": "kvq-fetch", **init_status}]
    return {
        "status": {
            "phase": "Pending",
            "initContainerStatuses": statuses,
            "containerStatuses": [
                {"name": "vllm", "state": {"waiting": {"reason": "PodInitializing"}}}
            ],
        }
    }


def test_the_failed_downloads_message_is_read_from_the_pod() -> None:
    looping = {
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "message": "NoSuchBucket"}},
    }
    assert fetch_termination_message(_pod(looping)) == "NoSuchBucket"
    once = {"state": {"terminated": {"exitCode": 1, "message": "RepositoryNotFoundError"}}}
    assert fetch_termination_message(_pod(once)) == "RepositoryNotFoundError"
    done = {"state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    assert fetch_termination_message(_pod(done)) is None
    running = {"state": {"running": {}}, "lastState": {}}
    assert fetch_termination_message(_pod(running)) is None
    assert fetch_termination_message(_pod(None)) is None
