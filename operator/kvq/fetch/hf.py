"""hf:// models: huggingface_hub's snapshot download at a pinned commit, then verification.

The revision (branch, tag or commit) is resolved to a commit first, and that commit is what
is downloaded and linked, so replicas that fetch while a branch moves never mix two
commits. Files an earlier run verified are skipped without hashing; anything else is
hashed against the Hub's published sha256 (LFS) or git blob id.
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import RevisionNotFoundError
from huggingface_hub.utils import disable_progress_bars  # type: ignore[attr-defined]

from kvq.fetch.layout import (
    ModelRef,
    hub_cache_dir,
    hub_repo_dir,
    select_model_files,
    verified_record,
)
from kvq.fetch.report import FetchReport, ensure_free_space
from kvq.fetch.verify import VerificationError, git_blob_id, read_record, sha256_of, write_record

_COMMIT_LEN = 40


def fetch_hf(
    ref: ModelRef,
    revision: str | None,
    cache: str,
    *,
    token: str | None = None,
    endpoint: str | None = None,
) -> FetchReport:
    """Download `ref` at `revision` (default: main) into `cache`; verify; report."""
    disable_progress_bars()
    repo_id = ref.repo_or_bucket
    revision = revision or "main"
    api = HfApi(endpoint=endpoint, token=token)
    try:
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
    except RevisionNotFoundError:
        raise
    except Exception as error:  # httpx2's ConnectError, HfHubHTTPError's 5xx, timeouts...
        # The Hub is unreachable or failing: a copy verified earlier still serves a restart.
        offline = _verified_offline(ref, revision, cache)
        if offline is None or _is_refusal(error):
            raise
        offline.notes.append(f"the Hub could not be asked ({error}); using the verified copy")
        return offline
    commit = str(info.sha)
    siblings = {s.rfilename: s for s in (info.siblings or [])}
    wanted = select_model_files(list(siblings))
    snapshot = Path(hub_repo_dir(cache, repo_id)) / "snapshots" / commit
    record_path = verified_record(cache, ref, commit)
    record = read_record(record_path)
    report = FetchReport(uri=ref.uri, version=commit, path=str(snapshot))

    missing = [name for name in wanted if not _present(snapshot / name, record.get(name))]
    present = [name for name in wanted if name not in missing]
    Path(hub_cache_dir(cache)).mkdir(parents=True, exist_ok=True)
    ensure_free_space(
        shutil.disk_usage(hub_cache_dir(cache)).free,
        sum(_size(siblings[n]) for n in missing if not (snapshot / n).exists()),
        cache,
    )
    found = {name for name in missing if (snapshot / name).exists()}  # never verified
    if missing:
        snapshot_download(
            repo_id,
            revision=commit,
            cache_dir=hub_cache_dir(cache),
            allow_patterns=[glob.escape(name) for name in missing],
            token=token,
            endpoint=endpoint,
        )
    _remember_revision(cache, repo_id, revision, commit)
    for name in present:
        report.skipped.append(name)
        report.skipped_bytes += _size(siblings[name])
    for name in missing:
        facts = _verify(snapshot / name, siblings[name])
        record[name] = facts
        report.verified.append(name)
        if name not in found:
            report.downloaded.append(name)
            report.downloaded_bytes += int(facts["size"])
    write_record(record_path, record)
    return report


def _present(path: Path, facts: dict[str, Any] | None) -> bool:
    """Verified by an earlier run and still the same size (a truncated blob is refetched)."""
    return facts is not None and path.exists() and path.stat().st_size == facts.get("size")


def _size(sibling: Any) -> int:
    lfs = _lfs(sibling)
    if lfs is not None:
        return int(lfs["size"])
    return int(sibling.size or 0)


def _lfs(sibling: Any) -> dict[str, Any] | None:
    lfs = sibling.lfs
    if lfs is None:
        return None
    if isinstance(lfs, dict):
        return lfs
    return {"size": lfs.size, "sha256": lfs.sha256}


def _verify(path: Path, sibling: Any) -> dict[str, Any]:
    """Hash the downloaded file against the Hub's checksum; delete it when it differs."""
    lfs = _lfs(sibling)
    if lfs is not None:
        expected, actual, kind = str(lfs["sha256"]), sha256_of(path), "sha256"
    else:
        expected, actual, kind = str(sibling.blob_id), git_blob_id(path), "git-sha1"
    if actual != expected:
        blob = path.resolve()
        path.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        raise VerificationError(
            f"verification failed: {path.name} has {kind} {actual}, the Hub publishes "
            f"{expected}; the file was deleted and is downloaded again at the next start"
        )
    return {"size": path.stat().st_size, kind: expected}


def _remember_revision(cache: str, repo_id: str, revision: str, commit: str) -> None:
    """refs/<revision> -> commit, as huggingface_hub writes it (its offline mode reads it)."""
    if revision == commit:
        return
    ref_file = Path(hub_repo_dir(cache, repo_id)) / "refs" / revision
    ref_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref_file.with_name(f".{ref_file.name}.tmp")
    tmp.write_text(commit, encoding="utf-8")
    os.replace(tmp, ref_file)


def _verified_offline(ref: ModelRef, revision: str, cache: str) -> FetchReport | None:
    """The copy an earlier run verified completely for `revision`, if there is one."""
    repo_dir = Path(hub_repo_dir(cache, ref.repo_or_bucket))
    if len(revision) == _COMMIT_LEN:
        commit = revision
    else:
        ref_file = repo_dir / "refs" / revision
        if not ref_file.is_file():
            return None
        commit = ref_file.read_text(encoding="utf-8").strip()
    record = read_record(verified_record(cache, ref, commit))
    snapshot = repo_dir / "snapshots" / commit
    if not record or not all(_present(snapshot / n, f) for n, f in record.items()):
        return None
    report = FetchReport(uri=ref.uri, version=commit, path=str(snapshot))
    report.skipped = sorted(record)
    report.skipped_bytes = sum(int(f["size"]) for f in record.values())
    return report


def _is_refusal(error: BaseException) -> bool:
    """401/403/404: the Hub answered and said no; a cached copy must not hide that."""
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    return status in (401, 403, 404)
