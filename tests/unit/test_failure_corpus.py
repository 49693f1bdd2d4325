"""The classifier on real failure texts: family and decision, one row per text.

tests/fixtures/failures/corpus.yaml holds 80+ texts that vLLM, huggingface_hub,
transformers, PyTorch, NCCL and CUDA really printed (each with its source). Most run under
an fp8 KV cache on purpose: a classifier that blames the dtype for any crash fails them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kvq.fallback.classifier import classify_failure
from kvq.fallback.evidence import FailureEvidence

FIXTURES = Path(__file__).parents[1] / "fixtures"
CORPUS: list[dict[str, Any]] = yaml.safe_load((FIXTURES / "failures/corpus.yaml").read_text())


def _text(entry: dict[str, Any]) -> str:
    if "fixture" in entry:
        return (FIXTURES / "vllm" / entry["fixture"]).read_text(errors="replace")
    return str(entry["text"])


@pytest.mark.parametrize("entry", CORPUS, ids=[e["id"] for e in CORPUS])
def test_each_real_failure_gets_its_family_and_decision(entry: dict[str, Any]) -> None:
    evidence = FailureEvidence(
        pod="engine-0", termination_message=_text(entry), exit_code=1, restart_count=1
    )
    verdict = classify_failure(evidence, kv_cache_dtype=entry["kv_cache_dtype"])
    assert (str(verdict.kind), str(verdict.action)) == (entry["family"], entry["decision"]), (
        verdict.reason
    )


def test_the_corpus_covers_every_family_with_at_least_25_texts() -> None:
    families = {e["family"] for e in CORPUS}
    assert len(CORPUS) >= 25
    assert {"DtypeRejected", "DtypeSuspect", "HubUnavailable", "HubAuth", "DiskFull"} <= families


def test_most_non_dtype_failures_under_fp8_never_fall_back() -> None:
    """The issue's headline: transient and unrelated failures must not cost the fp8 cache."""
    wrong = []
    for entry in CORPUS:
        if entry["decision"] in ("wait", "fix") and entry["kv_cache_dtype"] != "auto":
            evidence = FailureEvidence(pod="e", termination_message=_text(entry), exit_code=1)
            verdict = classify_failure(evidence, kv_cache_dtype=entry["kv_cache_dtype"])
            if verdict.fallback or str(verdict.action) == "fallback-after-repeats":
                wrong.append(entry["id"])
    assert wrong == []
