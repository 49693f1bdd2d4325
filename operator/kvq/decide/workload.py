"""One workload of an InferenceService (its default tier, or an extra tier) decided.

Three pure steps: place every rung on the pools (decide.place), move the ladder on the
evidence of the current rung's engines (fallback.ladder.climb), render the rung in force
once (decide.manifests); then status and events. Every move is recorded in status, so
the same snapshot decided twice gives the same plan, and a plan already carried out gives
one with nothing new to write.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from kvq.api import keys
from kvq.api.resource import InferenceService
from kvq.api.status import FallbackAttempt, InferenceServiceStatus
from kvq.api.tiers import TierSpec
from kvq.catalog.engines import EngineCapability, EngineVersionError
from kvq.catalog.models import ModelArchitecture
from kvq.decide.accuracy import accuracy_risks
from kvq.decide.autoscale import autoscale
from kvq.decide.conditions import condition
from kvq.decide.decision import Decision, build_status, rolled_out, waits_for
from kvq.decide.events import decision_events
from kvq.decide.manifests import Rendered, owned_by, render_rung
from kvq.decide.place import RungPlacement, laid_out, place_rungs, rung_layout
from kvq.decide.pod_findings import EngineFindings, current_pods, examine_pods, tally_failures
from kvq.decide.quality import QualityGate, probe_job, read_probe
from kvq.decide.types import NextCheck, ObjectRef, Plan, Snapshot
from kvq.fallback.classifier import Action, Classification, FailureKind, dtype_cleared
from kvq.fallback.key import ladder_key
from kvq.fallback.ladder import (
    NONE,
    LadderInput,
    Rung,
    RuntimeVerdict,
    UnexplainedCrash,
    cleared_crash,
    climb,
)
from kvq.placement.discovery import Inventory, discover_pools
from kvq.placement.pool import nodes_per_replica
from kvq.planner.architecture import UnknownModelError, resolve_architecture
from kvq.planner.layout import Layout, describe
from kvq.render import RenderError
from kvq.render.leaderworkerset import API_VERSION as LWS_API_VERSION
from kvq.render.manifests import replica_nodes
from kvq.render.settings import engine_image_and_version, host_tier_of

# Why the service waits (Placed=False): the condition's reason the grace period counts from.
WAITING = "WaitingForCapacity"


def decide_workload(snap: Snapshot, tier: TierSpec | None = None) -> Plan:
    """The plan of one workload. For an extra tier, `snap.isvc` carries the tier's spec
    (its kvCache, replicas, autoscaling) and status, and `tier` names it."""
    isvc = snap.isvc
    previous = isvc.status or InferenceServiceStatus()
    try:
        capability, arch = _engine_and_model(snap)
    except (RenderError, EngineVersionError, UnknownModelError) as error:
        reason = "ModelUnknown" if isinstance(error, UnknownModelError) else "EngineUnsupported"
        return _plan(snap, previous, Decision(blocked=(reason, str(error)), tier=tier))
    if (refused := _cpu_tier_refusal(isvc, capability)) is not None:
        # Every rung and pool runs this engine: no fallback can keep the CPU tier.
        return _plan(snap, previous, Decision(blocked=("CpuTierUnsupported", refused), tier=tier))

    key = ladder_key(isvc.spec)
    stored = previous.fallback
    same_key = stored is not None and stored.key == key
    current = _current_rung(previous) if same_key else None
    waiting_since = _waiting_since(previous)
    expired = waiting_since is not None and snap.now - waiting_since >= snap.config.ladder.grace
    current_pool = previous.placement.pool if previous.placement else None

    # Step 1: the pools, for every rung. The current pods' scheduling troubles are part of
    # whether the current pool can run the service now.
    first = _findings(snap, key, current, current_pool)
    placements = place_rungs(
        isvc,
        _inventory(snap),
        capability,
        arch,
        current_pool=current_pool,
        leave_current=expired,
        unschedulable=first.unschedulable,
    )

    # Step 2: the ladder, on the evidence of the current rung's engines.
    findings = first
    if current is not None and placements[current].state.pool != current_pool:
        findings = _findings(snap, key, current, placements[current].state.pool)
    retry_token, by_hand, reset_at = _retry_by_hand(snap, previous)
    history = stored.attempts if stored else []
    findings = _with_cleared(findings, history, key, current, reset_at, isvc.spec.kv_cache.dtype)
    failure = findings.failure
    tally = None
    if current is not None:
        tally = tally_failures(
            stored.tally if stored else None,
            findings,
            key=key,
            rung=current,
            pool=placements[current].state.pool,
        )
    verdict = _runtime_verdict(snap, findings, tally)
    # The quality gate judges the default tier's answers; an engine failure speaks first.
    gate = read_probe(snap, previous) if tier is None else QualityGate(None, None)
    if verdict is None and gate.verdict is not None and current is Rung.REQUESTED:
        verdict = gate.verdict
    position = climb(
        LadderInput(
            requested_dtype=isvc.spec.kv_cache.dtype,
            rungs=isvc.spec.fallback.rungs,
            enabled=isvc.spec.fallback.enabled,
            key=key,
            generation=isvc.metadata.generation or 1,
            now=snap.now,
            states={rung: p.state for rung, p in placements.items()},
            history=stored.attempts if stored else [],
            current=current,
            waiting_since=waiting_since,
            reset_at=reset_at,
            verdict=verdict,
            policy=snap.config.ladder,
            by_hand=by_hand,
            unexplained=UnexplainedCrash(failure.reason, failure.signature, failure.excerpt)
            if failure is not None and failure.kind is FailureKind.UNKNOWN
            else None,
        )
    )
    moved = bool(position.moves) or position.rung != current
    decision = Decision(
        tier=tier,
        key=key,
        rung=position.rung,
        placement=placements[position.rung] if position.rung else None,
        waiting=position.waiting,
        ladder_reason=position.reason,
        exhausted=position.rung is None,
        moves=_with_layouts(position.moves, placements),
        failure=_shown_failure(
            position.moves,
            verdict is not None,
            history,
            key,
            position.rung,
            reset_at,
            findings,
            isvc.spec.kv_cache.dtype,
        ),
        fallback_disabled=not isvc.spec.fallback.enabled,
        tally=None if moved else tally,
        retry_token=retry_token,
        reset_at=reset_at,
        rung_of_failure=current,
        quality=gate,
    )
    if position.rung is None:
        return _plan(snap, previous, decision)

    # Step 3: render the rung in force, once.
    chosen = placements[position.rung].choice.chosen
    if chosen is None:
        # The pool is gone for now (scaled to zero?): what runs stays as it is.
        return _keeping_live(_plan(snap, previous, decision), snap.config.ladder.grace)
    # The layout kvq derived for this rung and pool is the one held and rendered.
    if (held := _group_held(snap, placements[position.rung], previous, decision)) is not None:
        return held
    try:
        rendered = render_rung(
            _as_planned(isvc, placements[position.rung]),
            placements[position.rung],
            chosen,
            key=key,
            catalogs=snap.catalogs,
            deployment=snap.deployment,
            tier=tier,
            arch=arch,
            operator_image=snap.config.operator_image,
            replicas_owned_elsewhere=tier is not None
            and isvc.spec.autoscaling is not None
            and snap.keda,
        )
    except RenderError as error:
        return _plan(snap, previous, replace(decision, blocked=("RenderFailed", str(error))))
    scaled = autoscale(snap, chosen, tier, _as_planned(isvc, placements[position.rung]))
    if scaled is not None and scaled.manifest is not None:
        owned = owned_by(isvc, scaled.manifest)
        rendered = replace(rendered, manifests=(*rendered.manifests, owned))
    job = (
        probe_job(
            isvc,
            gate,
            probed_hash=rendered.pod_hash,
            kv_cache_dtype=rendered.effective.kv_cache_dtype,
            rolled_out=rolled_out(snap, rendered.pod_hash),
            image=snap.config.operator_image,
            now=snap.now,
        )
        if tier is None  # the gate probes the default tier (an extra tier is its baseline)
        else None
    )
    if job is not None:
        rendered = replace(rendered, manifests=(*rendered.manifests, owned_by(isvc, job)))
    decision = replace(
        decision,
        rendered=rendered,
        autoscaled=scaled,
        accuracy_risks=accuracy_risks(
            snap.catalogs.accuracy, isvc, rendered, chosen, arch, snap.catalogs.models
        ),
    )
    plan = _plan(snap, previous, decision, rendered)
    return replace(plan, fetch_log_tails=findings.need_log_tails)


def _with_layouts(
    moves: tuple[FallbackAttempt, ...], placements: dict[Rung, RungPlacement]
) -> tuple[FallbackAttempt, ...]:
    """Moves whose rungs run different layouts (a derived pipeline: a larger KV cache may
    need more stages, AWQ weights fewer) say so: the condition and the Event name both."""
    said = []
    for move in moves:
        was, now = _placed_layout(placements, move.from_), _placed_layout(placements, move.to)
        change = (
            f" A replica now spans {now[1]}, was {was[1]}." if was and now and was != now else ""
        )
        said.append(
            move.model_copy(update={"reason": move.reason.rstrip() + change}) if change else move
        )
    return tuple(said)


def _as_planned(isvc: InferenceService, placement: RungPlacement) -> InferenceService:
    """The service as the rung's pool plans it: with the layout kvq derived (parallelism
    without pipeline), else as written."""
    layout = rung_layout(placement)
    if isvc.spec.placement.pipeline_derived and layout is not None:
        return laid_out(isvc, layout)
    return isvc


def _placed_layout(placements: dict[Rung, RungPlacement], rung: str) -> tuple[Layout, str] | None:
    found = next((p for r, p in placements.items() if r.value == rung), None)
    layout = rung_layout(found) if found is not None else None
    if found is None or layout is None or found.choice.chosen is None:
        return None
    per_node = found.choice.chosen.pool.gpus_per_node
    nodes = nodes_per_replica(layout.tensor, layout.pipeline, per_node) or 1
    return layout, describe(layout, nodes)


def _group_held(
    snap: Snapshot,
    placement: RungPlacement,
    previous: InferenceServiceStatus,
    decision: Decision,
) -> Plan | None:
    """The plan of a replica over several nodes that cannot be applied now (None: it can).

    Without LeaderWorkerSet's API nothing can run it: a person installs LWS (what runs
    stays). A group is applied only once all of its pods have room: pods of it bound alone
    would hold whole nodes' GPUs doing nothing, and keep other groups off; so a service
    with no group running yet, on a pool without room for every group now, waits whole."""
    isvc, chosen = _as_planned(snap.isvc, placement), placement.choice.chosen
    if chosen is None or replica_nodes(isvc, chosen.pool) == 1:
        return None
    if not snap.leader_worker_sets:
        nodes = replica_nodes(isvc, chosen.pool)
        why = (
            f"a replica spans {nodes} nodes of pool {chosen.pool.name} and runs as a "
            f"LeaderWorkerSet, but {LWS_API_VERSION} is not served: install LeaderWorkerSet "
            "(its controller and CRD) in the cluster"
        )
        return _plan(snap, previous, replace(decision, blocked=("LeaderWorkerSetUnavailable", why)))
    live = snap.deployment
    if chosen.runnable or (live is not None and live.get("kind") == "LeaderWorkerSet"):
        return None
    return _plan(snap, previous, decision)  # nothing applied: the group waits whole


def _engine_and_model(snap: Snapshot) -> tuple[EngineCapability, ModelArchitecture]:
    version = engine_image_and_version(snap.isvc)[1]
    capability = snap.catalogs.engines.capability(version)
    arch = resolve_architecture(snap.isvc.spec.model, snap.catalogs.models)
    return capability, arch


def _cpu_tier_refusal(isvc: InferenceService, capability: EngineCapability) -> str | None:
    """Why this engine cannot keep the spec's CPU tier (None: it can, or none is asked)."""
    try:
        host_tier_of(isvc, capability, engine_image_and_version(isvc)[0])
    except RenderError as error:
        return str(error)
    return None


