"""What a fine-tuning run tells the user: log levels, throughput and time left while training, and results files.

setup_logging(training_args)                      # transformers + datasets verbosity of this process
count_tokens(training_args)                       # let Trainer count tokens, for tokens/s
trainer = Trainer(..., callbacks=[ThroughputCallback()])
    # ThroughputCallback adds samples/s, tokens/s and the remaining time to every training log line
report_metrics(trainer, "eval", metrics)          # <output_dir>/eval_results.json + all_results.json, and a table
finish_run(trainer, results, card)                # run_stages' last step, in every script:
    # <output_dir>/training_curves.png: loss and the evaluation metrics against the step (plot_training_curves;
    #     matplotlib is optional: without it, one log line says so)
    # <output_dir>/README.md: Trainer's card with a model-index naming the task, the dataset and every evaluated
    #     metric, a results table and the curves (write_model_card); --push_to_hub uploads this card
"""

from __future__ import annotations

import functools
import logging
import math
import re
import time
from pathlib import Path

import datasets
import transformers
import yaml
from transformers import TrainerCallback, TrainingArguments
from transformers.modelcard import TASK_TAG_TO_NAME_MAPPING, TrainingSummary

from posformers._extras import install_hint
from posformers.integrations import hub

logger = logging.getLogger(__name__)


