#!/usr/bin/env python3
"""`make test-gpu`: kvq's rendered vLLM command on this machine's NVIDIA GPU.

    run.py [--shapes a,b:len=32768,c:layers=24,d:tp=4,e:tp=2:pp=2] [--dtypes auto,fp8]
           [--max-model-len N] [--layers N] [--load llama-3-8b/auto ...] [--out DIR]
    run.py --dry-run [--gpu-name "NVIDIA H200" --gpu-memory-mib 143771 --gpu-count 8]
    run.py report RUN.json [RUN.json ...] --out e2e/gpu/results [--keep-plan]
    run.py offload [--dry-run --gpu-name "NVIDIA H200" --gpu-memory-mib 143771] [--out DIR]
    run.py probe --model-dir DIR [--dtypes fp8,int8] [--dry-run --gpu-name ...] [--out DIR]

Needs vLLM importable by `--python` (the offline bundle: e2e/gpu/README.md) and kvq on
PYTHONPATH (operator/). Writes <out>/<date>-<gpu>[-label].json and .md, the engine logs
and termination messages under <out>/logs-<label>/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# kvq from PYTHONPATH when set there (a snapshot), else this checkout.
sys.path.append(str(HERE.parents[1] / "operator"))

from gputier import report  # noqa: E402
from gputier.gpu import GpuInfo, detect_gpus  # noqa: E402
from gputier.load import LoadSpec  # noqa: E402
from gputier.points import DTYPES, MAX_MODEL_LEN, PointError, PointKey  # noqa: E402
from gputier.shapes import DEFAULT_SHAPES  # noqa: E402
from gputier.tier import TierConfig, dry_run, parse_points, run_tier, write_json  # noqa: E402

DEFAULT_LOAD = ("llama-3-8b/auto", "llama-3-8b/fp8", "llama-3-8b/int8")


def _csv(text: str) -> tuple[str, ...]:
    return tuple(t for t in (s.strip() for s in text.split(",")) if t)


def tier_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="run.py", description="kvq's GPU tier")
    parser.add_argument(
        "--shapes",
        type=_csv,
        default=DEFAULT_SHAPES,
        help="catalog names, each optionally :len=N, :layers=N, :tp=N (tensor parallel) and "
        ":pp=N (pipeline stages) (gemma-3-1b:len=32768, llama-3.1-70b:tp=4)",
    )
    parser.add_argument("--dtypes", type=_csv, default=DTYPES)
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=MAX_MODEL_LEN,
        help="spec.memory.maxModelLen of every shape without :len=",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=None,
        help="serve the first N layers (the same layer pattern, every expert) of every shape "
        "without :layers= (a model too big for the GPU in bf16)",
    )
    parser.add_argument(
        "--load",
        nargs="*",
        default=list(DEFAULT_LOAD),
        help="shape/dtype points that also run the load",
    )
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--prompt-tokens", type=int, default=3000)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--python", default="python3", help="the image's python (vLLM)")
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=540.0,
        help="no new point starts when it would end past this",
    )
    parser.add_argument(
        "--start-deadline-s", type=float, default=240.0, help="a start slower than this fails"
    )
    parser.add_argument(
        "--point-budget-s",
        type=float,
        default=75.0,
        help="what one point takes (start, probe, stop): none starts with less left",
    )
    parser.add_argument("--label", default="", help="suffix of the result files")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument(
        "--skip-done",
        nargs="*",
        type=Path,
        default=[],
        help="result JSONs of earlier runs: their finished points are skipped",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--gpu-name", help="with --dry-run: the GPU nvidia-smi would name")
    parser.add_argument("--gpu-memory-mib", type=int, default=None)
    parser.add_argument(
        "--gpu-count", type=int, default=1, help="with --dry-run: the GPUs nvidia-smi would list"
    )
    args = parser.parse_args(argv)
    try:
        return _tier(args)
    except (PointError, ValueError) as error:  # a shape spec or a point this machine cannot run
        parser.error(str(error))


def _tier(args: argparse.Namespace) -> int:
    config = TierConfig(
        shapes=args.shapes,
        dtypes=args.dtypes,
        max_model_len=args.max_model_len,
        layers=args.layers,
        load_points=parse_points(args.load),
        load=LoadSpec(args.requests, args.prompt_tokens, args.max_tokens),
        python=args.python,
        deadline_s=args.deadline_s,
        start_deadline_s=args.start_deadline_s,
        point_budget_s=args.point_budget_s,
        label=args.label,
        skip=done_points(args.skip_done),
    )
    if args.gpu_name:
        info = GpuInfo(args.gpu_name, args.gpu_memory_mib or 0, "unknown", args.gpu_count)
    else:
        info = detect_gpus()
    if args.dry_run:
        print("\n".join(dry_run(info, config)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = f"-{args.label}" if args.label else ""
    run_dir = args.out / f"logs{suffix or '-run'}"
    run_dir.mkdir(parents=True, exist_ok=True)
    json_path = args.out / "run-in-progress.json"
    document = run_tier(info, config, run_dir, write_json(json_path))
    stem = free_stem(args.out, report.file_stem(document) + suffix)
    final = args.out / f"{stem}.json"
    json_path.replace(final)
    (args.out / f"{stem}.md").write_text(report.render_markdown(document))
    print(report.render_markdown(document))
    failed = [p for p in document["points"] if str(p.get("verdict", "")).startswith("catalog")]
    off = [p for p in document["points"] if not within_tolerance(p)]
    print(
        f"wrote {final} and {stem}.md; catalog disagreements: {len(failed)}; "
        f"capacity beyond 1%: {len(off)}"
    )
    return 1 if failed or off else 0


def free_stem(out: Path, stem: str) -> str:
    """`stem`, or `stem-2`, `stem-3`... when an earlier run of the same label and day wrote
    its results there: a second run never overwrites the points of the first."""
    candidate, n = stem, 1
    while (out / f"{candidate}.json").exists():
        n += 1
        candidate = f"{stem}-{n}"
    return candidate


def within_tolerance(record: dict[str, object]) -> bool:
    capacity = record.get("capacity")
    if not isinstance(capacity, dict):
        return True
    return bool(capacity.get("within_tolerance", capacity.get("within_2_percent")))


def done_points(paths: list[Path]) -> frozenset[PointKey]:
    """Points an earlier run finished (served, crashed or timed out)."""
    done = set()
    for path in paths:
        if path.exists():
            for record in json.loads(path.read_text())["points"]:
                if record["outcome"] != "not run":
                    done.add(report.point_key(record))
    return frozenset(done)


def report_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="run.py report", description="merge runs, write md")
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--note", action="append", default=[], help="a line for the report")
    parser.add_argument(
        "--keep-plan",
        action="store_true",
        help="keep each point's plan from the time of the run (default: plan it again with "
        "this checkout's kvq.planner from the point's saved config.json and settings)",
    )
    args = parser.parse_args(argv)
    document = report.merge([json.loads(p.read_text()) for p in args.runs])
    if not args.keep_plan:
        from gputier.replan import replan
        from gputier.tier import versions

        document = replan(document, planner_commit=versions()["kvq_commit"])
    document["notes"] = [*document.get("notes", []), *args.note]
    stem = report.file_stem(document)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(document, indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(report.render_markdown(document))
    print(f"wrote {args.out / stem}.json and .md")
    return 0


def _one_gpu_run_options(parser: argparse.ArgumentParser, *, label: str) -> None:
    """The options of a one-GPU run (offload, probe): its files, and a dry run's GPU."""
    parser.add_argument("--label", default=label, help="suffix of the result files")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--gpu-name", help="with --dry-run: the GPU nvidia-smi would name")
    parser.add_argument("--gpu-memory-mib", type=int, default=None)


