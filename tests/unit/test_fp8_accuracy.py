"""Known FP8 accuracy problems: the catalog's facts, the matcher, `kvq plan` and status."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from kvq.catalog.fp8_accuracy import (
    AccuracyCatalogError,
    AccuracyQuery,
    load_accuracy_facts,
    match_accuracy_facts,
    parse_accuracy_facts,
)
from kvq.cli import app
from kvq.decide import decide
from tests.unit.test_decide import conditions, snapshot, with_status
from tests.unit.test_decide import isvc as isvc_body

FACTS = load_accuracy_facts()
HOPPER = (9, 0)
ADA = (8, 9)


def ids(**query: Any) -> list[str]:
    base: dict[str, Any] = {"engine_version": "0.26.0", "dtype": "fp8"}
    return [f.id for f in match_accuracy_facts(FACTS, AccuracyQuery(**{**base, **query}))]


def test_every_fact_cites_a_source_and_says_what_to_do() -> None:
    assert len(FACTS) >= 5
    for fact in FACTS:
        assert fact.sources and all(s.startswith("https://") for s in fact.sources), fact.id
        assert fact.symptom and fact.workaround and fact.reported, fact.id


def test_a_fact_without_a_source_is_refused() -> None:
    entry = {"id": "x", "title": "t", "severity": "high", "dtypes": ["fp8"], "symptom": "s"}
    with pytest.raises(AccuracyCatalogError, match="sources"):
        parse_accuracy_facts({"facts": [{**entry, "workaround": "w"}]})


def test_the_hopper_long_context_fact_holds_inside_its_range_only() -> None:
    long = {"compute_capability": HOPPER, "attention": "gqa", "max_model_len": 131072}
    fact = "fa3-fp8-long-context-accumulation"
    assert fact in ids(engine_version="0.10.2", **long)
    assert fact in ids(engine_version="0.8.5.post1", **long)
    assert fact in ids(engine_version="0.11.0", dtype="fp8_e4m3", **long)
    # After the fix (0.12 on), on Ada, at a short context, for MLA or fp8_e5m2: not this fact.
    assert fact not in ids(engine_version="0.12.0", **long)
    assert fact not in ids(engine_version="0.10.2", **{**long, "compute_capability": ADA})
    assert fact not in ids(engine_version="0.10.2", **{**long, "max_model_len": 32768})
    assert fact not in ids(engine_version="0.10.2", **{**long, "attention": "mla"})
    assert fact not in ids(engine_version="0.10.2", dtype="fp8_e5m2", **long)


def test_a_model_fact_holds_on_any_gpu_and_only_for_its_family() -> None:
    qwen2 = {"architecture": "Qwen2ForCausalLM", "attention": "gqa"}
    assert ids(compute_capability=HOPPER, **qwen2) == ["qwen2-fp8-unit-scales"]
    assert ids(compute_capability=ADA, **qwen2) == ["qwen2-fp8-unit-scales"]
    assert ids(compute_capability=None, **qwen2) == ["qwen2-fp8-unit-scales"]
    assert ids(architecture="LlamaForCausalLM", compute_capability=HOPPER) == []
    assert ids(dtype="auto", **qwen2) == []
    assert ids(dtype="int8_per_token_head", **qwen2) == []


def test_a_reported_version_matches_from_that_version_on() -> None:
    glm = {"model_names": ("hf://zai-org/GLM-4.7-Flash",), "attention": "mla"}
    fact = "glm-4.7-flash-fp8-multi-turn"
    assert fact in ids(engine_version="0.18.1", compute_capability=HOPPER, **glm)
    assert fact in ids(engine_version="0.26.0", compute_capability=HOPPER, **glm)
    assert fact not in ids(engine_version="0.17.0", compute_capability=HOPPER, **glm)
    # A GPU-bound fact needs the GPU: an unknown one does not match.
    assert fact not in ids(engine_version="0.18.1", compute_capability=None, **glm)


def test_a_name_matches_the_model_uri_case_insensitively() -> None:
    names = ("hf://Qwen/Qwen2.5-VL-7B-Instruct",)
    assert ids(engine_version="0.19.0", dtype="fp8_e5m2", model_names=names) == [
        "qwen2-vl-fp8-e5m2"
    ]
    assert ids(engine_version="0.19.0", dtype="fp8", model_names=names) == []


def test_plan_prints_the_warning_with_its_source_and_how_to_check() -> None:
    args = ["plan", "--model", "qwen2.5-7b", "--gpu", "H100", "--kv-cache-dtype", "fp8"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "fp8 accuracy warning on vLLM 0.26.0 (high)" in result.stdout
    assert "[qwen2-fp8-unit-scales]" in result.stdout
    assert "https://github.com/vllm-project/vllm/pull/11906" in result.stdout
    assert "kvq probe" in result.stdout


def test_plan_json_lists_the_risks_per_dtype_for_the_engine_asked() -> None:
    args = ["plan", "--model", "llama-3.1-8b", "--gpu", "H200", "--max-model-len", "131072"]
    result = CliRunner().invoke(app, [*args, "--engine-version", "0.10.2", "-o", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["accuracyEngineVersion"] == "0.10.2"
    risks = {
        d: [r["id"] for r in row.get("accuracyRisks", [])] for d, row in plan["dtypes"].items()
    }
    assert risks["fp8"] == risks["fp8_e4m3"] == ["fa3-fp8-long-context-accumulation"]
    assert risks["auto"] == risks["int8"] == []
    (risk,) = plan["dtypes"]["fp8"]["accuracyRisks"]
    assert "https://github.com/vllm-project/vllm/issues/23813" in risk["sources"]
    fixed = CliRunner().invoke(app, [*args, "--engine-version", "0.26.0", "-o", "json"])
    assert "accuracyRisks" not in json.loads(fixed.stdout)["dtypes"]["fp8"]


def qwen2(dtype: str = "fp8") -> dict[str, Any]:
    return isvc_body(model={"uri": "hf://Qwen/Qwen2.5-7B-Instruct"}, kvCache={"dtype": dtype})


def test_status_warns_with_the_source_and_one_event_and_still_serves() -> None:
    plan = decide(snapshot(qwen2()))
    assert conditions(plan)["KnownAccuracyRisk"] == ("True", "ReportedRegression")
    assert conditions(plan)["Placed"][0] == "True"  # a warning: the service is placed as asked
    assert any(o["kind"] == "Deployment" for o in plan.apply)
    (risk,) = plan.status["knownAccuracyRisks"]
    assert risk["id"] == "qwen2-fp8-unit-scales" and risk["severity"] == "high"
    assert "https://github.com/vllm-project/vllm/pull/11906" in risk["sources"]
    warned = [e for e in plan.events if e.reason == "KnownAccuracyRisk"]
    assert len(warned) == 1 and warned[0].type == "Warning"
    assert "pull/11906" in warned[0].message and "spec.quality" in warned[0].message
    again = decide(snapshot(with_status(qwen2(), plan)))
    assert [e for e in again.events if e.reason == "KnownAccuracyRisk"] == []
    assert conditions(again)["KnownAccuracyRisk"] == ("True", "ReportedRegression")


def test_the_warning_goes_when_nothing_matches_any_more() -> None:
    plan = decide(snapshot(qwen2()))
    body = with_status(qwen2("auto"), plan)
    body["metadata"]["generation"] = 2
    after = decide(snapshot(body))
    assert "KnownAccuracyRisk" not in conditions(after)
    assert "knownAccuracyRisks" not in after.status
    untouched = decide(snapshot(isvc_body()))  # Llama-3 8B, fp8, 8k context: nothing known
    assert "KnownAccuracyRisk" not in conditions(untouched)


def test_a_decision_that_renders_nothing_keeps_the_warning() -> None:
    plan = decide(snapshot(qwen2()))
    body = with_status(qwen2(), plan)
    body["spec"]["engine"] = {"version": "0.1"}  # outside the catalog: kvq cannot render
    blocked = decide(snapshot(body))
    assert conditions(blocked)["Ready"] == ("False", "NotDeployable")
    assert conditions(blocked)["KnownAccuracyRisk"] == ("True", "ReportedRegression")
    assert blocked.status["knownAccuracyRisks"][0]["id"] == "qwen2-fp8-unit-scales"
