"""The `kvq fetch` run: download, verify, link, and on failure a termination message."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from pathlib import Path

from kvq.api.credentials import redact_text
from kvq.fetch.layout import parse_model_uri
from kvq.fetch.report import FetchReport
from kvq.fetch.verify import point_link

TERMINATION_LOG = "/dev/termination-log"
_MAX_MESSAGE_BYTES = 4096


def fetch_model(uri: str, revision: str | None, cache: str, link: str | None) -> FetchReport:
    """Download `uri` into `cache` (hf:// at `revision`), verify it, point `link` at it."""
    ref = parse_model_uri(uri)
    if ref.scheme == "hf":
        from kvq.fetch.hf import fetch_hf

        report = fetch_hf(ref, revision, cache, endpoint=os.environ.get("HF_ENDPOINT"))
    else:
        if revision:
            raise ValueError("--revision applies to hf:// models only")
        from kvq.fetch.s3 import fetch_s3

        report = fetch_s3(ref, cache)
    if link:
        point_link(link, report.path)
    return report


def run_fetch(uri: str, revision: str | None, cache: str, link: str | None) -> int:
    """The command: 0 when the model is in place; 1 with the cause in the termination log."""
    # In the pod these point into an emptyDir that starts empty (the root is read-only).
    for name in ("HOME", "HF_HOME", "TMPDIR"):
        if os.environ.get(name):
            Path(os.environ[name]).mkdir(parents=True, exist_ok=True)
    try:
        report = fetch_model(uri, revision, cache, link)
    except Exception as error:  # the whole failure goes to the operator, whatever it is
        message = redact_text(
            f"kvq fetch {uri} failed\n" + "".join(traceback.format_exception_only(error)).strip()
        )
        sys.stderr.write(redact_text("".join(traceback.format_exception(error))))
        _write_termination_message(message)
        return 1
    print(report.summary(), flush=True)
    return 0


def _write_termination_message(message: str) -> None:
    path = Path(os.environ.get("KVQ_TERMINATION_LOG", TERMINATION_LOG))
    data = message.encode("utf-8")[:_MAX_MESSAGE_BYTES]
    with contextlib.suppress(OSError):  # outside a pod: stderr has it
        path.write_bytes(data)