def _one_gpu(args: argparse.Namespace) -> GpuInfo:
    """The GPU a dry run names, or this machine's."""
    if args.gpu_name:
        return GpuInfo(args.gpu_name, args.gpu_memory_mib or 0, "unknown", 1)
    return detect_gpus()


def offload_main(argv: list[str]) -> int:
    """The CPU tier (memory.swapSpaceGiB) against no tier: gputier/offload.py."""
    from gputier import offload
    from gputier.gpu import pool_for
    from gputier.tier import TierConfig, new_document

    parser = argparse.ArgumentParser(prog="run.py offload", description="kvq's CPU KV tier")
    parser.add_argument("--python", default="python3", help="the image's python (vLLM)")
    parser.add_argument("--deadline-s", type=float, default=540.0)
    _one_gpu_run_options(parser, label="offload")
    args = parser.parse_args(argv)
    info = _one_gpu(args)
    pool = pool_for(info)
    config = offload.OffloadConfig()
    if args.dry_run:
        print("\n".join(offload.dry_run_lines(pool, config, args.python)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    run_dir = args.out / f"logs-{args.label}"
    run_dir.mkdir(parents=True, exist_ok=True)
    json_path = args.out / "offload-in-progress.json"
    document = new_document(info, pool, TierConfig(shapes=(), dtypes=(), label=args.label))
    document = offload.run_offload(
        pool,
        document,
        config,
        run_dir,
        write_json(json_path),
        python=args.python,
        deadline_s=args.deadline_s,
    )
    stem = f"{report.file_stem(document)}-{args.label}"
    final = args.out / f"{stem}.json"
    json_path.replace(final)
    text = "\n".join(offload.markdown(document["offload"]["points"], document["offload"]["load"]))
    (args.out / f"{stem}.md").write_text(text + "\n")
    print(text)
    checks = [p for p in document["offload"]["points"] if p.get("outcome") == "served"]
    bad = [p for p in checks if not (p["log"]["names_connector"] and p["log"]["size_matches"])]
    served = f"served {len(checks)} of {len(config.points)}"
    print(f"wrote {final}; {served}; log checks failed: {len(bad)}")
    return 1 if bad or len(checks) != len(config.points) else 0


def probe_main(argv: list[str]) -> int:
    """`kvq probe` with the trained probe model, auto against quantized caches:
    gputier/probe_quality.py."""
    from gputier import probe_quality
    from gputier.gpu import pool_for
    from gputier.tier import TierConfig, new_document

    parser = argparse.ArgumentParser(prog="run.py probe", description="kvq probe on this GPU")
    parser.add_argument(
        "--model-dir",
        type=Path,
        help="the trained probe model (e2e/engine/train_model.py's cache directory)",
    )
    parser.add_argument("--dtypes", type=_csv, default=probe_quality.ProbeConfig().dtypes)
    parser.add_argument("--python", default="python3", help="the image's python (vLLM)")
    parser.add_argument("--deadline-s", type=float, default=540.0)
    parser.add_argument("--start-deadline-s", type=float, default=300.0)
    _one_gpu_run_options(parser, label="probe")
    args = parser.parse_args(argv)
    if "auto" in args.dtypes:
        parser.error("--dtypes lists the quantized caches; auto is always the baseline")
    info = _one_gpu(args)
    pool = pool_for(info)
    config = probe_quality.ProbeConfig(
        dtypes=args.dtypes,
        python=args.python,
        deadline_s=args.deadline_s,
        start_deadline_s=args.start_deadline_s,
    )
    if args.dry_run:
        print("\n".join(probe_quality.dry_run_lines(pool, config)))
        return 0
    if args.model_dir is None or not (args.model_dir / "config.json").is_file():
        parser.error("--model-dir must be the trained probe model (a directory with config.json)")
    args.out.mkdir(parents=True, exist_ok=True)
    run_dir = args.out / f"logs-{args.label}"
    run_dir.mkdir(parents=True, exist_ok=True)
    json_path = args.out / "probe-in-progress.json"
    document = new_document(info, pool, TierConfig(shapes=(), dtypes=(), label=args.label))
    document["weights"] = f"trained: {args.model_dir.name} (e2e/engine/train_model.py)"
    document = probe_quality.run_probe_quality(
        pool, document, args.model_dir, run_dir, write_json(json_path), config
    )
    stem = free_stem(args.out, f"{report.file_stem(document)}-{args.label}")
    final = args.out / f"{stem}.json"
    json_path.replace(final)
    text = "\n".join(probe_quality.markdown(document["probe"], info.name, document["versions"]))
    (args.out / f"{stem}.md").write_text(text + "\n")
    print(text)
    points = document["probe"]["points"]
    served = [p for p in points if p["outcome"] == "served"]
    print(f"wrote {final}; served {len(served)} of {len(points)}")
    return 0 if served and served[0]["dtype"] == "auto" else 1


def main(argv: list[str]) -> int:
    if argv[:1] == ["report"]:
        return report_main(argv[1:])
    if argv[:1] == ["offload"]:
        return offload_main(argv[1:])
    if argv[:1] == ["probe"]:
        return probe_main(argv[1:])
    return tier_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
