"""decide(): one InferenceService's snapshot in, the plan to carry out.

Order of thought: engine and model facts -> pools per rung -> where the ladder stands
(static moves) -> what the current pods say (runtime moves) -> objects, status, events.
Every move is recorded in status, so the same snapshot decided twice gives the same
plan, and a plan already carried out gives one with nothing new to write.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvq.api import keys
from kvq.api.models import API_VERSION, KIND, InferenceService
from kvq.api.status import FallbackAttempt, InferenceServiceStatus
from kvq.catalog.engines import EngineVersionError
from kvq.decide.history import rfc3339, to_ladder, to_status
from kvq.decide.rungs import RungOutlook, ladder_options, rung_outlooks
from kvq.decide.runtime import current_pods, examine_pods
from kvq.decide.status import Outcome, build_status, decision_events
from kvq.decide.types import EventSpec, Manifest, ObjectRef, Plan, Snapshot
from kvq.fallback.classifier import Classification
from kvq.fallback.ladder import Attempt, LadderDecision, Rung, next_rung, record_attempt, start_rung
from kvq.placement.discovery import discover_pools
from kvq.planner.architecture import UnknownModelError, resolve_architecture
from kvq.render import RenderError, effective_settings, engine_args, render_manifests


@dataclass
class _Ladder:
    """The ladder's state while deciding: stored attempts plus the ones made now."""

    attempts: list[Attempt]
    stored: list[FallbackAttempt]
    new: list[FallbackAttempt]

    def record(self, decision: LadderDecision, current: Rung, excerpt: str, snap: Snapshot) -> None:
        generation = snap.isvc.metadata.generation or 1
        attempt = record_attempt(
            decision, current=current, excerpt=excerpt, at=snap.now, generation=generation
        )
        self.attempts.append(attempt)
        self.new.append(to_status(attempt, static=not excerpt))


def decide(snap: Snapshot) -> Plan:
    isvc = snap.isvc
    spec = isvc.spec
    generation = isvc.metadata.generation or 1
    previous = isvc.status or InferenceServiceStatus()
    try:
        capability = snap.catalogs.engines.capability(_engine_version(isvc))
        arch = resolve_architecture(spec.model, snap.catalogs.models)
    except (RenderError, EngineVersionError, UnknownModelError) as error:
        reason = "ModelUnknown" if isinstance(error, UnknownModelError) else "EngineUnsupported"
        return _plan(snap, previous, Outcome(blocked=(reason, str(error))), [])

    inventory = discover_pools(snap.nodes, snap.catalogs.gpus, snap.config.pool_labels)
    outlooks = rung_outlooks(isvc, inventory, capability, arch)
    options = ladder_options(outlooks)
    stored = list(previous.fallback.attempts) if previous.fallback else []
    ladder = _Ladder(to_ladder(stored), stored, [])
    start = start_rung(
        requested_dtype=spec.kv_cache.dtype,
        requested=options[Rung.REQUESTED.value],
        rungs=spec.fallback.rungs,
        enabled=spec.fallback.enabled,
        attempts=ladder.attempts,
        generation=generation,
        options=options,
    )
    if start.next not in (None, Rung.REQUESTED) and _at_requested(ladder, generation):
        ladder.record(start, Rung.REQUESTED, "", snap)  # static: decided before deploying
    if start.next is None:
        outcome = Outcome(
            not_placed=outlooks[Rung.REQUESTED].choice.why_none(),
            exhausted=start.exhausted,
            ladder_reason=start.reason,
        )
        return _plan(snap, previous, outcome, ladder.new)

    rung: Rung | None = start.next
    failure: Classification | None = None
    wanted_logs: tuple[str, ...] = ()
    while rung is not None:
        outlook = outlooks[rung]
        chosen = outlook.choice.chosen
        if chosen is None:
            outcome = Outcome(rung=rung, not_placed=outlook.choice.why_none())
            return _plan(snap, previous, outcome, ladder.new)
        try:
            effective = effective_settings(isvc, chosen.pool.gpu, rung.value)
            manifests = render_manifests(isvc, chosen.pool, effective)
            rendered = engine_args(isvc, chosen.pool, effective)
        except RenderError as error:
            outcome = Outcome(rung=rung, blocked=("RenderFailed", str(error)))
            return _plan(snap, previous, outcome, ladder.new)
        pod_hash = _pod_hash(manifests)
        deployed = Outcome(
            rung=rung,
            outlook=outlook,
            effective=effective,
            args=rendered.args,
            dropped=rendered.dropped,
            pod_hash=pod_hash,
        )
        findings = examine_pods(
            current_pods(snap.pods, pod_hash),
            kv_cache_dtype=effective.kv_cache_dtype,
            log_tails=snap.log_tails,
        )
        wanted_logs = findings.need_log_tails
        failure = findings.failure
        if failure is None or not failure.fallback or not spec.fallback.enabled:
            break
        move = next_rung(
            requested_dtype=spec.kv_cache.dtype,
            current=rung,
            rungs=spec.fallback.rungs,
            enabled=spec.fallback.enabled,
            attempts=ladder.attempts,
            generation=generation,
            options=options,
            because=failure.reason,
        )
        ladder.record(move, rung, failure.excerpt or failure.reason, snap)
        if move.next is None:
            # Nothing left to try: keep what is deployed, say so.
            outcome = replace(deployed, failure=failure, exhausted=True, ladder_reason=move.reason)
            return _plan(snap, previous, outcome, ladder.new)
        rung, failure = move.next, None

    outcome = replace(
        deployed, failure=failure, fallback_disabled=failure is not None and failure.fallback
    )
    owned = tuple(_owned(isvc, m) for m in manifests)
    plan = _plan(snap, previous, outcome, ladder.new, owned)
    return replace(plan, fetch_log_tails=wanted_logs)


