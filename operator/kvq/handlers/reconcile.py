"""The one reconcile: read (indices) -> decide (pure) -> execute (k8s). Same on every trigger."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import kopf

from kvq.api.models import InferenceService
from kvq.api.validation import InvalidInferenceServiceError, parse_inference_service
from kvq.catalog.engines import EngineVersionError
from kvq.decide import decide
from kvq.decide.invalid import REASON as INVALID_REASON
from kvq.decide.invalid import invalid_status
from kvq.decide.metrics import EngineReading
from kvq.decide.types import Catalogs, EventSpec, OperatorConfig, Plan, Snapshot
from kvq.handlers.indices import EngineKey, plain
from kvq.k8s.clients import Clients
from kvq.k8s.events import post_event
from kvq.k8s.executor import Outcome, execute
from kvq.k8s.logs import read_log_tails
from kvq.k8s.reads import read_inference_service
from kvq.k8s.status import ObjectGoneError, StatusConflictError, write_status
from kvq.metrics import DECISION_SECONDS, RECONCILE_ERRORS, RECONCILES
from kvq.observe.prometheus import PrometheusReader
from kvq.render.settings import RenderError, engine_image_and_version

# A stale snapshot is cheap to redo: retry soon, the indices will have caught up.
CONFLICT_RETRY_SECONDS = 1.0


@dataclass
class Runtime:
    """What every reconcile needs, built once at start-up and kept in kopf's memo."""

    catalogs: Catalogs
    config: OperatorConfig
    clients: Clients
    metrics_reader: PrometheusReader | None = None
    """Engine metrics for status.metrics; None when the operator has no Prometheus."""
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _locks_guard: threading.Lock = field(default_factory=threading.Lock)

    def lock_for(self, uid: str) -> threading.Lock:
        """One reconcile at a time per object (the timer and a change handler may overlap)."""
        with self._locks_guard:
            return self._locks.setdefault(uid, threading.Lock())


@dataclass(frozen=True)
class Observed:
    """The kopf indices reconcile reads (key -> collection of plain bodies)."""

    nodes: Mapping[Any, Collection[Mapping[str, Any]]]
    pods: Mapping[EngineKey, Collection[Mapping[str, Any]]]
    owned: Sequence[Mapping[EngineKey, Collection[Mapping[str, Any]]]]
    """One index per kind kvq renders (ConfigMap, Deployment, Service, PDB)."""


def reconcile(
    runtime: Runtime, body: Mapping[str, Any], observed: Observed, now: datetime | None = None
) -> Outcome | None:
    """Converge one InferenceService; None when there was nothing to converge (spec
    unreadable, or the object is being deleted: its children go with it).

    kopf's body can lag behind a status this operator just wrote (a timer and a change
    handler in a row): a conflict re-reads the object and decides once more before kopf is
    asked to retry.
    """
    now = now or datetime.now(UTC)
    raw = plain(body)
    meta = raw["metadata"]
    if _being_deleted(raw):
        RECONCILES.labels(result="deleting").inc()
        return None
    with runtime.lock_for(meta["uid"]):
        try:
            try:
                outcome = _reconcile_valid(runtime, raw, observed, now)
            except StatusConflictError:
                raw = read_inference_service(runtime.clients, meta["namespace"], meta["name"])
                if _being_deleted(raw):
                    # Never write to an object on its way out: kopf is lifting its finalizer.
                    raise ObjectGoneError("being deleted") from None
                outcome = _reconcile_valid(runtime, raw, observed, now)
        except ObjectGoneError:
            # Deleted under a reconcile that read it earlier; the garbage collector takes
            # anything this pass applied (its ownerReference names the deleted owner).
            RECONCILES.labels(result="deleting").inc()
            return None
        except InvalidInferenceServiceError as invalid:
            _report_invalid(runtime, raw, invalid, now)
            RECONCILES.labels(result="invalid").inc()
            return None
        except StatusConflictError as conflict:
            RECONCILES.labels(result="conflict").inc()
            raise kopf.TemporaryError(str(conflict), delay=CONFLICT_RETRY_SECONDS) from conflict
        except Exception:
            RECONCILES.labels(result="error").inc()
            RECONCILE_ERRORS.inc()
            raise
    RECONCILES.labels(result="ok").inc()
    return outcome


def _being_deleted(raw: Mapping[str, Any]) -> bool:
    return bool(raw["metadata"].get("deletionTimestamp"))


def _reconcile_valid(
    runtime: Runtime, raw: dict[str, Any], observed: Observed, now: datetime
) -> Outcome:
    isvc = parse_inference_service(raw)
    namespace, name = raw["metadata"]["namespace"], raw["metadata"]["name"]
    key = (namespace, name)
    pods = list(observed.pods.get(key, ()))
    owned = [
        obj
        for index in observed.owned
        for obj in index.get(key, ())
        if _controlled_by(obj, raw["metadata"]["uid"])
    ]
    deployment = next(
        (o for o in owned if o["kind"] == "Deployment" and o["metadata"]["name"] == name), None
    )
    snapshot = Snapshot(
        isvc=isvc,
        nodes=[node for store in observed.nodes.values() for node in store],
        pods=pods,
        deployment=deployment,
        now=now,
        catalogs=runtime.catalogs,
        config=runtime.config,
        owned=owned,
        engine_metrics=_engine_metrics(runtime, isvc, deployment),
    )
    plan = _timed_decide(snapshot)
    if plan.fetch_log_tails:
        tails = read_log_tails(
            runtime.clients, namespace, plan.fetch_log_tails, pods, runtime.config
        )
        plan = _timed_decide(replace(snapshot, log_tails=tails))
    return execute(runtime.clients, plan, raw, now)


def _engine_metrics(
    runtime: Runtime, isvc: InferenceService, deployment: Mapping[str, Any] | None
) -> EngineReading | None:
    """The engines' metrics from Prometheus (rate-limited by the reader); None without
    a Prometheus or before kvq deployed anything."""
    if runtime.metrics_reader is None or deployment is None:
        return None
    try:
        version = engine_image_and_version(isvc)[1]
        names = runtime.catalogs.engines.capability(version).metrics
    except (RenderError, EngineVersionError):
        return None  # decide() reports the version problem in status
    # The engine Service is named after the InferenceService (the scrape label contract).
    return runtime.metrics_reader.read(isvc.metadata.namespace or "", isvc.metadata.name, names)


def _controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Labels name the InferenceService; only the ownerReference says it is this incarnation."""
    references = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("controller") for r in references)


def _timed_decide(snapshot: Snapshot) -> Plan:
    began = time.perf_counter()
    try:
        return decide(snapshot)
    finally:
        DECISION_SECONDS.observe(time.perf_counter() - began)


def _report_invalid(
    runtime: Runtime, raw: dict[str, Any], invalid: InvalidInferenceServiceError, now: datetime
) -> None:
    status = invalid_status(raw, invalid.violations, now)
    # The Event goes with the status change only, not with every timer tick.
    if write_status(runtime.clients, raw, status):
        message = "; ".join(str(v) for v in invalid.violations)
        post_event(runtime.clients, raw, EventSpec("Warning", INVALID_REASON, message), now)
