"""What a fine-tuning run tells the user: log levels, throughput and time left while training, and results files.

setup_logging(training_args)                      # transformers + datasets verbosity of this process
count_tokens(training_args)                       # let Trainer count tokens, for tokens/s
trainer = Trainer(..., callbacks=[ThroughputCallback()])
    # ThroughputCallback adds samples/s, tokens/s and the remaining time to every training log line
report_metrics(trainer, "eval", metrics)          # <output_dir>/eval_results.json + all_results.json, and a table
"""

from __future__ import annotations

import logging
import math
import time

import datasets
import transformers
from transformers import TrainerCallback, TrainingArguments

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
