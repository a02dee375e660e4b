"""GLUE metrics, computed locally in numpy exactly as GLUE defines them (no downloads, no scipy/sklearn at runtime).

    glue_metrics("mrpc", predictions, labels)   # {"accuracy": ..., "f1": ..., "combined_score": ...}

| task | metrics |
|---|---|
| cola | Matthews correlation |
| sst2, mnli (matched and mismatched), qnli, rte, wnli | accuracy |
| mrpc, qqp | accuracy and F1 of the positive class (label 1: paraphrase / duplicate) |
| stsb | Pearson and Spearman correlation |

`combined_score` (mean of the task's metrics) is added where a task has two, as transformers' run_glue does. For
MNLI the script evaluates validation_matched and validation_mismatched separately (keys `eval_*` and `eval_mm_*`).
The definitions match scikit-learn's `accuracy_score`, `f1_score`, `matthews_corrcoef` and scipy's `pearsonr`,
`spearmanr` (tests/finetune/test_glue_metrics.py checks them against those), including their degenerate cases:
F1 and MCC are 0.0 when undefined, the correlations are nan for a constant input.
"""

from __future__ import annotations

import numpy as np

TASK_METRICS = {
    "cola": ("matthews_correlation",),
    "sst2": ("accuracy",),
    "mrpc": ("accuracy", "f1"),
    "qqp": ("accuracy", "f1"),
    "stsb": ("pearson", "spearmanr"),
    "mnli": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
}


def accuracy(predictions, labels) -> float:
    """Fraction of predictions equal to their label. predictions, labels: (N,) ints."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    return float((predictions == labels).mean())


def f1_binary(predictions, labels, positive: int = 1) -> float:
    """F1 of the `positive` class: 2 TP / (2 TP + FP + FN); 0.0 when there is no positive prediction nor label."""
    predictions, labels = np.asarray(predictions) == positive, np.asarray(labels) == positive
    true_positives = np.sum(predictions & labels)
    denominator = 2 * true_positives + np.sum(predictions & ~labels) + np.sum(~predictions & labels)
    return float(2 * true_positives / denominator) if denominator else 0.0


def matthews_correlation(predictions, labels) -> float:
    """Matthews correlation coefficient, multiclass form (Gorodkin 2004; binary MCC for two classes).

    From the confusion matrix C: (c·s - Σ_k p_k t_k) / sqrt((s² - Σ p_k²)(s² - Σ t_k²)), with c the correct count,
    s the sample count, p_k / t_k the predicted / true count of class k. 0.0 when a factor of the denominator is 0.
    """
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    classes, encoded = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    true_ids, predicted_ids = encoded[: len(labels)], encoded[len(labels) :]
    true_counts = np.bincount(true_ids, minlength=len(classes)).astype(np.float64)
    predicted_counts = np.bincount(predicted_ids, minlength=len(classes)).astype(np.float64)
    correct = float(np.sum(true_ids == predicted_ids))
    samples = float(len(labels))
    covariance = correct * samples - predicted_counts @ true_counts
    variance_pred = samples**2 - predicted_counts @ predicted_counts
    variance_true = samples**2 - true_counts @ true_counts
    if variance_pred * variance_true == 0:
        return 0.0
    return float(covariance / np.sqrt(variance_pred * variance_true))


def pearson(x, y) -> float:
    """Pearson correlation of two (N,) float arrays; nan when either is constant."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    x, y = x - x.mean(), y - y.mean()
    norm = np.sqrt((x @ x) * (y @ y))
    if norm == 0:
        return float("nan")
    return float(np.clip((x @ y) / norm, -1.0, 1.0))


def average_ranks(values) -> np.ndarray:
    """Ranks 1..N of `values`, ties sharing the mean of their ranks (scipy.stats.rankdata's "average")."""
    values = np.asarray(values)
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    # Start index of each run of equal values, and the run each sorted position belongs to.
    starts = np.flatnonzero(np.concatenate([[True], sorted_values[1:] != sorted_values[:-1]]))
    run_of_position = np.cumsum(np.concatenate([[True], sorted_values[1:] != sorted_values[:-1]])) - 1
    ends = np.append(starts[1:], len(values))
    mean_rank_of_run = (starts + ends + 1) / 2.0  # mean of the 1-based ranks starts+1 .. ends
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = mean_rank_of_run[run_of_position]
    return ranks


def spearman(x, y) -> float:
    """Spearman rank correlation: Pearson correlation of the average ranks."""
    return pearson(average_ranks(x), average_ranks(y))


def glue_metrics(task: str, predictions, labels) -> dict[str, float]:
    """The GLUE metrics of `task`. predictions, labels: (N,) class ids, or (N,) floats for stsb."""
    if task not in TASK_METRICS:
        raise ValueError(f"unknown GLUE task {task!r}; known: {', '.join(TASK_METRICS)}")
    functions = {
        "accuracy": accuracy,
        "f1": f1_binary,
        "matthews_correlation": matthews_correlation,
        "pearson": pearson,
        "spearmanr": spearman,
    }
    result = {name: functions[name](predictions, labels) for name in TASK_METRICS[task]}
    if len(result) > 1:
        result["combined_score"] = float(np.mean(list(result.values())))
    return result