def _current_rung(status: InferenceServiceStatus) -> Rung | None:
    """The rung the stored status says runs (None before the first decision, or when none
    could run)."""
    active = status.fallback.active_rung if status.fallback else None
    return Rung(active) if active and active != NONE else None


def _waiting_since(status: InferenceServiceStatus) -> datetime | None:
    placed = condition(status.conditions, "Placed")
    if placed is None or placed.status != "False" or placed.reason != WAITING:
        return None
    return _when(placed.last_transition_time)


def _retry_by_hand(
    snap: Snapshot, previous: InferenceServiceStatus
) -> tuple[str | None, bool, datetime | None]:
    """The retry annotation, whether it is new (a person asked now), and the ladder's reset."""
    token = snap.isvc.metadata.annotations.get(keys.ANNOTATION_RETRY)
    stored = previous.fallback.retry_token if previous.fallback else None
    by_hand = token is not None and token != stored
    return token, by_hand, snap.now if by_hand else _reset_at(previous)


def _reset_at(status: InferenceServiceStatus) -> datetime | None:
    stored = status.fallback.reset_at if status.fallback else None
    return _when(stored) if stored else None


def _findings(snap: Snapshot, key: str, rung: Rung | None, pool: str | None) -> EngineFindings:
    if rung is None:
        return EngineFindings()
    dtype = snap.isvc.spec.kv_cache.dtype if rung is Rung.REQUESTED else "auto"
    return examine_pods(
        current_pods(snap.pods, key, rung, pool), kv_cache_dtype=dtype, log_tails=snap.log_tails
    )


