"""The lasting record of a run: e2e/gpu/results/<date>-<gpu>.json and .md.

Pure: the markdown is made from the JSON document alone, so a merged document (several
device calls of one tier run) reads like one.
"""

from __future__ import annotations

import re
from typing import Any

GIB = 1 << 30


def merge(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs on one GPU (one device call each) as one document, points in order."""
    if not documents:
        raise ValueError("nothing to merge")
    first = documents[0]
    products = {d["pool"]["product"] for d in documents}
    if len(products) != 1:
        raise ValueError(f"runs on different GPUs: {', '.join(sorted(products))}")
    merged = {k: v for k, v in first.items() if k not in ("points", "finished", "wall_s")}
    # A document `report` already merged carries its runs: keep them (re-planning a
    # merged result must not fold runs b and c into a) rather than read it as one run.
    merged["runs"] = [
        run
        for d in documents
        for run in d.get("runs")
        or [
            {
                "label": d.get("label", ""),
                "started": d["started"],
                "finished": d.get("finished"),
                "wall_s": d.get("wall_s"),
                "versions": d["versions"],
            }
        ]
    ]
    points: dict[tuple[str, str, int, int | None, int, int], dict[str, Any]] = {}
    for document in documents:
        for record in document["points"]:
            key = point_key(record)
            if record["outcome"] != "not run" or key not in points:
                points[key] = record
    merged["points"] = list(points.values())
    return merged


def point_key(record: dict[str, Any]) -> tuple[str, str, int, int | None, int, int]:
    """`Point.key` of a saved point (runs before --max-model-len: 4,096, every layer; runs
    before tp/pp: one GPU)."""
    return (
        record["shape"],
        record["dtype"],
        int(record.get("max_model_len") or 4096),
        record.get("layers"),
        int(record.get("tensor_parallel") or 1),
        int(record.get("pipeline_parallel") or 1),
    )


def file_stem(document: dict[str, Any]) -> str:
    """`2026-12-01-h200`: the run's date and the GPU's catalog product."""
    product = re.sub(r"[^a-z0-9]+", "-", document["pool"]["product"].lower()).strip("-")
    return f"{document['started'][:10]}-{product}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.2f} %"


def _int(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _layers(record: dict[str, Any]) -> str:
    if record.get("layers") is None:
        return "all"
    return f"{record['layers']} of {record.get('model_layers', '?')}"


def _layout(record: dict[str, Any]) -> str:
    _, _, _, _, tensor, pipeline = point_key(record)
    return f"{tensor} x {pipeline}"


def _once(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per (shape, layers): the config changes do not depend on the dtype."""
    seen: dict[tuple[str, int | None], dict[str, Any]] = {}
    for r in records:
        seen.setdefault((r["shape"], r.get("layers")), r)
    return list(seen.values())


def _first_cause(message: str) -> str:
    lines = [
        ln
        for ln in message.splitlines()
        if ln and not ln.startswith(("engine exited", "error lines"))
    ]
    return lines[0][:160].replace("|", "\\|") if lines else "-"


def render_markdown(document: dict[str, Any]) -> str:
    gpu, pool, versions = document["gpu"], document["pool"], document["versions"]
    points = document["points"]
    out = [
        f"# GPU tier: {document['started'][:10]}, {gpu['count']}x {gpu['name']}",
        "",
        "kvq's rendered vLLM command on a real GPU (`make test-gpu`, e2e/gpu/README.md).",
        f"**Weights are dummy.** {document['weights']}. Throughput and latency are those of "
        "random weights on the real kernels; capacity and refusals do not depend on the "
        "weights' values.",
        "",
        "| what | value |",
        "|---|---|",
        f"| GPU | {gpu['count']}x {gpu['name']}, {gpu['memory_mib']:,} MiB, "
        f"driver {gpu['driver']} |",
        f"| kvq pool | {pool['name']} ({pool['product']}, compute capability "
        f"{pool['compute_capability']}) |",
        f"| vLLM | {versions.get('vllm')} (offline bundle, e2e/gpu/bundle.py) |",
        f"| torch | {versions.get('torch')}; triton {versions.get('triton')}; "
        f"transformers {versions.get('transformers')}; Python {versions.get('python')} |",
        f"| kvq | commit {versions.get('kvq_commit')} |",
        f"| load | {document['load']['description']} |",
        "",
        "What the harness adds to the pod's command: " + "; ".join(document["harness_adds"]) + ".",
        "",
    ]
    for run in document.get("runs", []):
        out.append(
            f"- run {run['label'] or '-'}: {run['started']} to {run['finished']} "
            f"({_num(run['wall_s'], 0)} s), kvq {run['versions'].get('kvq_commit')}"
        )
    out += [f"- {note}" for note in document.get("notes", [])]
    replanned = document.get("replanned")
    if replanned:
        out.append(
            f"- plans recomputed {replanned['at']} with kvq {replanned.get('kvq_commit')}'s "
            "planner from each point's saved config.json and settings (`run.py report`)"
        )
    out += [
        "",
        "## Capacity: vLLM's KV tokens and concurrency against `kvq plan`",
        "",
        'Concurrency: vLLM\'s "Maximum concurrency for L tokens per request" (sequences of '
        "the max model length L) and the plan's. Padding: vLLM's hybrid KV-cache manager's "
        '"Add N padding layers" line.',
        "",
        "| shape | layers | TP x PP | max len | dtype | outcome | backend | vLLM KV tokens "
        "| plan KV tokens | plan error | vLLM / plan concurrency | error | padding "
        "| vLLM avail. KV GiB | plan GiB | activation vLLM / plan GiB |",
        "|---|---|---|---:|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in points:
        startup = r.get("startup") or {}
        cap = r.get("capacity") or {}
        plan = r["plan"]
        padding = (
            f"{startup['padding_layers']} ({_num(startup.get('padding_waste_pct'), 2)} %)"
            if startup.get("padding_layers") is not None
            else "-"
        )
        out.append(
            f"| {r['shape']} | {_layers(r)} | {_layout(r)} | {_int(point_key(r)[2])} | "
            f"{r['dtype']} | "
            f"{r['outcome']} | {startup.get('attention_backend') or '-'} | "
            f"{_int(cap.get('measured_kv_tokens'))} | {_int(plan['kv_tokens'])} | "
            f"{_pct(cap.get('error'))} | {_num(startup.get('max_concurrency'), 2)} / "
            f"{_num(plan.get('max_concurrency'), 2)} | {_pct(cap.get('concurrency_error'))} | "
            f"{padding} | {_num(startup.get('available_kv_gib'), 2)} | "
            f"{_num(plan['available_kv_bytes'] / GIB, 2)} | "
            f"{_num(startup.get('peak_activation_gib'), 2)} / "
            f"{_num(plan['activation_bytes'] / GIB, 2)} |"
        )
    changed = [r for r in points if r.get("config_changes")]
    if changed:
        out += ["", "What the served config.json changes from the catalog row:", ""]
        out += [f"- {r['shape']}: {'; '.join(r['config_changes'])}" for r in _once(changed)]
    out += [
        "",
        "## Refusals and crashes: the termination message alone, classified",
        "",
        "| shape | dtype | catalog predicts | outcome | exit | class | falls back | verdict "
        "| first error line |",
        "|---|---|---|---|---:|---|---|---|---|",
    ]
    for r in points:
        failure = r.get("failure") or {}
        predicted = "runs" if r["prediction"]["runs"] else "refused"
        out.append(
            f"| {r['shape']} | {r['dtype']} | {predicted} | {r['outcome']} | "
            f"{failure.get('exit_code', '-')} | {failure.get('class', '-')} | "
            f"{failure.get('fallback', '-')} | {r.get('verdict', '-')} | "
            f"{_first_cause(failure.get('termination_message', ''))} |"
        )
    loads = [r for r in points if r.get("load")]
    if loads:
        out += [
            "",
            "## The source document's check: one identical load per dtype",
            "",
            f"{document['load']['description']}.",
            "",
            "| shape | dtype | peak KV usage | vs auto | wall s | output tok/s | total tok/s "
            "| p50 s | p95 s | preemptions | failed |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        auto = {r["shape"]: r["load"] for r in loads if r["dtype"] == "auto"}
        for r in loads:
            load = r["load"]
            base = auto.get(r["shape"])
            ratio = (
                load["peak_kv_usage"] / base["peak_kv_usage"]
                if base and base.get("peak_kv_usage") and load.get("peak_kv_usage") is not None
                else None
            )
            out.append(
                f"| {r['shape']} | {r['dtype']} | {_num(load.get('peak_kv_usage'), 3)} | "
                f"{_num(ratio, 2)}x | {_num(load['wall_s'], 2)} | "
                f"{_num(load['output_tokens_per_s'])} | {_num(load['total_tokens_per_s'])} | "
                f"{_num(load.get('p50_s'), 2)} | {_num(load.get('p95_s'), 2)} | "
                f"{_num(load.get('preemptions'), 0)} | {load['failed']} |"
            )
    warnings = sorted(
        {r["prediction"]["slow_warning"] for r in points if r["prediction"].get("slow_warning")}
    )
    if warnings:
        out += [
            "",
            "The catalog's warning at the time of the run (`kvq plan --engine-version`):",
            "",
        ]
        out += [f"- {w}" for w in warnings]
    not_run = [r for r in points if r["outcome"] == "not run"]
    out += ["", "## Not run", ""]
    out += [
        f"- {r.get('inference_service', r['shape'])} / {r['dtype']}: "
        f"{r.get('why_not_run', 'not reached')}"
        for r in not_run
    ] or ["- nothing"]
    out += ["", "## Exact commands", ""]
    for r in points:
        env = " ".join(f"{k}={v}" for k, v in sorted(r["env"].items()))
        out.append(f"- `{r.get('inference_service', r['shape'])}` ({r['outcome']}):")
        if r.get("substitution"):
            out.append(f"  {r['substitution']}.")
        out.append(f"  `{env} {' '.join(r['command'])}`")
        out.append(f"  plan: `{r['plan_command']}`")
    return "\n".join(out) + "\n"