def _plan(
    snap: Snapshot,
    previous: InferenceServiceStatus,
    outcome: Outcome,
    new_attempts: list[FallbackAttempt],
    objects: tuple[Manifest, ...] = (),
) -> Plan:
    status = build_status(snap, previous, outcome, new_attempts)
    events: tuple[EventSpec, ...] = decision_events(previous, status, new_attempts)
    wanted = {(o["kind"], o["metadata"]["name"]) for o in objects}
    # Only prune when kvq renders a full set: a blocked decision keeps what is running.
    delete = (
        tuple(
            ObjectRef(o["apiVersion"], o["kind"], o["metadata"]["namespace"], o["metadata"]["name"])
            for o in snap.owned
            if (o["kind"], o["metadata"]["name"]) not in wanted
        )
        if objects
        else ()
    )
    return Plan(
        apply=objects,
        delete=delete,
        status=status.to_kube(),
        events=events,
    )


def _engine_version(isvc: InferenceService) -> str:
    from kvq.render.settings import engine_image_and_version

    return engine_image_and_version(isvc)[1]


def _at_requested(ladder: _Ladder, generation: int) -> bool:
    return not any(a.generation == generation for a in ladder.attempts)


def _pod_hash(manifests: list[Manifest]) -> str:
    deployment = next(m for m in manifests if m["kind"] == "Deployment")
    return str(deployment["spec"]["template"]["metadata"]["annotations"][keys.ANNOTATION_SPEC_HASH])


def _owned(isvc: InferenceService, manifest: Manifest) -> Manifest:
    """The manifest with namespace and a controller ownerReference (GC deletes children)."""
    metadata = dict(manifest["metadata"])
    metadata["namespace"] = isvc.metadata.namespace
    metadata["ownerReferences"] = [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": isvc.metadata.name,
            "uid": isvc.metadata.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    return {**manifest, "metadata": metadata}


__all__ = ["RungOutlook", "decide", "rfc3339"]
