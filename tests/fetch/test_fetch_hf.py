"""`kvq fetch` of hf:// models with huggingface_hub's real client against a Hub stand-in:
the revision is resolved to a commit and pinned, only the weights vLLM loads are fetched,
every file is verified, a second run downloads nothing, a Hub outage leaves a verified
copy usable, and the Hub's refusals end as ModelUnavailable."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvq.fetch.command import fetch_model, run_fetch
from kvq.fetch.failures import classify_fetch_failure
from tests.fetch.fake_hub import FakeHub, Repo

REPO = "acme/tiny-llama"
FILES = {
    "config.json": b'{"model_type": "llama"}',
    "tokenizer.json": b'{"version": "1.0"}' * 10,
    "model.safetensors": os.urandom(64 * 1024),
    "pytorch_model.bin": os.urandom(4096),
    "original/consolidated.00.pth": os.urandom(4096),
}
WANTED = ["config.json", "model.safetensors", "tokenizer.json"]


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeHub]:
    with FakeHub() as fake:
        fake.repos[REPO] = Repo()
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield fake


def test_fetch_pins_the_commit_verifies_and_skips_the_second_time(
    hub: FakeHub, tmp_path: Path
) -> None:
    commit = hub.repos[REPO].commit(FILES)
    cache, link = tmp_path / "cache", tmp_path / "pod" / "model"

    first = fetch_model(f"hf://{REPO}", "main", str(cache), str(link))
    assert first.version == commit
    assert sorted(first.downloaded) == WANTED == sorted(first.verified)
    assert sorted(hub.downloads) == WANTED  # no .bin, no original/
    assert link.resolve() == (cache / "hub" / "models--acme--tiny-llama" / "snapshots" / commit)
    for name in WANTED:
        assert (link / name).read_bytes() == FILES[name]
    # huggingface_hub's own offline mode finds the branch too.
    assert (cache / "hub" / "models--acme--tiny-llama" / "refs" / "main").read_text() == commit

    hub.downloads.clear()
    second = fetch_model(f"hf://{REPO}", "main", str(cache), str(link))
    assert second.downloaded == [] and second.verified == []
    assert sorted(second.skipped) == WANTED
    assert hub.downloads == []


def test_a_moved_branch_gets_its_new_commit_and_keeps_shared_blobs(
    hub: FakeHub, tmp_path: Path
) -> None:
    hub.repos[REPO].commit(FILES)
    cache = tmp_path / "cache"
    fetch_model(f"hf://{REPO}", "main", str(cache), None)
    hub.downloads.clear()
    newer = hub.repos[REPO].commit({**FILES, "config.json": b'{"model_type": "llama", "v": 2}'})
    report = fetch_model(f"hf://{REPO}", "main", str(cache), None)
    assert report.version == newer
    assert hub.downloads == ["config.json"]  # the weights' blob is shared by both commits
    assert sorted(report.verified) == WANTED


def test_a_verified_copy_serves_a_restart_while_the_hub_is_down(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = hub.repos[REPO].commit(FILES)
    cache, link = tmp_path / "cache", tmp_path / "model"
    fetch_model(f"hf://{REPO}", "main", str(cache), str(link))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    report = fetch_model(f"hf://{REPO}", "main", str(cache), str(link))
    assert report.version == commit
    assert report.downloaded == []
    assert "using the verified copy" in report.notes[0]


def test_a_corrupted_download_is_deleted_and_reported(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.repos[REPO].commit(FILES)
    hub.corrupt.add("model.safetensors")
    log = tmp_path / "termination-log"
    monkeypatch.setenv("KVQ_TERMINATION_LOG", str(log))
    assert run_fetch(f"hf://{REPO}", "main", str(tmp_path / "cache"), None) == 1
    assert "verification failed: model.safetensors has sha256" in log.read_text()
    snapshot = next(
        (tmp_path / "cache" / "hub" / "models--acme--tiny-llama" / "snapshots").iterdir()
    )
    assert not (snapshot / "model.safetensors").exists()
    hub.corrupt.clear()  # the kubelet's restart of the init container then succeeds
    report = fetch_model(f"hf://{REPO}", "main", str(tmp_path / "cache"), None)
    assert "model.safetensors" in report.verified


@pytest.mark.parametrize(
    ("uri", "revision", "kind"),
    [
        ("hf://acme/no-such-model", None, "has no such repository"),
        (f"hf://{REPO}", "v9", "spec.model.revision does not exist"),
    ],
)
def test_the_hubs_refusals_are_model_unavailable(
    hub: FakeHub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    uri: str,
    revision: str | None,
    kind: str,
) -> None:
    hub.repos[REPO].commit(FILES)
    log = tmp_path / "termination-log"
    monkeypatch.setenv("KVQ_TERMINATION_LOG", str(log))
    assert run_fetch(uri, revision, str(tmp_path / "cache"), None) == 1
    reason, message = classify_fetch_failure(log.read_text())
    assert reason == "ModelUnavailable"
    assert kind in message
