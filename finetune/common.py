"""What the fine-tuning scripts (run_glue.py, run_qa.py) share: arguments, the output folder, model loading, logging
of throughput, results files and data errors.

API, in the order a script uses it:

    model_args, data_args, run_args, training_args = parse_arguments(
        (ModelArguments, MyDataArguments, RunArguments, TrainingArguments), argv)
        # argv: a list of CLI words, or one .json / .yaml file naming the fields; None reads sys.argv[1:]
    setup_logging(training_args)                      # transformers + datasets verbosity of this process
    checkpoint = prepare_output_dir(training_args, run_args.overwrite_output_dir)
        # -> None or the checkpoint folder to resume from; raises OutputDirError for a folder that holds a
        #    previous run's checkpoints/results when neither --overwrite_output_dir nor --resume_from_checkpoint
        #    is given. `--resume_from_checkpoint True` means "the last checkpoint-N in output_dir".
    config = load_config(model_args, num_labels=2, finetuning_task="sst2")   # pretrained, config.json or scratch
    tokenizer = load_tokenizer(model_args)
    config = fit_config_to_tokenizer(config, tokenizer, model_args)   # from scratch: the tokenizer's vocab size
    model = load_model(model_args, config, AutoModelForSequenceClassification)
        # all through the Auto classes after `import posformers`: RoFormer, DeBERTa and LittleBird (and any
        # transformers model) load the same way; without --model_name_or_path the model is built from the config.
    count_tokens(training_args)                       # let Trainer count tokens, for tokens/s
    training_args.remove_unused_columns = False       # ModelInputsCollator drops what the model does not take
    trainer = Trainer(..., data_collator=ModelInputsCollator(tokenizer, model),
                      callbacks=[ThroughputCallback(), SampleLogCallback()])
        # ThroughputCallback adds samples/s, tokens/s and the remaining time to every training log line
    report_metrics(trainer, "eval", metrics)          # <output_dir>/eval_results.json + all_results.json, and a table

Sample log (for tests of distributed runs): with POSFORMERS_SAMPLE_LOG=<folder> in the environment,
ModelInputsCollator appends the example ids (column "idx") of every batch it builds to <folder>/rank<RANK>.txt, one
line per batch, and SampleLogCallback writes <folder>/rank<RANK>-final.json with the global step and a SHA-256 of the
weights when training ends. Only datasets that keep an "idx" column are logged: the scripts keep it on the training set
and drop it elsewhere, so the log holds exactly the examples each process trained on.

Errors: every problem with the user's input is a `ScriptError`: `OutputDirError`, `ArgumentError`, and
`DataError` from loaders: `DataError(message, path=..., row=..., column=...)`; `str(error)` reads
"train.tsv, line 12, column 'label': message". Where a bad example may be skipped (`--skip_bad_examples`), loaders
hand each error to `BadExamples.add`, which raises it unless skipping is on, and `BadExamples.summary()` says how
many were skipped. Scripts wrap `main` with `exit_on_data_error`, so a user sees one clean line and exit status 1
before any training starts; the wrapper also returns main's metrics to in-process callers (`main([...])`) and None
to the command line.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import datasets
import torch
import transformers
from transformers import (
    AutoConfig,
    AutoTokenizer,
    DataCollatorWithPadding,
    HfArgumentParser,
    TrainerCallback,
    TrainingArguments,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

import posformers  # noqa: F401  (registers the posformers model types with the Auto classes)

logger = logging.getLogger(__name__)

# What a finished or interrupted run leaves in its output folder: writing a new run over these loses them.
RUN_ARTIFACTS = ("config.json", "model.safetensors", "pytorch_model.bin", "trainer_state.json", "all_results.json")
_CHECKPOINT_DIR = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-\d+$")


# ---------------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------------


class ScriptError(Exception):
    """A problem with what the user gave the script; `exit_on_data_error` turns it into one line and exit status 1."""


class DataError(ScriptError):
    """Bad input data, reported with where it is: file, row (line number in a text file, index otherwise), column."""

    def __init__(self, message: str, *, path=None, row: int | None = None, column: str | None = None):
        self.message, self.path, self.row, self.column = message, path, row, column
        super().__init__(str(self))

    def __str__(self) -> str:
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.row is not None:
            where.append(f"line {self.row}" if self.path is not None else f"row {self.row}")
        if self.column is not None:
            where.append(f"column {self.column!r}")
        return f"{', '.join(where)}: {self.message}" if where else self.message


class OutputDirError(ScriptError):
    """The output folder cannot be used as asked (it holds a previous run, or the checkpoint to resume is missing)."""


class ArgumentError(ScriptError):
    """Arguments that cannot work together (no model or config given, a config.json without model_type, ...)."""


def exit_on_data_error(main: Callable) -> Callable:
    """Wrap a script's `main(argv=None)` so that a ScriptError (DataError, OutputDirError, ArgumentError) ends it with
    one line on stderr and exit status 1, and what main returns (its metrics) reaches in-process callers that pass
    argv, while the command line (argv None) gets None, i.e. exit status 0."""

    @functools.wraps(main)
    def wrapper(argv: list[str] | None = None):
        try:
            result = main(argv)
        except ScriptError as error:
            kind = {DataError: "data", OutputDirError: "output_dir", ArgumentError: "arguments"}.get(type(error), "")
            raise SystemExit(f"error ({kind}): {error}" if kind else f"error: {error}") from error
        # A console script runs `sys.exit(main())`, which reports any returned object but None as a failure: the
        # metrics go back only to callers that passed argv in-process.
        return None if argv is None else result

    return wrapper


class BadExamples:
    """Collects bad examples of one split: raises the first one, or counts them when skipping is on.

    bad = BadExamples(skip=data_args.skip_bad_examples, split="train")
    for ...:
        try: ...
        except DataError as error: bad.add(error); continue
    logger.warning(bad.summary())   # "train: skipped 3 bad examples; first: train.tsv, line 7: ..."
    """

    def __init__(self, skip: bool, split: str):
        self.skip, self.split = skip, split
        self.errors: list[DataError] = []

    def add(self, error: DataError) -> None:
        if not self.skip:
            raise error
        self.errors.append(error)

    def __len__(self) -> int:
        return len(self.errors)

    def summary(self) -> str:
        if not self.errors:
            return f"{self.split}: no bad examples"
        return f"{self.split}: skipped {len(self.errors)} bad example(s); first: {self.errors[0]}"


# ---------------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ModelArguments:
    """Which model, config and tokenizer to fine-tune (names as in transformers' example scripts)."""

    model_name_or_path: str | None = dataclasses.field(
        default=None,
        metadata={"help": "Pretrained model (folder or Hub repo id). Leave out to train from scratch from a config."},
    )
    config_name: str | None = dataclasses.field(
        default=None,
        metadata={"help": "Config to use instead of the model's: a folder, a Hub repo id or a config.json file."},
    )
    model_type: str | None = dataclasses.field(
        default=None,
        metadata={"help": "Train from scratch with this model_type's default config (e.g. posformers-roformer)."},
    )
    config_overrides: str | None = dataclasses.field(
        default=None,
        metadata={"help": "Config fields to change, e.g. 'hidden_size=64,num_hidden_layers=2' (scratch or not)."},
    )
    tokenizer_name: str | None = dataclasses.field(
        default=None, metadata={"help": "Tokenizer folder or repo id, if not the model's."}
    )
    cache_dir: str | None = dataclasses.field(
        default=None, metadata={"help": "Where downloaded models and datasets are stored."}
    )
    model_revision: str = dataclasses.field(
        default="main", metadata={"help": "Model version on the Hub: branch, tag or commit."}
    )
    token: str | None = dataclasses.field(default=None, metadata={"help": "Hub token (default: the cached login)."})
    trust_remote_code: bool = dataclasses.field(
        default=False, metadata={"help": "Allow code from the model/dataset repo to run (only for repos you trust)."}
    )
    ignore_mismatched_sizes: bool = dataclasses.field(
        default=False, metadata={"help": "Load a checkpoint whose head has another number of labels (re-initialised)."}
    )


@dataclasses.dataclass
class RunArguments:
    """Script options that TrainingArguments does not have (transformers 5 removed `overwrite_output_dir`)."""

    overwrite_output_dir: bool = dataclasses.field(
        default=False,
        metadata={"help": "Write into an output_dir that already holds a previous run's checkpoints or results."},
    )
    skip_bad_examples: bool = dataclasses.field(
        default=False, metadata={"help": "Skip malformed examples (and say how many) instead of stopping."}
    )


def parse_arguments(dataclass_types: Iterable[type], argv: list[str] | None = None) -> tuple:
    """HfArgumentParser over `dataclass_types`; `argv` may be CLI words or a single .json / .yaml file."""
    parser = HfArgumentParser(tuple(dataclass_types))
    argv = sys.argv[1:] if argv is None else [str(word) for word in argv]
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(json_file=os.path.abspath(argv[0]))
    if len(argv) == 1 and argv[0].endswith((".yaml", ".yml")):
        return parser.parse_yaml_file(yaml_file=os.path.abspath(argv[0]))
    return parser.parse_args_into_dataclasses(args=argv)


def setup_logging(training_args: TrainingArguments) -> None:
    """Log to stdout at this process's level (--log_level for the main process, --log_level_replica for the others)."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    level = training_args.get_process_log_level()
    logger.setLevel(level)
    logging.getLogger("posformers").setLevel(level)
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)


# ---------------------------------------------------------------------------------------------------------------------
# Output folder and resuming
# ---------------------------------------------------------------------------------------------------------------------


def previous_run_artifacts(output_dir) -> list[str]:
    """Names in `output_dir` that a previous run left there (checkpoints, weights, results, trainer state)."""
    path = Path(output_dir)
    if not path.is_dir():
        return []
    return sorted(
        entry.name
        for entry in path.iterdir()
        if entry.name in RUN_ARTIFACTS
        or entry.name.endswith("_results.json")
        or (entry.is_dir() and _CHECKPOINT_DIR.match(entry.name))
    )


def resolve_checkpoint(resume_from_checkpoint: str | None, output_dir) -> str | None:
    """`--resume_from_checkpoint` as given ("True"/"1": the last checkpoint-N in output_dir) -> a folder or None."""
    if resume_from_checkpoint is None or str(resume_from_checkpoint).lower() in ("false", "0", ""):
        return None
    if str(resume_from_checkpoint).lower() in ("true", "1"):
        last = get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
        if last is None:
            raise OutputDirError(f"--resume_from_checkpoint True: no checkpoint-N folder in {output_dir}")
        return last
    if not Path(resume_from_checkpoint).is_dir():
        raise OutputDirError(f"--resume_from_checkpoint {resume_from_checkpoint}: no such folder")
    return str(resume_from_checkpoint)


def prepare_output_dir(training_args: TrainingArguments, overwrite_output_dir: bool = False) -> str | None:
    """Check that this run may write into `training_args.output_dir`; return the checkpoint to resume from, if any.

    A folder holding a previous run is only written into when the user says how: resume it (`--resume_from_checkpoint
    True` or a path) or overwrite it (`--overwrite_output_dir`; files are replaced as the new run writes them, nothing
    is deleted). Only a training run is checked: evaluating or predicting with a trained folder as output_dir adds
    results beside the model, which is what the user asked for.
    """
    if training_args.output_dir is None:
        raise OutputDirError("--output_dir is required")
    checkpoint = resolve_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    training_args.resume_from_checkpoint = checkpoint
    found = previous_run_artifacts(training_args.output_dir)
    if training_args.do_train and found and checkpoint is None and not overwrite_output_dir:
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        raise OutputDirError(
            f"{training_args.output_dir} already holds a previous run ({shown}). Pass --resume_from_checkpoint True "
            "to continue it, --overwrite_output_dir to train over it, or choose another --output_dir."
        )
    if checkpoint is not None:
        logger.info("resuming from %s", checkpoint)
    return checkpoint


# ---------------------------------------------------------------------------------------------------------------------
# Config, tokenizer, model
# ---------------------------------------------------------------------------------------------------------------------


def _hub_kwargs(model_args: ModelArguments) -> dict:
    return {
        "cache_dir": model_args.cache_dir,
        "revision": model_args.model_revision,
        "token": model_args.token,
        "trust_remote_code": model_args.trust_remote_code,
    }


def config_class_for(model_type: str | None, source: str):
    """The config class registered for `model_type` (posformers' three are registered on import)."""
    if model_type not in CONFIG_MAPPING:
        known = ", ".join(sorted(name for name in CONFIG_MAPPING if "posformers" in name or name == "littlebird"))
        raise ArgumentError(f"{source}: unknown model_type {model_type!r} (posformers types: {known}, ...)")
    return CONFIG_MAPPING[model_type]


def load_config(model_args: ModelArguments, **config_kwargs):
    """The model config: --config_name (folder, repo or config.json file), else the model's, else --model_type's
    defaults; then --config_overrides. `config_kwargs` (num_labels, finetuning_task, ...) are set on it."""
    if model_args.config_name and Path(model_args.config_name).is_file():
        config_dict = json.loads(Path(model_args.config_name).read_text(encoding="utf-8"))
        config = config_class_for(config_dict.get("model_type"), model_args.config_name).from_dict(
            config_dict, **config_kwargs
        )
    elif model_args.config_name or model_args.model_name_or_path:
        name = model_args.config_name or model_args.model_name_or_path
        config = AutoConfig.from_pretrained(name, **config_kwargs, **_hub_kwargs(model_args))
    elif model_args.model_type:
        # A new config takes the overrides as constructor arguments, so that the fields derived from them in
        # __post_init__ follow (embedding_size from hidden_size, ...) and the config's own checks see them.
        config_class = config_class_for(model_args.model_type, "--model_type")
        overrides = parse_overrides(config_class, model_args.config_overrides)
        try:
            return config_class(**{**config_kwargs, **overrides})
        except ValueError as error:
            raise ArgumentError(f"--model_type {model_args.model_type} --config_overrides: {error}") from error
    else:
        raise ArgumentError("give --model_name_or_path, --config_name or --model_type")
    if model_args.config_overrides:
        for key, value in parse_overrides(type(config), model_args.config_overrides).items():
            setattr(config, key, value)
    return config


def parse_overrides(config_class, overrides: str | None) -> dict:
    """'hidden_size=64,hidden_act=gelu' -> {"hidden_size": 64, "hidden_act": "gelu"}, typed like the config's fields."""
    if not overrides:
        return {}
    probe = config_class()
    try:
        probe.update_from_string(overrides)
    except ValueError as error:
        raise ArgumentError(f"--config_overrides {overrides!r}: {error}") from error
    keys = [item.split("=", 1)[0].strip() for item in overrides.split(",") if item.strip()]
    return {key: getattr(probe, key) for key in keys}


def load_tokenizer(model_args: ModelArguments):
    """AutoTokenizer from --tokenizer_name or the model; training from scratch needs --tokenizer_name."""
    name = model_args.tokenizer_name or model_args.model_name_or_path
    if name is None:
        raise ArgumentError("training from scratch needs --tokenizer_name (a tokenizer folder or repo id)")
    return AutoTokenizer.from_pretrained(name, **_hub_kwargs(model_args))


def fit_config_to_tokenizer(config, tokenizer, model_args: ModelArguments):
    """A model built from scratch gets the tokenizer's vocabulary size and padding id (unless --config_overrides set
    them): a config's defaults (RoFormer's 50,000 Chinese words) are not the tokenizer's (BERT's 30,522)."""
    if model_args.model_name_or_path is not None:
        return config
    overridden = set(parse_overrides(type(config), model_args.config_overrides)) if model_args.model_type else set()
    if "vocab_size" not in overridden and config.vocab_size != len(tokenizer):
        logger.info("vocab_size %d -> %d, the tokenizer's", config.vocab_size, len(tokenizer))
        config.vocab_size = len(tokenizer)
    if "pad_token_id" not in overridden and tokenizer.pad_token_id is not None:
        config.pad_token_id = tokenizer.pad_token_id
    return config


def load_model(model_args: ModelArguments, config, auto_class):
    """`auto_class` (e.g. AutoModelForSequenceClassification) from --model_name_or_path, or a new model from config."""
    if model_args.model_name_or_path is None:
        logger.info("training a new %s from scratch", config.model_type)
        return auto_class.from_config(config, trust_remote_code=model_args.trust_remote_code)
    return auto_class.from_pretrained(
        model_args.model_name_or_path,
        config=config,
        ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
        **_hub_kwargs(model_args),
    )


# ---------------------------------------------------------------------------------------------------------------------
# Throughput and results
# ---------------------------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------------------------
# Batches and the per-process sample log
# ---------------------------------------------------------------------------------------------------------------------

SAMPLE_LOG_ENV = "POSFORMERS_SAMPLE_LOG"
LABEL_KEYS = frozenset({"label", "labels", "label_ids"})


def process_rank() -> int:
    """This process's global rank under torchrun / accelerate launch (0 when not distributed)."""
    return int(os.environ.get("RANK", "0"))


def weights_digest(model) -> str:
    """SHA-256 over the model's state dict (names, dtypes, shapes and bytes, in name order)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class ModelInputsCollator:
    """Pads features into a batch and keeps only what `model.forward` takes (plus the label).

    It does the job of Trainer's `remove_unused_columns` (run the Trainer with that off) so that it can first take the
    example-id column out of the features and, with POSFORMERS_SAMPLE_LOG set, record which examples this process
    batched. Features: dicts of lists (input_ids, attention_mask, token_type_ids, label, idx, ...).
    """

    def __init__(self, tokenizer, model, pad_to_multiple_of: int | None = None, id_column: str = "idx"):
        self.pad = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)
        self.accepted = set(inspect.signature(model.forward).parameters) | LABEL_KEYS
        self.id_column = id_column
        self.log_dir = os.environ.get(SAMPLE_LOG_ENV)

    def __call__(self, features: list[dict]) -> dict:
        ids = [feature[self.id_column] for feature in features if self.id_column in feature]
        if ids and self.log_dir:
            with open(Path(self.log_dir) / f"rank{process_rank()}.txt", "a", encoding="utf-8") as log:
                log.write(" ".join(str(i) for i in ids) + "\n")
        kept = [{key: value for key, value in feature.items() if key in self.accepted} for feature in features]
        return self.pad(kept)


class SampleLogCallback(TrainerCallback):
    """With POSFORMERS_SAMPLE_LOG set: at the end of training, write this process's step and weights digest."""

    def on_train_end(self, args, state, control, model=None, **kwargs):
        log_dir = os.environ.get(SAMPLE_LOG_ENV)
        if not log_dir or model is None:
            return
        report = {"rank": process_rank(), "global_step": state.global_step, "weights_sha256": weights_digest(model)}
        (Path(log_dir) / f"rank{process_rank()}-final.json").write_text(json.dumps(report), encoding="utf-8")
