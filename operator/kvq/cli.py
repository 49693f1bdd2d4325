"""`kvq`: the operator and the tools around it (plan, render, validate, crd, dev-cluster)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import typer
import yaml
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    name="kvq",
    help="Kubernetes operator for vLLM with a quantized (FP8/INT8) KV cache.",
    no_args_is_help=True,
    add_completion=False,
)
err = Console(stderr=True)


def _mount_dev_cluster() -> None:
    from kvq.devcluster.cli import app as dev_cluster_app

    app.add_typer(dev_cluster_app, name="dev-cluster")


_mount_dev_cluster()


def _load_documents(path: str) -> list[dict[str, Any]]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    try:
        docs = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as error:
        err.print(f"[red]error:[/] {path} is not valid YAML: {error}")
        raise typer.Exit(2) from error
    if not all(isinstance(d, dict) for d in docs):
        err.print(f"[red]error:[/] {path} must hold YAML mappings (Kubernetes objects)")
        raise typer.Exit(2)
    return docs


@app.command()
def crd() -> None:
    """Print the InferenceService CustomResourceDefinition (generated from the API models)."""
    from kvq.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())


@app.command()
def validate(
    file: Annotated[str, typer.Option("-f", "--filename", help="YAML file, or - for stdin")],
) -> None:
    """Check InferenceServices with the same verdicts and messages as the CRD at apply time."""
    from kvq.api.models import KIND
    from kvq.api.validation import find_violations

    failed = False
    for doc in _load_documents(file):
        if doc.get("kind") != KIND:
            continue
        name = (doc.get("metadata") or {}).get("name", "<unnamed>")
        violations = find_violations(doc)
        if violations:
            failed = True
            print(f'The InferenceService "{name}" is invalid:')
            for violation in violations:
                print(f"* {violation}")
        else:
            print(f"inferenceservice/{name} valid")
    raise typer.Exit(1 if failed else 0)


OutputFormat = Literal["table", "json"]
ALL_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")


@app.command()
def plan(
    model: Annotated[str, typer.Option(help="Catalog name, hf:// URI, or config.json path")],
    gpu: Annotated[str, typer.Option(help="GPU product, as a node label spells it")],
    gpus: Annotated[int, typer.Option(min=1, max=8, help="GPUs per replica (TP)")] = 1,
    gpu_memory_utilization: Annotated[float, typer.Option(min=0.01, max=1.0)] = 0.90,
    kv_cache_dtype: Annotated[str, typer.Option(help="A dtype, or all")] = "all",
    max_model_len: Annotated[int | None, typer.Option(min=16)] = None,
    block_size: Annotated[int, typer.Option(min=1)] = 16,
    max_num_seqs: Annotated[
        int | None, typer.Option(min=1, help="vLLM --max-num-seqs (default: what serve picks)")
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None,
        typer.Option(min=1, help="vLLM --max-num-batched-tokens (default: what serve picks)"),
    ] = None,
    engine_version: Annotated[
        str | None, typer.Option(help="Also check each dtype against this vLLM version")
    ] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
) -> None:
    """What one replica holds on a GPU, per KV-cache dtype, before anything is scheduled."""
    from kvq.catalog.engines import EngineVersionError, load_engine_catalog
    from kvq.catalog.gpus import load_gpu_catalog
    from kvq.catalog.models import load_model_catalog
    from kvq.planner import plan_capacity
    from kvq.planner.architecture import UnknownModelError, architecture_for_cli

    if output not in ("table", "json"):
        _fail(f"--output must be table or json, not {output!r}")
    dtypes = ALL_DTYPES if kv_cache_dtype == "all" else (kv_cache_dtype,)
    if any(d not in ALL_DTYPES for d in dtypes):
        _fail(f"--kv-cache-dtype must be one of {', '.join(ALL_DTYPES)} or all")
    gpu_model = load_gpu_catalog().lookup(gpu)
    if gpu_model is None:
        _fail(f"unknown GPU {gpu!r}: see the products in kvq/catalog/gpus.yaml")
    try:
        model_name, arch = architecture_for_cli(model, load_model_catalog())
    except UnknownModelError as error:
        _fail(str(error))
    capability = None
    if engine_version is not None:
        try:
            capability = load_engine_catalog().capability(engine_version)
        except EngineVersionError as error:
            _fail(str(error))
    rows: dict[str, dict[str, Any]] = {}
    for dtype in dtypes:
        result = plan_capacity(
            arch,
            gpu_model,
            dtype,
            tensor_parallel=gpus,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        row: dict[str, Any] = {
            "kvBytesPerToken": result.kv_bytes_per_token,
            "availableKvBytes": result.available_kv_bytes,
            "kvTokens": result.kv_tokens,
            "maxConcurrency": round(result.max_concurrency, 2),
            "maxModelLen": result.max_model_len,
            "maxNumSeqs": result.max_num_seqs,
            "maxNumBatchedTokens": result.max_num_batched_tokens,
            "ratioVsAuto": round(result.ratio_vs_auto, 3),
            "fits": result.fits,
        }
        if result.reason:
            row["reason"] = result.reason
        if capability is not None:
            verdict = capability.kv_dtype_verdict(dtype, gpu_model.compute_capability)
            row["engine"] = {
                "ok": verdict.ok,
                "value": verdict.engine_value,
                "reason": verdict.reason,
            }
            slow = capability.slow_warning(dtype, gpu_model.compute_capability)
            if slow is not None and verdict.ok:
                row["engine"]["warning"] = slow
        rows[dtype] = row
    if output == "json":
        document = {
            "model": model_name,
            "gpu": gpu_model.product,
            "computeCapability": gpu_model.compute_capability_str,
            "gpuMemoryMiB": gpu_model.memory_mib,
            "gpus": gpus,
            "gpuMemoryUtilization": gpu_memory_utilization,
            "engineVersion": engine_version,
            "dtypes": rows,
        }
        print(json.dumps(document, indent=2))
        return
    _print_plan_table(model_name, gpu_model.product, gpus, rows, engine_version)


def _print_plan_table(
    model: str, gpu: str, gpus: int, rows: dict[str, dict[str, Any]], engine: str | None
) -> None:
    any_row = next(iter(rows.values()))
    title = f"{model} on {gpus}x {gpu}, maxModelLen {any_row['maxModelLen']:,}"
    table = Table(title=title)
    for column in ("dtype", "bytes/token", "KV memory", "KV tokens", "max seqs", "vs auto"):
        table.add_column(column, justify="left" if column == "dtype" else "right")
    if engine:
        table.add_column(f"vLLM {engine}")
    notes: list[str] = []
    for dtype, row in rows.items():
        fits = row["fits"]
        cells = [
            dtype,
            f"{row['kvBytesPerToken']:,}",
            f"{row['availableKvBytes'] / 2**30:.2f} GiB" if fits else "-",
            f"{row['kvTokens']:,}" if fits else "-",
            f"{row['maxConcurrency']:.2f}" if fits else "does not fit",
            f"{row['ratioVsAuto']:.2f}x",
        ]
        if row.get("reason"):
            notes.append(f"{dtype}: {row['reason']}")
        if engine:
            verdict = row["engine"]
            cells.append("ok" if verdict["ok"] else "refused")
            if not verdict["ok"]:
                notes.append(f"{dtype} refused: {verdict['reason']}")
            if verdict.get("warning"):
                notes.append(f"{dtype} warning: {verdict['warning']}")
        table.add_row(*cells)
    Console(width=120).print(table)
    for note in dict.fromkeys(notes):
        print(note)


@app.command()
def render(
    file: Annotated[str, typer.Option("-f", "--filename", help="InferenceService YAML, or -")],
    pool: Annotated[str, typer.Option(help="GPU product of the target pool, e.g. H100")],
    gpus_per_node: Annotated[int, typer.Option(min=1, max=16)] = 8,
    engine_version: Annotated[str | None, typer.Option(help="Override spec.engine.version")] = None,
    rung: Annotated[str, typer.Option(help="requested, auto or awq")] = "requested",
) -> None:
    """Print the manifests kvq would apply for an InferenceService on a pool (for GitOps)."""
    from kvq.api.validation import InvalidInferenceServiceError, parse_inference_service
    from kvq.catalog.engines import load_engine_catalog
    from kvq.catalog.gpus import load_gpu_catalog
    from kvq.catalog.models import load_model_catalog
    from kvq.placement.pool import pool_for_gpu
    from kvq.planner.architecture import UnknownModelError, resolve_architecture
    from kvq.render import RenderError, effective_settings, render_manifests

    gpu_model = load_gpu_catalog().lookup(pool)
    if gpu_model is None:
        _fail(f"unknown GPU {pool!r}: see the products in kvq/catalog/gpus.yaml")
    if rung not in ("requested", "auto", "awq"):
        _fail("--rung must be requested, auto or awq")
    documents = []
    for doc in _load_documents(file):
        if doc.get("kind") != "InferenceService":
            continue
        if engine_version is not None:
            doc.setdefault("spec", {}).setdefault("engine", {})["version"] = engine_version
        try:
            isvc = parse_inference_service(doc)
            try:  # the model's size derives memory, the cache's size and the start-up budget
                arch = resolve_architecture(isvc.spec.model, load_model_catalog())
            except UnknownModelError:
                arch = None
            settings = effective_settings(
                isvc,
                gpu_model,
                rung,  # type: ignore[arg-type]
                engines=load_engine_catalog(),
                arch=arch,
            )
            documents += render_manifests(isvc, pool_for_gpu(gpu_model, gpus_per_node), settings)
        except InvalidInferenceServiceError as error:
            _fail(str(error))
        except RenderError as error:
            # The engine refuses the KV dtype on this GPU: a fallback rung may render.
            hint = " (try --rung auto or --rung awq)" if "kvCache.dtype" in str(error) else ""
            _fail(f"{isvc.metadata.name}: {error}{hint}")
    sys.stdout.write(dump_yaml(documents))


@app.command()
def fetch(
    uri: Annotated[str, typer.Option(help="hf://org/name or s3://bucket/prefix")],
    cache_dir: Annotated[str, typer.Option(help="The cache volume's mount path")],
    revision: Annotated[str | None, typer.Option(help="hf://: branch, tag or commit")] = None,
    link: Annotated[str | None, typer.Option(help="Symlink to point at the fetched model")] = None,
) -> None:
    """Download a model into the cache (the engine pod's init container), verify, link it."""
    from kvq.fetch.command import run_fetch

    raise typer.Exit(run_fetch(uri, revision, cache_dir, link))


@app.command()
def probe(
    url: Annotated[str, typer.Option(help="OpenAI-compatible server, e.g. http://HOST:PORT")],
    model: Annotated[str | None, typer.Option(help="Served model (default: the first)")] = None,
    suite: Annotated[
        str, typer.Option(help="Comma-separated: needle,json,repetition,agreement")
    ] = "needle,json,repetition",
    baseline_url: Annotated[
        str | None, typer.Option(help="Same model, reference KV cache (agreement)")
    ] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table, json or png")] = "table",
    png_file: Annotated[Path, typer.Option(help="Heat-map file for -o png")] = Path(
        "kvq-probe-needle.png"
    ),
    require: Annotated[
        list[str] | None,
        typer.Option(help="Threshold, e.g. 'needle.accuracy>=0.9' or '...>=baseline-0.05'"),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of prompts and sampling")] = 1234,
    needle_trials: Annotated[int, typer.Option(min=1, help="Needles per depth and length")] = 2,
    needle_distractors: Annotated[
        int, typer.Option(min=0, max=20, help="Other facts of the same shape in each haystack")
    ] = 3,
    max_context: Annotated[
        int | None, typer.Option(min=64, help="Longest context (default: the server's)")
    ] = None,
    budget_s: Annotated[float, typer.Option(min=1.0, help="Time budget for all requests")] = 900,
    termination_log: Annotated[
        Path | None, typer.Option(help="Write the verdict summary here (a Job's termination log)")
    ] = None,
) -> None:
    """Measure answer quality of a served model (needles, JSON, repetition, agreement).

    Exit code: 0 Pass, 1 Fail, 3 Unknown (engine unreachable, budget spent), 2 bad usage.
    """
    from kvq.probe.checks import RequirementError, parse_requirement
    from kvq.probe.console import RichProgress, print_report
    from kvq.probe.heatmap import PlotUnavailableError, write_heatmap
    from kvq.probe.report import Verdict, summary_json, to_json
    from kvq.probe.runner import SUITES, ProbeOptions, run_probe

    suites = tuple(s.strip() for s in suite.split(",") if s.strip())
    if not suites or any(s not in SUITES for s in suites):
        _fail(f"--suite takes a comma-separated list of {', '.join(SUITES)}")
    if "agreement" in suites and not baseline_url:
        _fail("the agreement suite needs --baseline-url")
    if output not in ("table", "json", "png"):
        _fail(f"--output must be table, json or png, not {output!r}")
    try:
        requirements = tuple(parse_requirement(r) for r in require or ())
    except RequirementError as error:
        _fail(str(error))
    options = ProbeOptions(
        url=url,
        model=model,
        suites=suites,
        baseline_url=baseline_url,
        seed=seed,
        needle_trials=needle_trials,
        needle_distractors=needle_distractors,
        max_context=max_context,
        budget_s=budget_s,
        requirements=requirements,
    )
    with RichProgress() as progress:
        report = run_probe(options, progress)
    if termination_log is not None:
        termination_log.write_text(summary_json(report))
    if output == "json":
        print(to_json(report))
    else:
        print_report(report)
    if output == "png":
        try:
            err.print(f"needle heat map: {write_heatmap(report, png_file)}", highlight=False)
        except (PlotUnavailableError, ValueError) as error:
            _fail(str(error))
    raise typer.Exit({Verdict.PASS: 0, Verdict.FAIL: 1, Verdict.UNKNOWN: 3}[report.verdict])


@app.command()
def demo(
    profile: Annotated[str, typer.Option(help="Cluster profile (e2e/clusters)")] = "hetero",
) -> None:
    """Local control plane + operator + examples: placement, static and runtime fallback."""
    from kvq.devcluster.demo import run_demo

    raise typer.Exit(run_demo(profile=profile))


class _LiteralDumper(yaml.SafeDumper):
    """Multi-line strings (the evidence wrapper script) as readable `|` blocks."""


def _str_presenter(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _str_presenter)


def dump_yaml(documents: list[dict[str, Any]]) -> str:
    return yaml.dump_all(documents, Dumper=_LiteralDumper, sort_keys=True, width=100)


@app.command()
def diagnose(
    file: Annotated[
        str,
        typer.Option(
            "-f", "--filename", help="A termination message or a whole engine log, or - for stdin"
        ),
    ],
    kv_cache_dtype: Annotated[
        str, typer.Option(help="The KV-cache dtype the engine ran with")
    ] = "auto",
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
) -> None:
    """Say what kvq would do with an engine's failure: fall back, wait, or what to fix."""
    from kvq.fallback.classifier import classify_failure
    from kvq.fallback.diagnosis import diagnose_text

    if output not in ("table", "json"):
        _fail(f"--output must be table or json, not {output!r}")
    if kv_cache_dtype not in ALL_DTYPES:
        _fail(f"--kv-cache-dtype must be one of {', '.join(ALL_DTYPES)}")
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(errors="replace")
    except OSError as error:
        _fail(f"cannot read {file}: {error.strerror or error}")
    if not text.strip():
        _fail(f"{file} is empty: give a termination message or an engine log")
    diagnosis = diagnose_text(text, kv_cache_dtype=kv_cache_dtype, classify=classify_failure)
    if output == "json":
        print(json.dumps(diagnosis.to_json(), indent=2))
        return
    table = Table(show_header=False, box=None)
    table.add_row("family", diagnosis.family)
    table.add_row("decision", f"{diagnosis.decision}: {diagnosis.what_kvq_does}")
    table.add_row("reason", diagnosis.reason)
    table.add_row("what to do", diagnosis.remedy)
    Console().print(table)
    if diagnosis.evidence:
        print("evidence:")
        print("\n".join(f"  {line}" for line in diagnosis.evidence.splitlines()))


def _fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/] {message}", highlight=False)
    raise typer.Exit(2)


@app.command()
def run(
    namespace: Annotated[
        list[str] | None, typer.Option("--namespace", "-n", help="Watch this namespace (repeat)")
    ] = None,
    all_namespaces: Annotated[
        bool, typer.Option("--all-namespaces", "-A", help="Watch every namespace")
    ] = False,
    peering: Annotated[
        str | None, typer.Option(help="kopf peering object: replicas share it, one is active")
    ] = None,
    standalone: Annotated[bool, typer.Option(help="Run without peering")] = False,
    peering_lifetime: Annotated[
        int,
        typer.Option(
            min=10,
            max=3600,
            help="Seconds a peer's record lives without a heartbeat (how long a standby waits "
            "before taking over from a replica that died)",
        ),
    ] = 60,
    resync: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Seconds between safety-net reconciles of a service nothing changed about "
            "(changes are reconciled at once, from watch events)",
        ),
    ] = 600.0,
    workers: Annotated[
        int, typer.Option(min=1, max=64, help="Reconciles that may run at the same time")
    ] = 16,  # kvq.handlers.controller.DEFAULT_WORKERS (not imported: kopf loads slowly)
    grace: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Seconds a service waits for a pool that cannot run it now (NotReady, full, "
            "scaled to zero, replicas unschedulable) before it moves or falls back",
        ),
    ] = 300.0,
    suspect_restarts: Annotated[
        int,
        typer.Option(
            min=1,
            max=20,
            help="Unknown start-up crashes with the same error before a quantized dtype is "
            "left (errors that name the dtype fall back at once)",
        ),
    ] = 3,
    retry_after: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Seconds before a dtype left after unknown crashes is tried again (doubles "
            "each time, up to --retry-after-max)",
        ),
    ] = 3600.0,
    retry_after_max: Annotated[float, typer.Option(min=1.0)] = 86400.0,
    max_retries: Annotated[
        int, typer.Option(min=0, max=20, help="Retries of such a dtype before it is given up")
    ] = 3,
    metrics_port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port of /metrics (0: off)")
    ] = 8080,
    liveness: Annotated[
        str | None, typer.Option(help="Liveness endpoint, e.g. http://0.0.0.0:8081/healthz")
    ] = None,
    verbose: Annotated[bool, typer.Option(help="Also log every kopf handler pass")] = False,
    prometheus_url: Annotated[
        str | None,
        typer.Option(
            envvar="KVQ_PROMETHEUS_URL",  # a URL with credentials can come from a Secret
            help="Prometheus that scrapes the engines (series labelled namespace and service); "
            "its KV cache usage, requests and KV capacity go into status.metrics",
        ),
    ] = None,
    metrics_interval: Annotated[
        float, typer.Option(min=1.0, help="Least seconds between status.metrics writes")
    ] = 60.0,
    autoscaling_prometheus_url: Annotated[
        str | None,
        typer.Option(
            help="Prometheus URL that KEDA uses for autoscaled services (default: "
            "--prometheus-url without its credentials)"
        ),
    ] = None,
    operator_image: Annotated[
        str,
        typer.Option(
            help="kvq's own image: the model download (kvq fetch) and quality probes "
            "(kvq probe) run it"
        ),
    ] = "kvq/operator:0.1.0",
    autoscaling_authentication: Annotated[
        str | None,
        typer.Option(
            help="KEDA ClusterTriggerAuthentication with Prometheus' credentials, by name"
        ),
    ] = None,
    pool_label: Annotated[
        list[str] | None,
        typer.Option(
            "--pool-label",
            help="Node label that names a GPU pool, tried in order (repeat); default: "
            "kvq.dev/pool, karpenter.sh/nodepool, cloud.google.com/gke-nodepool, "
            "eks.amazonaws.com/nodegroup, kubernetes.azure.com/agentpool",
        ),
    ] = None,
) -> None:
    """Run the operator: reconcile InferenceServices until stopped."""
    from datetime import timedelta

    from kvq.fallback.ladder import LadderPolicy
    from kvq.handlers.operator import RunOptions
    from kvq.handlers.operator import run as run_operator

    if bool(namespace) == all_namespaces:
        _fail("give --namespace (one or more) or --all-namespaces")
    if peering and standalone:
        _fail("--peering and --standalone exclude each other")
    run_operator(
        RunOptions(
            namespaces=tuple(namespace or ()),
            all_namespaces=all_namespaces,
            peering=peering,
            standalone=standalone,
            resync=resync,
            workers=workers,
            peering_lifetime=peering_lifetime,
            metrics_port=metrics_port,
            liveness=liveness,
            verbose=verbose,
            prometheus_url=prometheus_url,
            metrics_interval=metrics_interval,
            pool_labels=tuple(pool_label or ()),
            autoscaling_prometheus_url=autoscaling_prometheus_url,
            autoscaling_authentication=autoscaling_authentication,
            operator_image=operator_image,
            ladder=LadderPolicy(
                suspect_repeats=suspect_restarts,
                retry_after=timedelta(seconds=retry_after),
                retry_after_max=timedelta(seconds=max(retry_after_max, retry_after)),
                max_retries=max_retries,
                grace=timedelta(seconds=grace),
            ),
        )
    )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