def _runtime_verdict(
    snap: Snapshot, findings: EngineFindings, tally: object
) -> RuntimeVerdict | None:
    """A move the engines' evidence forces: a refusal now, an unknown crash once repeated."""
    failure = findings.failure
    if failure is None or not snap.isvc.spec.fallback.enabled:
        return None
    # A group's ranks fail together: say which rank's evidence this is.
    seen = f", seen on {findings.source}" if findings.source else ""
    if failure.action is Action.FALLBACK:
        reason = f"{failure.reason.rstrip(' .')}{seen}." if seen else failure.reason
        return RuntimeVerdict("Refused", reason, failure.excerpt, source=findings.source)
    repeats = snap.config.ladder.suspect_repeats
    count = getattr(tally, "count", 0)
    if failure.action is Action.FALLBACK_AFTER_REPEATS and count >= repeats:
        last = f", the last on {findings.source}" if seen else ""
        reason = f"{failure.reason.rstrip('.')} (the same crash {count} times){last}."
        return RuntimeVerdict(
            "Suspect", reason, failure.excerpt, failure.signature, source=findings.source
        )
    return None


def _with_cleared(
    findings: EngineFindings,
    history: list[FallbackAttempt],
    key: str,
    rung: Rung | None,
    reset_at: datetime | None,
    dtype: str,
) -> EngineFindings:
    """A crash the ladder proved is not the dtype's never counts toward a fallback again."""
    failure = findings.failure
    if (
        failure is None
        or rung is None
        or failure.action is not Action.FALLBACK_AFTER_REPEATS
        or cleared_crash(
            history, key=key, rung=rung, signature=failure.signature, reset_at=reset_at
        )
        is None
    ):
        return findings
    return replace(findings, failure=dtype_cleared(failure.excerpt, failure.signature, dtype))


