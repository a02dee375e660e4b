"""Plots of benchmark reports (matplotlib: `pip install posformers[bench]`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MISSING_MATPLOTLIB = "no plot: matplotlib is not installed (pip install 'posformers[bench]' or 'matplotlib>=3.7')"


def plot_realbatch(report: dict[str, Any], path: Path) -> Path:
    """Grouped bars of real tokens/s: one group per model, workload and mode, one bar per variant; a log axis when the
    rates span more than a factor of 20. Raises ImportError with MISSING_MATPLOTLIB when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(MISSING_MATPLOTLIB) from error

    cells = report["cells"]
    variants = list(report["variants"])
    width = 0.8 / len(variants)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.2 * len(cells)), 4.5))
    for index, variant in enumerate(variants):
        offsets = [position + (index - (len(variants) - 1) / 2) * width for position in range(len(cells))]
        axes.bar(offsets, [cell["variants"][variant]["tokens_per_s"] for cell in cells], width, label=variant)
    rates = [cell["variants"][variant]["tokens_per_s"] for cell in cells for variant in variants]
    if rates and max(rates) > 20 * min(rates):
        axes.set_yscale("log")
    axes.set_xticks(range(len(cells)))
    axes.set_xticklabels([f"{cell['family']}\n{cell['workload']}\n{cell['mode']}" for cell in cells], fontsize=8)
    axes.set_ylabel("real tokens / s")
    env = report["environment"]
    quick = ", quick (tiny models)" if report["options"]["quick"] else ""
    axes.set_title(f"Real mixed-length batches: {env['dtype']}, {env['torch_threads']} CPU threads{quick}")
    axes.legend(fontsize=8)
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
