"""Known FP8 accuracy problems of what runs: status.knownAccuracyRisks and the
KnownAccuracyRisk condition. A warning only: kvq serves as asked, and the quality gate
(spec.quality) is what checks the model itself."""

from __future__ import annotations

from collections.abc import Sequence

from kvq.api.credentials import redact_text
from kvq.api.resource import InferenceService
from kvq.api.status import AccuracyRisk
from kvq.catalog.fp8_accuracy import AccuracyFact, AccuracyQuery, match_accuracy_facts
from kvq.catalog.models import ModelArchitecture, ModelCatalog
from kvq.decide.conditions import ConditionUpdate
from kvq.decide.manifests import Rendered
from kvq.placement.choice import PoolVerdict

CONDITION = "KnownAccuracyRisk"


def accuracy_risks(
    facts: Sequence[AccuracyFact],
    isvc: InferenceService,
    rendered: Rendered,
    chosen: PoolVerdict,
    arch: ModelArchitecture,
    models: ModelCatalog,
) -> tuple[AccuracyFact, ...]:
    """The facts that match the rendered engine, the chosen pool's GPU and the model."""
    uri = isvc.spec.model.uri
    found = models.lookup(uri)
    names = (uri, rendered.effective.model_uri, *((found.name,) if found else ()))
    query = AccuracyQuery(
        engine_version=rendered.effective.engine_version,
        dtype=_engine_dtype(rendered),
        compute_capability=chosen.pool.gpu.compute_capability,
        architecture=arch.hf_architecture,
        attention=arch.attention,
        model_names=names,
        max_model_len=chosen.plan.max_model_len if chosen.plan else None,
    )
    return match_accuracy_facts(facts, query)


def risk_status(risks: Sequence[AccuracyFact]) -> list[AccuracyRisk] | None:
    if not risks:
        return None
    return [
        AccuracyRisk(
            id=f.id,
            severity=f.severity,
            summary=f"{f.title}: {f.symptom} Workaround: {f.workaround}",
            sources=list(f.sources),
        )
        for f in risks
    ]


def risk_condition(risks: Sequence[AccuracyFact], engine_version: str) -> ConditionUpdate:
    """True while a reported problem matches (None of this blocks the service)."""
    listed = "; ".join(f"{f.title} [{f.id}] ({' '.join(f.sources)})" for f in risks)
    message = (
        f"Reported FP8 KV-cache accuracy problems match vLLM {engine_version} on this GPU and "
        f"model: {listed}. kvq serves as asked; check the model with spec.quality (kvq probe)."
    )
    severe = any(f.severity == "high" for f in risks)
    reason = "ReportedRegression" if severe else "ReportedDegradation"
    return ConditionUpdate(CONDITION, "True", reason, redact_text(message))


def _engine_dtype(rendered: Rendered) -> str:
    """The --kv-cache-dtype value rendered (vLLM's name)."""
    if "--kv-cache-dtype" in rendered.args:
        return rendered.args[rendered.args.index("--kv-cache-dtype") + 1]
    return rendered.effective.kv_cache_dtype
