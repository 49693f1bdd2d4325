"""What one `kvq fetch` run did, for its log line and for tests."""

from __future__ import annotations

from dataclasses import dataclass, field


class CacheFullError(OSError):
    """The cache volume has less free space than the missing files need."""


@dataclass
class FetchReport:
    uri: str
    version: str
    """The commit fetched (hf://) or the prefix (s3://)."""
    path: str
    """The fetched model's directory in the cache (what the link points at)."""
    downloaded: list[str] = field(default_factory=list)
    downloaded_bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    """Present and verified by an earlier run: neither downloaded nor hashed again."""
    skipped_bytes: int = 0
    verified: list[str] = field(default_factory=list)
    """Hashed in this run and found equal to the published checksum."""
    unverifiable: list[str] = field(default_factory=list)
    """Checked by size only (S3 objects whose ETag is no MD5, e.g. KMS-encrypted)."""
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        gib = 1024**3
        line = (
            f"kvq fetch: {self.uri} ({self.version}) -> {self.path}: "
            f"{len(self.downloaded)} files downloaded ({self.downloaded_bytes / gib:.2f} GiB), "
            f"{len(self.skipped)} already present ({self.skipped_bytes / gib:.2f} GiB), "
            f"{len(self.verified)} verified"
        )
        if self.unverifiable:
            line += f", {len(self.unverifiable)} checked by size only"
        return "\n".join([line, *self.notes])


def ensure_free_space(free_bytes: int, needed_bytes: int, where: str) -> None:
    """Refuse to start a download that cannot fit (a full volume fails halfway otherwise)."""
    if needed_bytes > free_bytes:
        gib = 1024**3
        raise CacheFullError(
            f"the cache volume at {where} has {free_bytes / gib:.1f} GiB free, the model "
            f"needs {needed_bytes / gib:.1f} GiB more: No space left on device"
        )
