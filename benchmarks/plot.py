"""Plots of benchmark reports (matplotlib: `pip install posformers[bench]`).

plot_realbatch(report, path)   # realbatch: real tokens/s per model, workload, mode and variant
plot_suite(report, path)       # a model suite (roformer, deberta, littlebird, ...): time and peak memory per
                               # workload and length, one bar per implementation
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MISSING_MATPLOTLIB = "no plot: matplotlib is not installed (pip install 'posformers[bench]' or 'matplotlib>=3.7')"


def plot_realbatch(report: dict[str, Any], path: Path) -> Path:
    """Grouped bars of real tokens/s: one group per model, workload and mode, one bar per variant (none where a variant
    did not run: disentangled-flash outside DeBERTa); a log axis when the rates span more than a factor of 20. Raises
    ImportError with MISSING_MATPLOTLIB when matplotlib is absent."""
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
        ran = [
            (offset, cell["variants"][variant]) for offset, cell in zip(offsets, cells) if variant in cell["variants"]
        ]
        axes.bar([offset for offset, _ in ran], [run["tokens_per_s"] for _, run in ran], width, label=variant)
    rates = [
        cell["variants"][variant]["tokens_per_s"]
        for cell in cells
        for variant in variants
        if variant in cell["variants"]
    ]
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


def plot_suite(report: dict[str, Any], path: Path) -> Path:
    """Two panels of grouped bars for a model suite's report (benchmarks/results/<suite>.json): the median time per
    step with its interquartile range, and the peak memory a step adds; one group per workload and length, one bar
    per implementation (posformers first). Log axes where the values span more than a factor of 20. Raises
    ImportError with MISSING_MATPLOTLIB when matplotlib is absent."""
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(MISSING_MATPLOTLIB) from error

    rows = report["results"]
    models = [report["candidate"], *report["references"]]
    width = 0.8 / len(models)
    figure = Figure(figsize=(max(6.0, 1.0 * len(rows) * max(1, len(models) / 2)), 6.5), layout="constrained")
    time_axes, memory_axes = figure.subplots(2, 1)
    for index, model in enumerate(models):
        offsets = [position + (index - (len(models) - 1) / 2) * width for position in range(len(rows))]
        runs = [row["models"].get(model) for row in rows]
        medians = [run["median_ms"] if run else 0.0 for run in runs]
        spread = [
            [run["median_ms"] - run["q1_ms"] if run else 0.0 for run in runs],
            [run["q3_ms"] - run["median_ms"] if run else 0.0 for run in runs],
        ]
        time_axes.bar(offsets, medians, width, yerr=spread, capsize=2, label=model)
        memory_axes.bar(offsets, [(run or {}).get("peak_mem_mib") or 0.0 for run in runs], width, label=model)
    labels = [f"{row['workload']}\n{row['seq_len']} x {row['batch']}" for row in rows]
    env = report["environment"]
    for axes, unit in ((time_axes, "ms per step (median, IQR)"), (memory_axes, "peak MiB a step adds")):
        values = [bar.get_height() for bar in axes.patches if bar.get_height() > 0]
        if values and max(values) > 20 * min(values):
            axes.set_yscale("log")
        axes.set_xticks(range(len(rows)))
        axes.set_xticklabels(labels, fontsize=8)
        axes.set_ylabel(unit)
        axes.grid(axis="y", alpha=0.3)
    time_axes.legend(fontsize=8)
    time_axes.set_title(
        f"{report['suite']}: {env['device']}, {env['dtype']}, {env['torch_threads']} threads (lower is better)"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path
