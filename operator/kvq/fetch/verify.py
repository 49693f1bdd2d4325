"""Checksums the way the Hub and S3 publish them, and the record of what was checked.

Hub: an LFS file's sha256 (siblings[].lfs.sha256), a small file's git blob id (sha1 of
"blob <size>\\0" + content). S3: the ETag, which is the MD5 of the object for a single-part
upload and the MD5 of the parts' MD5s, "-<parts>", for a multipart one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_CHUNK = 8 * 1024 * 1024


class VerificationError(RuntimeError):
    """A downloaded file does not match its published checksum (it has been deleted)."""


def _chunks(path: Path, size: int = _CHUNK) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(size):
            yield chunk


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    for chunk in _chunks(path):
        digest.update(chunk)
    return digest.hexdigest()


def git_blob_id(path: Path) -> str:
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
    for chunk in _chunks(path):
        digest.update(chunk)
    return digest.hexdigest()


def s3_etag_of(path: Path, part_size: int | None) -> str:
    """The ETag S3 gives an upload of this file: plain MD5, or multipart with `part_size`."""
    if part_size is None:
        whole = hashlib.md5(usedforsecurity=False)
        for chunk in _chunks(path):
            whole.update(chunk)
        return whole.hexdigest()
    parts: list[bytes] = []
    for chunk in _chunks(path, part_size):
        parts.append(hashlib.md5(chunk, usedforsecurity=False).digest())
    return f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}"


def read_record(path: str) -> dict[str, dict[str, Any]]:
    """What was verified before: file -> facts (size and checksum); empty when none."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return files if isinstance(files, dict) else {}


def write_record(path: str, files: dict[str, dict[str, Any]]) -> None:
    """Atomically replace the record (a reader never sees half of it)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".record-", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump({"files": files}, handle, sort_keys=True, indent=1)
    os.replace(tmp, target)


def point_link(link: str, target: str) -> None:
    """Make `link` a symlink to `target`, replacing what was there in one step."""
    link_path = Path(link)
    link_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = link_path.with_name(f".{link_path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link_path)
