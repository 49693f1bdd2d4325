"""`kvq fetch` against a real S3-compatible server (moto's, on 127.0.0.1): the download step
fetches a model, verifies it against its ETags (single-part and multipart), skips it on the
second run, fetches again what changed, and reports a missing bucket as ModelUnavailable."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from moto.server import ThreadedMotoServer

from kvq.fetch.command import fetch_model, run_fetch
from kvq.fetch.failures import classify_fetch_failure
from kvq.fetch.verify import s3_etag_of

BUCKET = "acme-models"
PREFIX = "llama-tiny"
MIB = 1024 * 1024
# Small parts so a 12 MiB file is a real multipart upload (ETag "<md5 of md5s>-3").
MULTIPART = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_env(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """boto3 finds the server and (fake) keys the way the init container does: from env."""
    for name, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "kvq-test",
        "AWS_SECRET_ACCESS_KEY": "kvq-test-secret",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    yield client
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    client.delete_bucket(Bucket=BUCKET)


def _model_files() -> dict[str, bytes]:
    weights = hashlib.sha256(b"kvq").digest() * (12 * MIB // 32)
    return {
        "config.json": b'{"model_type": "llama", "num_hidden_layers": 2}',
        "tokenizer.json": b'{"version": "1.0"}',
        "model.safetensors": weights,
        # Beside safetensors, vLLM loads neither of these: never downloaded.
        "pytorch_model.bin": b"torch weights",
        "original/consolidated.00.pth": b"meta weights",
    }


def _upload(client: Any, tmp_path: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        source = tmp_path / "upload" / name
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_bytes(data)
        client.upload_file(str(source), BUCKET, f"{PREFIX}/{name}", Config=MULTIPART)


def test_fetch_downloads_verifies_then_skips(s3_env: Any, tmp_path: Path) -> None:
    files = _model_files()
    _upload(s3_env, tmp_path, files)
    etag = s3_env.head_object(Bucket=BUCKET, Key=f"{PREFIX}/model.safetensors")["ETag"]
    assert etag.strip('"').endswith("-3")  # the weights really are a multipart upload
    cache, link = tmp_path / "cache", tmp_path / "pod" / "model"

    first = fetch_model(f"s3://{BUCKET}/{PREFIX}", None, str(cache), str(link))
    wanted = ["config.json", "model.safetensors", "tokenizer.json"]
    assert sorted(first.downloaded) == wanted
    assert sorted(first.verified) == sorted(f"{PREFIX}/{n}" for n in wanted)
    assert first.skipped == []
    assert sorted(p.name for p in link.iterdir()) == wanted
    for name in wanted:
        assert (link / name).read_bytes() == files[name]

    second = fetch_model(f"s3://{BUCKET}/{PREFIX}", None, str(cache), str(link))
    assert second.downloaded == []
    assert sorted(second.skipped) == wanted
    assert second.skipped_bytes == sum(len(files[n]) for n in wanted)


def test_fetch_again_what_changed_or_is_damaged(s3_env: Any, tmp_path: Path) -> None:
    files = _model_files()
    _upload(s3_env, tmp_path, files)
    cache = tmp_path / "cache"
    uri = f"s3://{BUCKET}/{PREFIX}"
    fetch_model(uri, None, str(cache), None)

    # A new upload of the config (new ETag) and a truncated local copy of the tokenizer.
    _upload(s3_env, tmp_path, {"config.json": b'{"model_type": "llama", "num_hidden_layers": 4}'})
    local_tokenizer = cache / "s3" / BUCKET / PREFIX / "tokenizer.json"
    local_tokenizer.write_bytes(b"{")
    again = fetch_model(uri, None, str(cache), None)
    assert sorted(again.downloaded) == ["config.json", "tokenizer.json"]
    assert again.skipped == ["model.safetensors"]
    assert local_tokenizer.read_bytes() == files["tokenizer.json"]


def test_missing_bucket_is_model_unavailable(
    s3_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "termination-log"
    monkeypatch.setenv("KVQ_TERMINATION_LOG", str(log))
    code = run_fetch("s3://no-such-bucket/llama", None, str(tmp_path / "cache"), None)
    assert code == 1
    message = log.read_text()
    assert "NoSuchBucket" in message
    reason, explanation = classify_fetch_failure(message)
    assert reason == "ModelUnavailable"
    assert explanation.startswith(
        "the model could not be downloaded: the S3 bucket of spec.model.uri does not exist"
    )
    assert "NoSuchBucket" in explanation  # S3's own words are quoted


def test_the_kvq_fetch_command_in_a_pod_like_environment(s3_env: Any, tmp_path: Path) -> None:
    _upload(s3_env, tmp_path, _model_files())
    link = tmp_path / "kvq-model" / "model"
    command = [
        sys.executable,
        "-m",
        "kvq.cli",
        "fetch",
        "--uri",
        f"s3://{BUCKET}/{PREFIX}",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--link",
        str(link),
    ]
    # As in the pod: HOME, HF_HOME and TMPDIR point into the pod's emptyDir, not there yet.
    scratch = str(tmp_path / "kvq-model" / ".home")
    env = {**os.environ, "HOME": scratch, "HF_HOME": scratch, "TMPDIR": scratch}
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "3 files downloaded" in done.stdout
    assert (link / "config.json").is_file()


def test_multipart_etag_matches_s3s_arithmetic(tmp_path: Path) -> None:
    data = os.urandom(11 * MIB)
    path = tmp_path / "blob"
    path.write_bytes(data)
    parts = [data[i : i + 5 * MIB] for i in range(0, len(data), 5 * MIB)]
    md5s = b"".join(hashlib.md5(p, usedforsecurity=False).digest() for p in parts)
    expected = f"{hashlib.md5(md5s, usedforsecurity=False).hexdigest()}-3"
    assert s3_etag_of(path, 5 * MIB) == expected
    assert s3_etag_of(path, None) == hashlib.md5(data, usedforsecurity=False).hexdigest()
