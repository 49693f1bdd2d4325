"""`kvq probe` on a terminal: the progress bar (stderr) and the report as tables (stdout)."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvq.probe.report import ProbeReport
from kvq.probe.runner import ProgressSink


class RichProgress(ProgressSink):
    """A progress bar on stderr; silent where stderr is not a terminal (a Job's log)."""

    def __init__(self) -> None:
        self._progress = Progress(
            TextColumn("probe {task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._task = self._progress.add_task("planning", total=None)

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def start(self, total: int) -> None:
        self._progress.update(self._task, total=total, description="requests")

    def advance(self, description: str) -> None:
        self._progress.update(self._task, advance=1, description=description)


def print_report(report: ProbeReport, console: Console | None = None) -> None:
    console = console or Console(width=110)
    cache = report.engine.cache_config
    console.print(
        f"[bold]{report.engine.model}[/] at {report.engine.url}: KV cache "
        f"{cache.cache_dtype if cache else 'unknown'}, block size "
        f"{cache.block_size if cache else 'unknown'}, max_model_len {report.engine.max_model_len}",
        highlight=False,
    )
    needle = report.suites.needle
    if needle is not None:
        table = Table(title=f"needle: exact retrieval (overall {needle.accuracy:.2f})")
        table.add_column("depth")
        for length in needle.lengths:
            table.add_column(f"{length:,} tok", justify="right")
        by_cell = {(c.depth, c.target_tokens): c for c in needle.cells}
        for depth in needle.depths:
            cells = [by_cell.get((depth, n)) for n in needle.lengths]
            table.add_row(
                f"{depth:.0%}",
                *[f"{c.retrieved}/{c.trials}" if c else "-" for c in cells],
            )
        console.print(table)
    scores = Table(title="scores")
    scores.add_column("score")
    scores.add_column("value", justify="right")
    if report.baseline_scores:
        scores.add_column("baseline", justify="right")
    for name, value in report.scores.items():
        row = [name, f"{value:.4g}"]
        if report.baseline_scores:
            base = report.baseline_scores.get(name)
            row.append("-" if base is None else f"{base:.4g}")
        scores.add_row(*row)
    console.print(scores)
    for check in report.checks:
        mark = {True: "ok", False: "FAIL", None: "?"}[check.passed]
        console.print(f"  {mark:>4}  {check.requirement}  (value {check.value})", highlight=False)
    console.print(f"verdict: [bold]{report.verdict}[/] ({report.reason})", highlight=False)
