"""A Hugging Face Hub stand-in on 127.0.0.1 for `kvq fetch`'s tests: the HTTP API that
huggingface_hub's real client calls for a snapshot download (model info with file
metadata, the recursive tree, HEAD and GET of /resolve/), serving repositories held in
memory. Errors carry the Hub's X-Error-Code headers, which the client turns into its own
exceptions (RepositoryNotFoundError, RevisionNotFoundError)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/?]+)")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/?]+)")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>[^?]+)")
LFS_THRESHOLD = 1024  # files above this are "LFS" files (sha256-addressed), as on the Hub


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    """commit -> files"""
    refs: dict[str, str] = field(default_factory=dict)
    """branch or tag -> commit"""

    def commit(self, files: dict[str, bytes], branch: str = "main") -> str:
        sha = hashlib.sha1(json.dumps(sorted(files)).encode() + b"".join(files.values()))
        commit = sha.hexdigest()
        self.commits[commit] = dict(files)
        self.refs[branch] = commit
        return commit


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.downloads: list[str] = []
        self.corrupt: set[str] = set()
        """Paths served with wrong bytes (the published checksum stays right)."""
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                hub.handle(self, body=True)

            def do_HEAD(self) -> None:
                hub.handle(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _resolve(self, repo_id: str, rev: str) -> tuple[str, dict[str, bytes]] | str:
        repo = self.repos.get(repo_id)
        if repo is None:
            return "RepoNotFound"
        commit = repo.refs.get(rev, rev)
        files = repo.commits.get(commit)
        return (commit, files) if files is not None else "RevisionNotFound"

    def handle(self, request: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = request.path
        for pattern, kind in ((_INFO, "info"), (_TREE, "tree"), (_RESOLVE, "resolve")):  # noqa: B007
            match = pattern.match(path)
            if match:
                break
        else:
            return self._send(request, 404, b"{}", {}, body)
        found = self._resolve(match["repo"], match["rev"])
        if isinstance(found, str):
            message = json.dumps({"error": f"{found} for {match['repo']}"}).encode()
            return self._send(request, 404, message, {"X-Error-Code": found}, body)
        commit, files = found
        if kind == "info":
            siblings = [self._entry(name, data, info=True) for name, data in sorted(files.items())]
            doc = {
                "id": match["repo"],
                "modelId": match["repo"],
                "sha": commit,
                "siblings": siblings,
            }
            return self._send(request, 200, json.dumps(doc).encode(), {}, body)
        if kind == "tree":
            tree = [self._entry(name, data, info=False) for name, data in sorted(files.items())]
            return self._send(request, 200, json.dumps(tree).encode(), {}, body)
        name = match["path"]
        if name not in files:
            return self._send(request, 404, b"{}", {"X-Error-Code": "EntryNotFound"}, body)
        data = files[name]
        etag = hashlib.sha256(data).hexdigest() if len(data) > LFS_THRESHOLD else git_blob_id(data)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"'}
        if len(data) > LFS_THRESHOLD:
            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))})
        if body:
            self.downloads.append(name)
            if name in self.corrupt:
                data = bytes(reversed(data))
        return self._send(request, 200, data, headers, body)

    @staticmethod
    def _entry(name: str, data: bytes, *, info: bool) -> dict[str, Any]:
        lfs = None
        if len(data) > LFS_THRESHOLD:
            sha = hashlib.sha256(data).hexdigest()
            lfs = {"sha256": sha, "oid": sha, "size": len(data), "pointerSize": 134}
        if info:
            out: dict[str, Any] = {
                "rfilename": name,
                "size": len(data),
                "blobId": git_blob_id(data),
            }
        else:
            out = {"type": "file", "path": name, "size": len(data), "oid": git_blob_id(data)}
        if lfs is not None:
            out["lfs"] = lfs
        return out

    @staticmethod
    def _send(
        request: BaseHTTPRequestHandler,
        status: int,
        data: bytes,
        headers: dict[str, str],
        body: bool,
    ) -> None:
        request.send_response(status)
        request.send_header("Content-Length", str(len(data)))
        request.send_header(
            "Content-Type", "application/json" if status != 200 else "application/octet-stream"
        )
        for key, value in headers.items():
            request.send_header(key, value)
        request.end_headers()
        if body:
            request.wfile.write(data)
