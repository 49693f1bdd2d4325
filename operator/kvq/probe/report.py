"""The probe's report: what was measured, on which engine and KV cache, and the verdict.

Two shapes of one schema (`schemaVersion` 1):

- `ProbeReport`, the whole document (`kvq probe -o json`): engine, baseline, every
  suite's detail, flat `scores`, `checks` and the `verdict`;
- its summary (`summarize()`), the same document without the suites' detail, small
  enough for a Kubernetes termination message (at most 4 KiB), which is what a probe
  Job hands back to the operator (`kvq probe --termination-log /dev/termination-log`).

Scores are flat, dotted names (`needle.accuracy`, `json.validRate`, ...) so a threshold
names one number. The schema only grows: new fields are optional, and a change that is
not is a new `schemaVersion`.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

API_VERSION = "kvq.dev/v1alpha1"
KIND = "ProbeReport"
SCHEMA_VERSION = 1
TERMINATION_MESSAGE_LIMIT = 4096


class ReportModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class Verdict(StrEnum):
    PASS = "Pass"  # every check holds (or none was asked for)
    FAIL = "Fail"  # a check does not hold: the engine answered, and badly
    UNKNOWN = "Unknown"  # no answer to judge: unreachable engine, budget spent, errors


class CacheConfig(ReportModel):
    """vLLM's `cache_config_info` labels: what the engine's KV cache really is."""

    cache_dtype: str | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    kv_cache_size_tokens: int | None = None
    labels: dict[str, str] = {}


class EngineInfo(ReportModel):
    url: str
    model: str | None = None
    max_model_len: int | None = None
    cache_config: CacheConfig | None = None


class NeedleCell(ReportModel):
    depth: float
    target_tokens: int
    prompt_tokens: float
    trials: int
    retrieved: int
    accuracy: float
    errors: int = 0


class NeedleResult(ReportModel):
    depths: list[float]
    lengths: list[int]
    cells: list[NeedleCell]
    accuracy: float
    min_cell_accuracy: float


class JsonResult(ReportModel):
    cases: int
    parse_rate: float
    valid_rate: float
    exact_rate: float
    errors: list[str] = []


class RepetitionResult(ReportModel):
    cases: int
    ngram: int
    repeated_ngram_rate: float
    longest_repeated_span: int
    mean_longest_repeated_span: float


class AgreementResult(ReportModel):
    prompts: int
    token_agreement: float
    exact_match_rate: float
    mean_abs_logprob_diff: float | None
    compared_tokens: int


class Suites(ReportModel):
    needle: NeedleResult | None = None
    json_: JsonResult | None = None
    repetition: RepetitionResult | None = None
    agreement: AgreementResult | None = None

    model_config = ConfigDict(
        alias_generator=lambda name: "json" if name == "json_" else to_camel(name),
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


class Check(ReportModel):
    """One threshold: `score op threshold`, where threshold may be `baseline+-delta`."""

    requirement: str
    score: str
    passed: bool | None
    value: float | None = None
    threshold: float | None = None


class ProbeReport(ReportModel):
    api_version: str = API_VERSION
    kind: str = KIND
    schema_version: int = SCHEMA_VERSION
    verdict: Verdict
    reason: str
    engine: EngineInfo
    baseline: EngineInfo | None = None
    suites_run: list[str]
    complete: bool
    duration_s: float
    seed: int
    scores: dict[str, float]
    baseline_scores: dict[str, float] = {}
    checks: list[Check] = []
    suites: Suites = Suites()
    errors: list[str] = []


def to_json(report: ProbeReport) -> str:
    return report.model_dump_json(by_alias=True, indent=2, exclude_none=False)


def summarize(report: ProbeReport) -> dict[str, Any]:
    """The report without the suites' detail, shrunk to fit a termination message."""
    document = report.model_dump(mode="json", by_alias=True, exclude={"suites"})
    document["errors"] = document["errors"][:3]
    for engine in ("engine", "baseline"):
        if document.get(engine) and document[engine].get("cacheConfig"):
            document[engine]["cacheConfig"].pop("labels", None)
    if len(json.dumps(document, separators=(",", ":")).encode()) > TERMINATION_MESSAGE_LIMIT:
        document["errors"] = []
        document["reason"] = document["reason"][:300]
    return document


def summary_json(report: ProbeReport) -> str:
    """One line of JSON, at most 4 KiB: what a Job's termination message carries."""
    text = json.dumps(summarize(report), separators=(",", ":"))
    return text[:TERMINATION_MESSAGE_LIMIT]
