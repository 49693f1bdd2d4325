"""s3:// models: every object under the prefix, downloaded with boto3 and verified.

Credentials come the way boto3 finds them: workload identity (IRSA's web-identity token
through spec.pod.serviceAccountName), or AWS_* variables from a Secret; AWS_ENDPOINT_URL
points it at an S3-compatible store. An object already in the cache with the size and
ETag an earlier run verified is skipped; a new one is downloaded next to its place,
checked against its ETag (MD5, or the multipart MD5 of MD5s), and moved into place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from filelock import FileLock

from kvq.fetch.layout import ModelRef, s3_dir, select_model_files, verified_record
from kvq.fetch.report import FetchReport, ensure_free_space
from kvq.fetch.verify import VerificationError, read_record, s3_etag_of, write_record

_TRANSFER = TransferConfig(multipart_threshold=64 * 1024**2, max_concurrency=8)


class NoObjectsError(FileNotFoundError):
    """Nothing under the prefix: the URI names no model."""


def fetch_s3(ref: ModelRef, cache: str, *, client: Any | None = None) -> FetchReport:
    """Download every model file under `ref`'s prefix into `cache`; verify; report."""
    s3 = client if client is not None else boto3.client("s3")
    bucket = ref.repo_or_bucket
    root = f"{ref.prefix}/" if ref.prefix else ""
    objects = _list(s3, bucket, root)
    if not objects:
        raise NoObjectsError(f"NoSuchKey: no objects under {ref.uri}")
    by_name = {key[len(root) :]: obj for key, obj in objects.items()}
    wanted = select_model_files(list(by_name))
    target = Path(s3_dir(cache, ref))
    record_path = verified_record(cache, ref, ref.prefix)
    report = FetchReport(uri=ref.uri, version=ref.prefix or "/", path=str(target))
    target.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{record_path}.lock"):
        record = read_record(record_path)
        missing = [n for n in wanted if not _present(target / n, by_name[n], record.get(n))]
        ensure_free_space(
            shutil.disk_usage(target).free, sum(int(by_name[n]["Size"]) for n in missing), cache
        )
        for name in wanted:
            obj = by_name[name]
            if name not in missing:
                report.skipped.append(name)
                report.skipped_bytes += int(obj["Size"])
                continue
            record[name] = _download(s3, bucket, obj, target / name, report)
            write_record(record_path, record)  # progress survives a restart
            report.downloaded.append(name)
            report.downloaded_bytes += int(obj["Size"])
        write_record(record_path, record)
    return report


def _list(s3: Any, bucket: str, root: str) -> dict[str, dict[str, Any]]:
    objects: dict[str, dict[str, Any]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=root):
        for obj in page.get("Contents", []):
            if not obj["Key"].endswith("/"):
                objects[obj["Key"]] = obj
    return objects


def _present(path: Path, obj: dict[str, Any], facts: dict[str, Any] | None) -> bool:
    return (
        facts is not None
        and path.is_file()
        and path.stat().st_size == int(obj["Size"])
        and facts.get("etag") == _etag(obj)
    )


def _etag(obj: dict[str, Any]) -> str:
    return str(obj.get("ETag", "")).strip('"')


def _download(
    s3: Any, bucket: str, obj: dict[str, Any], path: Path, report: FetchReport
) -> dict[str, Any]:
    """Download next to `path`, verify, move into place; the facts for the record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        s3.download_file(bucket, obj["Key"], str(tmp), Config=_TRANSFER)
        etag = _etag(obj)
        size = tmp.stat().st_size
        if size != int(obj["Size"]):
            raise VerificationError(
                f"verification failed: {obj['Key']} has {size} bytes, S3 lists {obj['Size']}"
            )
        checked = _check_etag(s3, bucket, obj, tmp, etag)
        name = str(obj["Key"])
        (report.verified if checked else report.unverifiable).append(name)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return {"size": size, "etag": etag}


def _check_etag(s3: Any, bucket: str, obj: dict[str, Any], path: Path, etag: str) -> bool:
    """True when the ETag was checked; False when it is no MD5 (KMS/SSE-C encryption)."""
    part_size: int | None = None
    if "-" in etag:
        # A multipart upload: part 1's length is the part size every part but the last has.
        head = s3.head_object(Bucket=bucket, Key=obj["Key"], PartNumber=1)
        part_size = int(head["ContentLength"])
    elif len(etag) != 32:
        return False
    actual = s3_etag_of(path, part_size)
    if actual == etag:
        return True
    if "-" not in etag and _encrypted(s3, bucket, obj["Key"]):
        return False  # SSE-KMS / SSE-C ETags are not the MD5 of the content
    raise VerificationError(
        f"verification failed: {obj['Key']} has ETag {actual}, S3 publishes {etag}; the "
        "file was deleted and is downloaded again at the next start"
    )


def _encrypted(s3: Any, bucket: str, key: str) -> bool:
    head = s3.head_object(Bucket=bucket, Key=key)
    return head.get("ServerSideEncryption") == "aws:kms" or "SSECustomerAlgorithm" in head
