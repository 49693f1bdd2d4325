"""`kvq probe`: answer quality of a served model against its KV cache."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvq.cli.console import err, fail


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
        fail(f"--suite takes a comma-separated list of {', '.join(SUITES)}")
    if "agreement" in suites and not baseline_url:
        fail("the agreement suite needs --baseline-url")
    if output not in ("table", "json", "png"):
        fail(f"--output must be table, json or png, not {output!r}")
    try:
        requirements = tuple(parse_requirement(r) for r in require or ())
    except RequirementError as error:
        fail(str(error))
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
            fail(str(error))
    raise typer.Exit({Verdict.PASS: 0, Verdict.FAIL: 1, Verdict.UNKNOWN: 3}[report.verdict])
