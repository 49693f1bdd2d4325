"""The needle suite as a picture: retrieval accuracy by depth (rows) and context length.

matplotlib is an optional dependency (`pip install kvq[png]`): the operator image and
the probe Job never draw.
"""

from __future__ import annotations

import math
from pathlib import Path

from kvq.probe.report import ProbeReport


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def accuracy_grid(report: ProbeReport) -> tuple[list[float], list[int], list[list[float]]]:
    """(depths, lengths, accuracy[depth][length]); NaN where a cell was not measured."""
    needle = report.suites.needle
    if needle is None:
        return [], [], []
    by_cell = {(c.depth, c.target_tokens): c.accuracy for c in needle.cells}
    grid = [
        [by_cell.get((depth, length), float("nan")) for length in needle.lengths]
        for depth in needle.depths
    ]
    return needle.depths, needle.lengths, grid


def write_heatmap(report: ProbeReport, path: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never a display
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise PlotUnavailableError("-o png needs matplotlib: pip install 'kvq[png]'") from error

    depths, lengths, grid = accuracy_grid(report)
    if not grid:
        raise ValueError("the report has no needle results to draw")
    cache = report.engine.cache_config
    dtype = cache.cache_dtype if cache and cache.cache_dtype else "unknown"
    figure, axes = plt.subplots(figsize=(1.4 + 1.1 * len(lengths), 1.2 + 0.6 * len(depths)))
    image = axes.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    axes.set_xticks(range(len(lengths)), [f"{n:,}" for n in lengths])
    axes.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    axes.set_xlabel("context length (tokens)")
    axes.set_ylabel("needle depth")
    axes.set_title(f"{report.engine.model or 'model'}: needle retrieval, KV cache {dtype}")
    for row, values in enumerate(grid):
        for column, value in enumerate(values):
            if not math.isnan(value):
                axes.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize=8)
    figure.colorbar(image, ax=axes, label="exact retrieval")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