def setup_logging(training_args: TrainingArguments) -> None:
    """Log to stdout at this process's level (--log_level for the main process, --log_level_replica for the others)."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    level = training_args.get_process_log_level()
    logger.setLevel(level)
    logging.getLogger("posformers").setLevel(level)
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)


def format_duration(seconds: float) -> str:
    """12345.6 -> '3:25:46'."""
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ThroughputCallback(TrainerCallback):
    """Adds speed and the time left to every training log line (and so to the progress bar's printout).

    Keys: `samples_per_second` and `tokens_per_second` (since this session began; tokens need Trainer's
    `include_num_input_tokens_seen`, and Trainer versions that log `train_tokens_per_second` themselves keep theirs),
    `eta_seconds` and `eta` ("h:mm:ss") for the remaining steps at that pace.
    Speeds count all processes: samples are steps x per-device batch x accumulation x world size.
    """

    def __init__(self):
        self._start_time = None
        self._start_step = 0
        self._start_tokens = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self._start_time = time.perf_counter()
        self._start_step = state.global_step  # non-zero when resuming
        self._start_tokens = state.num_input_tokens_seen or 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "loss" in logs:
            # Counting tokens, Trainer adds `train_runtime` (the time so far) to every training log line. Its model
            # card reads the first log entry holding that key as the end of training and drops every evaluation
            # after it from the card's "Training results", so only the final summary (`train_loss`) keeps the key.
            logs.pop("train_runtime", None)
            if state.log_history and "loss" in state.log_history[-1]:
                state.log_history[-1].pop("train_runtime", None)
        if logs is None or self._start_time is None or "loss" not in logs:
            return  # only training log lines: eval and final-summary lines carry their own speed metrics
        elapsed = time.perf_counter() - self._start_time
        steps = state.global_step - self._start_step
        if elapsed <= 0 or steps <= 0:
            return
        samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        logs["samples_per_second"] = round(steps * samples_per_step / elapsed, 3)
        tokens = (state.num_input_tokens_seen or 0) - self._start_tokens
        if tokens > 0 and "train_tokens_per_second" not in logs:  # Trainer's own figure, where it gives one
            logs["tokens_per_second"] = round(tokens / elapsed, 1)
        remaining = max(state.max_steps - state.global_step, 0) * elapsed / steps
        logs["eta_seconds"] = round(remaining, 1)
        logs["eta"] = format_duration(remaining)


def metrics_table(metrics: dict, title: str = "") -> str:
    """A two-column text table of `metrics`, floats to 4 decimals, runtimes as h:mm:ss."""
    rows = []
    for key in sorted(metrics):
        value = metrics[key]
        if key.endswith("_runtime"):
            value = format_duration(value)
        elif isinstance(value, float):
            value = "nan" if math.isnan(value) else f"{value:.4f}"
        rows.append((key, str(value)))
    width = max([len(key) for key, _ in rows] + [len(title)])
    lines = [f"***** {title} *****"] if title else []
    lines += [f"  {key:<{width}} = {value}" for key, value in rows]
    return "\n".join(lines)


def report_metrics(trainer, split: str, metrics: dict) -> None:
    """Write `<output_dir>/<split>_results.json` (and all_results.json) and print the table, on the main process."""
    trainer.save_metrics(split, metrics)
    if trainer.is_world_process_zero():
        print(metrics_table(metrics, f"{split} metrics"), flush=True)


def count_tokens(training_args: TrainingArguments) -> None:
    """Have Trainer count the non-padding tokens it trains on (for tokens/s), unless the user chose a mode."""
    if training_args.include_num_input_tokens_seen == "no":
        training_args.include_num_input_tokens_seen = "non_padding"


# ---------------------------------------------------------------------------------------------------------------------
# The end of a run: training curves and the model card
# ---------------------------------------------------------------------------------------------------------------------

CURVES_FILE = "training_curves.png"
# Evaluation keys that are not quality metrics: speeds, counts, and the loss (drawn with the training loss).
_NOT_METRICS = re.compile(r"(_runtime|_per_second|_samples|_loss|_number|^epoch|^step|_thresh|_total)$")
MAX_METRIC_PANELS = 4


def curve_metrics(log_history: list[dict]) -> list[str]:
    """The evaluation metrics worth a curve: numeric `eval_*` keys that are not speeds, counts or the loss, nor
    per-class breakdowns (upper-case names: NER's eval_PER_f1, ...), at most MAX_METRIC_PANELS in logged order."""
    names = []
    for entry in log_history:
        for key, value in entry.items():
            if (
                key.startswith("eval_")
                and isinstance(value, (int, float))
                and not _NOT_METRICS.search(key)
                and key == key.lower()
                and key not in names
            ):
                names.append(key)
    return names[:MAX_METRIC_PANELS]


def plot_training_curves(log_history: list[dict], path) -> Path | None:
    """Draw the training loss (and eval_loss) and each evaluation metric against the step into `path` (a PNG).

    Returns the path, or None when there is nothing to draw or matplotlib is not installed (then one log line says
    so: matplotlib is optional, the `plots` extra).
    """
    losses = [(entry["step"], entry["loss"]) for entry in log_history if "loss" in entry and "step" in entry]
    evaluations = [entry for entry in log_history if "step" in entry and any(k.startswith("eval_") for k in entry)]
    if not losses and not evaluations:
        return None
    try:
        from matplotlib.figure import Figure  # the object API: no pyplot, no global backend to choose
    except ImportError:
        logger.warning("matplotlib is not installed: no %s (the plots extra: %s)", CURVES_FILE, install_hint("plots"))
        return None
    metrics = curve_metrics(evaluations)
    figure = Figure(figsize=(4.2 * (1 + len(metrics)), 3.4), layout="constrained")
    axes = figure.subplots(1, 1 + len(metrics), squeeze=False)[0]
    eval_losses = [(entry["step"], entry["eval_loss"]) for entry in evaluations if "eval_loss" in entry]
    for points, label, style in ((losses, "training loss", "-"), (eval_losses, "evaluation loss", "o-")):
        if points:
            axes[0].plot(*zip(*points), style, label=label, markersize=4)
    axes[0].set(title="loss", xlabel="step")
    axes[0].legend()
    for axis, name in zip(axes[1:], metrics):
        points = [(entry["step"], entry[name]) for entry in evaluations if name in entry]
        axis.plot(*zip(*points), "o-", color="tab:green", markersize=4)
        axis.set(title=name.removeprefix("eval_"), xlabel="step")
    for axis in axes:
        axis.grid(alpha=0.3)
    path = Path(path)
    figure.savefig(path, dpi=100)
    return path


def card_metrics(results: dict, prefix: str) -> dict[str, float]:
    """The `prefix_*` quality metrics of a run's results ({"f1": 0.91, ...}): no loss, speeds, counts, per-class
    breakdowns (NER's upper-case PER_f1, ...) nor MNLI's mismatched eval_mm_* under "eval"."""
    return {
        key.removeprefix(f"{prefix}_"): value
        for key, value in results.items()
        if key.startswith(f"{prefix}_")
        and not (prefix == "eval" and key.startswith("eval_mm_"))
        and isinstance(value, (int, float))
        and not _NOT_METRICS.search(key)
        and key == key.lower()
    }


def results_table(results: dict) -> str:
    """A markdown table of the evaluation (and test) metrics of a run, one row per metric."""
    rows = []
    for prefix, split in (("eval", "evaluation"), ("eval_mm", "evaluation (mismatched)"), ("predict", "test")):
        rows += [f"| {split} | {name} | {value:.4f} |" for name, value in card_metrics(results, prefix).items()]
    if not rows:
        return ""
    return "\n".join(["| split | metric | value |", "|---|---|---:|", *rows])


def _dataset_tag(name: str) -> str:
    """A model-index dataset `type` for a dataset name: a Hub id as it is, else a slug ('train.txt, valid.txt' ->
    'train-txt-valid-txt')."""
    if re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name) and not Path(name).exists():
        return name
    return re.sub(r"[^a-z0-9]+", "-", Path(name).name.lower()).strip("-") or "custom"


def model_index(model_name: str, card: dict, metrics: dict[str, float]) -> list[dict]:
    """The Hub's model-index: one result naming the task, the dataset and every evaluated metric (Trainer's own
    keeps only metrics in its short list, which has no exact_match, pearson, ...)."""
    task = card.get("tasks")
    task = task[0] if isinstance(task, list) else task
    result = {
        "task": {"type": task, "name": TASK_TAG_TO_NAME_MAPPING.get(task, task.replace("-", " ").title())},
        "dataset": {"name": card["dataset"], "type": card["dataset_tags"]},
        "metrics": [
            {"name": name.replace("_", " ").title(), "type": name, "value": float(value)}
            for name, value in metrics.items()
        ],
    }
    if card.get("dataset_args"):
        result["dataset"]["args"] = card["dataset_args"]
    return [{"name": model_name, "results": [result] if task and metrics else []}]


def write_model_card(trainer, results: dict, **card) -> Path | None:
    """Write `<output_dir>/README.md` (process 0 only): transformers' Trainer card whose model-index names the task,
    the dataset and every evaluated metric, then a results table and the training curves.

    card: Trainer.create_model_card's arguments (tasks, dataset, dataset_tags, dataset_args, finetuned_from, language,
    tags, model_name, ...). Trainer leaves the model-index without results when the data is local files (no Hub
    dataset tag) or its metrics are not in its short list; here the dataset gets a tag from its name ("custom data"
    when there is none), and the metrics are those of the run's final evaluation (`results`).
    """
    if not trainer.is_world_process_zero():
        return None
    card = {key: value for key, value in card.items() if value}
    base = card.get("finetuned_from")
    card.setdefault("license", hub.default_license(base))  # that of the weights trained on, unless the user chose
    local_base = base if base and Path(base).exists() else None
    if local_base:
        card.pop("finetuned_from")  # a local folder is no Hub model to link to
    card.setdefault("dataset", "custom data")
    card.setdefault("dataset_tags", _dataset_tag(card["dataset"]))
    summary = TrainingSummary.from_trainer(trainer, **card)
    summary.finetuned_from = summary.finetuned_from or None  # a model trained from scratch has "" as its name
    evaluated = card_metrics(results, "eval")
    if evaluated:  # the card's list of results: the final evaluation, in Trainer's naming
        summary.eval_results = {key.replace("_", " ").title(): value for key, value in evaluated.items()}
    metadata = summary.create_metadata()
    metadata["model-index"] = model_index(summary.model_name, {**card, "tasks": summary.tasks}, evaluated)
    metadata["metrics"] = list(evaluated) or metadata.get("metrics", [])
    if card["dataset_tags"] != card["dataset"]:
        metadata.pop("datasets", None)  # local files: their slug is no Hub dataset to link to
    body = summary.to_model_card().split("---\n", 2)[2]  # Trainer's text without its front matter
    if local_base:
        body = body.replace("was trained from scratch on", f"is a fine-tuned version of `{local_base}` on", 1)
    table = results_table(results)
    extra = f"\n## Results\n\n{table}\n" if table else ""
    output_dir = Path(trainer.args.output_dir)
    if (output_dir / CURVES_FILE).is_file():
        extra += f"\n## Training curves\n\n![loss and evaluation metrics against the step]({CURVES_FILE})\n"
    body = body.replace("\n## Model description", extra + "\n## Model description", 1)
    path = output_dir / "README.md"
    path.write_text(f"---\n{yaml.dump(metadata, sort_keys=False)}---\n{body}", encoding="utf-8")
    model = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(model, "create_or_update_model_card"):  # a PEFT model adds its library, base model and version
        model.create_or_update_model_card(str(output_dir))
    return path


def finish_run(trainer, results: dict, card: dict | None) -> None:
    """The end of every script, after its stages: training_curves.png and README.md (the model card) in the output
    folder, on process 0; `trainer.push_to_hub` then uploads this card rather than writing Trainer's own."""
    card = card or {}
    trainer.create_model_card = functools.partial(write_model_card, trainer, results)
    if not trainer.is_world_process_zero() or not (trainer.args.do_train or trainer.args.do_eval):
        return
    output_dir = Path(trainer.args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    plot_training_curves(trainer.state.log_history, output_dir / CURVES_FILE)
    write_model_card(trainer, results, **card)
