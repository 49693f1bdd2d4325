"""The chart's alert rules, evaluated by Prometheus' own rule engine (`promtool test rules`)
on synthetic vLLM and kvq series: each alert fires on the trouble it names and not before.
The dashboard's queries go through the same parser."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.chart import find, render

pytestmark = [
    pytest.mark.helm,
    pytest.mark.skipif(
        shutil.which("promtool") is None, reason="promtool (Debian package prometheus) missing"
    ),
]

POD = {"namespace": "team-a", "pod": "llama3-8b-0"}
CALM = {"namespace": "team-a", "pod": "llama3-8b-1"}


def series(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{inner}}}", "values": values}


def fires(alert: str, at: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": labels}]}


def silent(alert: str, at: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


CASES: list[dict[str, Any]] = [
    {
        "input_series": [
            series("vllm:kv_cache_usage_perc", POD, "0.95x30"),
            series("vllm:kv_cache_usage_perc", CALM, "0.5x30"),
        ],
        "alert_rule_test": [
            silent("KvqKVCacheSaturated", "5m"),
            fires("KvqKVCacheSaturated", "15m", {**POD, "severity": "warning"}),
        ],
    },
    {
        # An engine old enough to name the gauge vllm:gpu_cache_usage_perc.
        "input_series": [series("vllm:gpu_cache_usage_perc", POD, "0.97x30")],
        "alert_rule_test": [fires("KvqKVCacheSaturated", "15m", {**POD, "severity": "warning"})],
    },
    {
        "input_series": [
            series("vllm:num_requests_waiting", POD, "20+2x40"),
            series("vllm:num_requests_waiting", CALM, "30x40"),
        ],
        "alert_rule_test": [
            fires("KvqRequestsQueueGrowing", "25m", {**POD, "severity": "warning"}),
        ],
    },
    {
        "input_series": [
            series("vllm:num_preemptions_total", POD, "0+5x40"),
            series("vllm:num_preemptions_total", CALM, "7x40"),
        ],
        "alert_rule_test": [
            fires("KvqKVCachePreempting", "25m", {**POD, "severity": "warning"}),
        ],
    },
    {
        "input_series": [
            series("kvq_fallbacks_total", {"reason": "FallbackRuntime"}, "0x10 1x50"),
        ],
        "alert_rule_test": [
            silent("KvqFallbackActive", "5m"),
            fires("KvqFallbackActive", "20m", {"reason": "FallbackRuntime", "severity": "info"}),
            silent("KvqFallbackActive", "55m"),
        ],
    },
    {
        "input_series": [series("kvq_reconcile_errors_total", {}, "0+1x60")],
        "alert_rule_test": [fires("KvqReconcileErrors", "40m", {"severity": "warning"})],
    },
]


def test_alerts_fire_on_their_trouble_only(tmp_path: Path) -> None:
    (rule,) = find(render(tmp_path, {"prometheusRule": {"enabled": True}}), "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    for case in CASES:
        for check in case["alert_rule_test"]:
            for expected in check["exp_alerts"]:
                # promtool compares annotations too: take them from the rule under test.
                expected["exp_annotations"] = _annotations(rule, check["alertname"], expected)
    tests = [{"interval": "1m", **case} for case in CASES]
    spec = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(spec))
    done = subprocess.run(
        ["promtool", "check", "rules", "rules.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run(
        ["promtool", "test", "rules", "alerts_test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _annotations(rule: dict[str, Any], alert: str, expected: dict[str, Any]) -> dict[str, str]:
    (found,) = [r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == alert]
    labels = expected["exp_labels"]
    out = {}
    for key, template in found["annotations"].items():
        text = template
        for name, value in labels.items():
            text = text.replace(f"{{{{ $labels.{name} }}}}", value)
        out[key] = text
    return out


def test_dashboard_queries_parse_as_promql(tmp_path: Path) -> None:
    (dashboard,) = find(render(tmp_path, {"grafanaDashboard": {"enabled": True}}), "ConfigMap")
    panels = json.loads(dashboard["data"]["kvq-overview.json"])["panels"]
    # Each panel query as a recording rule: promtool parses it with Prometheus' own parser.
    rules = [
        {"record": f"kvq:dashboard_panel_{panel['id']}_{target['refId']}", "expr": target["expr"]}
        for panel in panels
        for target in panel["targets"]
    ]
    for rule in rules:
        rule["expr"] = rule["expr"].replace("$namespace", ".*")
    assert len(rules) >= len(panels) > 0
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