def _shown_failure(
    moves: tuple[FallbackAttempt, ...],
    moved_on_evidence: bool,
    history: list[FallbackAttempt],
    key: str,
    rung: Rung | None,
    reset_at: datetime | None,
    findings: EngineFindings,
    dtype: str,
) -> Classification | None:
    """The failure status shows: none once a runtime move acted on it; a cleared crash while
    the service still shows it (Degraded stays until a person fixes the cause)."""
    cleared = _cleared_move(moves, history, key, rung, reset_at, findings)
    if cleared is not None:
        return dtype_cleared(cleared.evidence, cleared.signature or "", dtype)
    return None if (moves and moved_on_evidence) else findings.failure


def _cleared_move(
    moves: tuple[FallbackAttempt, ...],
    history: list[FallbackAttempt],
    key: str,
    rung: Rung | None,
    reset_at: datetime | None,
    findings: EngineFindings,
) -> FallbackAttempt | None:
    """The Cleared move whose crash the service still shows: made now, or the key's last move
    while the rung it returned to is not healthy."""
    made = next((m for m in moves if m.cause == "Cleared"), None)
    if made is not None:
        return made
    if moves or rung is None or findings.healthy or findings.failure is not None:
        return None
    mine = [
        a
        for a in history
        if a.key == key and (reset_at is None or (_when(a.time) or reset_at) >= reset_at)
    ]
    last = mine[-1] if mine else None
    if last is not None and last.cause == "Cleared" and last.to == rung.value:
        return last
    return None


