"""`make bench` reads create -> Deployment from the API server's audit log: which events
count as a creation (the real log lines of a bench run), and a wave the log does not
cover whole is no pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from e2e.bench.fleet import Results, Stored, _judge, _latency, _stored

AUDIT = Path(__file__).parent.parent / "fixtures" / "bench" / "audit.jsonl"


def _events() -> list[dict[str, Any]]:
    return [json.loads(line) for line in AUDIT.read_text().splitlines()]


def _write(tmp_path: Path, events: list[dict[str, Any]]) -> Path:
    path = tmp_path / "audit.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_the_creations_are_the_create_and_the_apply_that_answered_201() -> None:
    stored = _stored(AUDIT)
    # The fallback's apply (200) came 2.3 s later: it updated the Deployment.
    assert stored.services == {"svc-0019": 1796195962.795179}
    assert stored.deployments == {"svc-0019": 1796195963.785125}
    assert _latency(stored.services, stored.deployments, ["svc-0019"])["p95"] == 0.99


def test_failed_writes_and_subresources_are_not_creations(tmp_path: Path) -> None:
    create, deployed, _ = _events()
    refused = {**create, "responseStatus": {"code": 409}}  # AlreadyExists: someone else's
    status = {**deployed, "objectRef": {**deployed["objectRef"], "subresource": "status"}}
    assert _stored(_write(tmp_path, [refused, status])) == Stored({}, {})


def test_an_object_created_again_keeps_its_first_creation(tmp_path: Path) -> None:
    create, deployed, _ = _events()
    later = {**deployed, "stageTimestamp": "2026-12-02T07:20:00.000000Z"}
    assert _stored(_write(tmp_path, [create, deployed, later])).deployments == {
        "svc-0019": 1796195963.785125
    }


def test_a_first_wave_missing_from_the_audit_log_is_no_pass() -> None:
    def judged(count: int) -> bool:
        results = Results(services=100, nodes=50, first_wave=100, load_average=[])
        results.create_to_deployment_at_100_s = {"count": count, "p50": 0.5, "p95": 0.8}
        _judge(results)
        return results.verdicts["create_to_deployment_p95_at_100_s"]

    assert judged(100)
    assert not judged(99)  # one service's Deployment never recorded