def _inventory(snap: Snapshot) -> Inventory:
    """The pools as the operator keeps them counted, else found from the snapshot's nodes."""
    if snap.inventory is not None:
        return snap.inventory
    return discover_pools(
        snap.nodes, snap.catalogs.gpus, snap.config.pool_labels, snap.gpu_pods, snap.claims
    )


def _plan(
    snap: Snapshot,
    previous: InferenceServiceStatus,
    decision: Decision,
    rendered: Rendered | None = None,
) -> Plan:
    status = build_status(snap, previous, decision)
    events = decision_events(previous, status, decision.moves)
    objects = rendered.manifests if rendered else ()
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
    on_gpus, on_nodes = waits_for(snap, previous, decision)
    chosen = decision.placement.choice.chosen if decision.placement else None
    placed = previous.placement.pool if previous.placement else None
    return Plan(
        apply=objects,
        delete=delete,
        service_status=status,
        events=events,
        next_check=NextCheck(_recheck_after(snap, decision), on_gpus, on_nodes),
        pool=chosen.pool.name if chosen is not None else placed,
        claims=rendered.claims if rendered else None,
        status_first=bool(decision.moves)
        or (decision.quality is not None and decision.quality.newly_recorded),
    )


def _keeping_live(plan: Plan, grace: timedelta) -> Plan:
    """Nothing applied or deleted; decided again when the grace period has passed."""
    return replace(plan, keep_live=True, next_check=replace(plan.next_check, after=grace))


def _recheck_after(snap: Snapshot, decision: Decision) -> timedelta | None:
    """When time alone changes the decision: a grace period or a back-off ends."""
    moments: list[datetime] = []
    stored = snap.isvc.status.fallback if snap.isvc.status else None
    if decision.waiting:
        since = _waiting_since(snap.isvc.status or InferenceServiceStatus()) or snap.now
        moments.append(since + snap.config.ladder.grace)
    retries = [
        _when(a.retry_after)
        for a in [*(stored.attempts if stored else []), *decision.moves]
        if a.key == decision.key and a.retry_after
    ]
    moments.extend(m for m in retries if m is not None)
    future = [m - snap.now for m in moments if m > snap.now]
    return min(future) if future else None


def _when(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


__all__ = ["RungPlacement", "decide_workload"]
