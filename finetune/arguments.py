"""The fine-tuning scripts' shared arguments and what they decide before any data is read.

model_args, data_args, run_args, training_args = parse_arguments(
    (ModelArguments, MyDataArguments, RunArguments, TrainingArguments), argv)
    # argv: a list of CLI words, or one .json / .yaml file naming the fields; None reads sys.argv[1:]
checkpoint = prepare_output_dir(training_args, run_args.overwrite_output_dir)
    # -> None or the checkpoint folder to resume from; raises OutputDirError for a folder that holds a
    #    previous run's checkpoints/results when neither --overwrite_output_dir nor --resume_from_checkpoint
    #    is given. `--resume_from_checkpoint True` means "the newest complete checkpoint-N in output_dir".

SplitDataArguments are the data options posformers-ner and posformers-mc share (files or a dataset; `read`, `limit`).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import logging
import re
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import yaml
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from transformers import HfArgumentParser, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
from transformers.utils.import_utils import is_torch_bf16_available_on_device

from posformers._extras import install_hint
from posformers.integrations.hub import DEFAULT_LICENSE

from .checkpoints import PREEMPTED_EXIT_STATUS, checkpoint_problems, last_complete_checkpoint
from .distributed import check_processes_train_together, train_together_on_cpu
from .errors import ArgumentError, DataError, OutputDirError
from .padding_free import PADDING_FREE_CHOICES, check_padding_free
from .text_files import check_encoding

logger = logging.getLogger(__name__)

# What a finished or interrupted run leaves in its output folder: writing a new run over these loses them.
RUN_ARTIFACTS = (
    "config.json",
    "model.safetensors",
    "pytorch_model.bin",
    "adapter_model.safetensors",
    "trainer_state.json",
    "all_results.json",
)
# Flags of transformers' example scripts that these scripts do not take, and why.
RETIRED_FLAGS = {
    "--use_fast_tokenizer": "transformers 5 always loads the fast tokenizer (the flag is gone); leave it out",
}
_CHECKPOINT_DIR = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-\d+$")
# The TrainingArguments options `--help` names (all of them: --help_all).
COMMON_TRAINING_FLAGS = (
    "--output_dir",
    "--do_train",
    "--do_eval",
    "--do_predict",
    "--num_train_epochs",
    "--max_steps",
    "--learning_rate",
    "--per_device_train_batch_size",
    "--per_device_eval_batch_size",
    "--gradient_accumulation_steps",
    "--eval_strategy",
    "--save_strategy",
    "--save_steps",
    "--bf16",
    "--fp16",
    "--seed",
    "--report_to",
    "--push_to_hub",
    "--resume_from_checkpoint",
)
# The end of every script's --help (finetune/errors.py, finetune/checkpoints.py).
EXIT_STATUS_HELP = (
    "Exit status: 0 when done; 1 for bad input (one line says what); "
    f"{PREEMPTED_EXIT_STATUS} when SIGTERM or Ctrl-C (SIGINT) came during training: a checkpoint was saved at the end "
    "of that step, rerun the same command with --resume_from_checkpoint True to continue (a second Ctrl-C stops at "
    "once). --resume_from_checkpoint True takes the newest "
    "complete checkpoint-N; one left half-written by a killed run is renamed incomplete-checkpoint-N, and said so."
)


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
    license: str | None = dataclasses.field(
        default=None,
        metadata={
            "help": "License of the trained model, for its card (README.md). Default: that of --model_name_or_path's "
            f"weights (the `license:` of its model card; 'unknown' when it has none), {DEFAULT_LICENSE} for a model "
            "trained from scratch."
        },
    )

    def __post_init__(self):
        for argument in ("model_name_or_path", "config_name", "tokenizer_name"):
            check_location(f"--{argument}", getattr(self, argument))


def check_location(argument: str, name: str | None) -> None:
    """A name that is neither an existing path nor a valid Hub repo id is a mistyped path: say so, instead of the Hub
    client's complaint about repo ids."""
    if name is None or Path(name).exists():
        return
    try:
        validate_repo_id(name)
    except HFValidationError as error:
        raise ArgumentError(f"{argument} {name}: no such folder") from error


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
    encoding: str | None = dataclasses.field(
        default=None,
        metadata={
            "help": "Encoding of the data files, e.g. gb18030, big5, cp1252; None: UTF-8. A byte-order mark "
            "(UTF-8, UTF-16) is honoured and dropped whatever this says. See finetune/text_files.py."
        },
    )
    padding_free: str = dataclasses.field(
        default="auto",
        metadata={
            "help": "true: feed the model flattened batches (one row of real tokens, position_ids restarting per "
            "sequence; models with accepts_flattened_batches). false: padded batches, computed with their padding "
            "(unpad_inputs=never). auto: true where the model accepts it, else padded batches the model unpads "
            "internally. See finetune/padding_free.py.",
            "choices": list(PADDING_FREE_CHOICES),
        },
    )

    lora_r: int | None = dataclasses.field(
        default=None,
        metadata={
            "help": "Train LoRA adapters of this rank (and the head) instead of the whole model; the output folder "
            "then holds the adapter and LOAD_ADAPTER.md says how to load it. Needs the peft extra: "
            + install_hint("peft")
        },
    )
    lora_alpha: float | None = dataclasses.field(
        default=None, metadata={"help": "LoRA scaling numerator (the update is scaled by alpha / r). Default: 2 * r."}
    )
    lora_dropout: float = dataclasses.field(default=0.0, metadata={"help": "Dropout on the LoRA branch's input."})
    lora_target_modules: str = dataclasses.field(
        default="attention",
        metadata={
            "help": "What LoRA adapts: 'attention' (query and value projections), 'all-linear' (every encoder "
            "linear), or comma-separated module names (see posformers.integrations.peft.TARGET_MODULES)."
        },
    )

    def __post_init__(self):
        check_padding_free(self.padding_free)
        check_encoding(self.encoding)  # an unknown name stops the run before any data is read
        if self.lora_r is None:
            given = [name for name in ("lora_alpha", "lora_dropout") if getattr(self, name) not in (None, 0.0)]
            if self.lora_target_modules != "attention":
                given.append("lora_target_modules")
            if given:
                raise ArgumentError(f"--{given[0]} needs --lora_r (the rank of the LoRA adapters)")
        elif self.lora_r < 1:
            raise ArgumentError(f"--lora_r must be a positive rank, got {self.lora_r}")
        if self.lora_alpha is not None and self.lora_alpha <= 0:
            raise ArgumentError(f"--lora_alpha must be positive, got {self.lora_alpha}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ArgumentError(f"--lora_dropout must be in [0, 1), got {self.lora_dropout}")


@dataclasses.dataclass
class SplitDataArguments:
    """The data of posformers-ner and posformers-mc: files or a dataset, and how much of it (names as in transformers'
    run_ner and run_swag)."""

    dataset_name: str | None = dataclasses.field(
        default=None, metadata={"help": "A Hub dataset (conll2003, swag, commonsense_qa, ...) or a local folder."}
    )
    dataset_config_name: str | None = dataclasses.field(default=None, metadata={"help": "Its configuration."})
    train_file: str | None = dataclasses.field(
        default=None, metadata={"help": "NER: a CoNLL file or .json/.jsonl; multiple choice: a SWAG .csv or .jsonl."}
    )
    validation_file: str | None = dataclasses.field(default=None, metadata={"help": "Same, for evaluation."})
    test_file: str | None = dataclasses.field(default=None, metadata={"help": "Same, for predictions."})
    max_seq_length: int | None = dataclasses.field(
        default=None,
        metadata={"help": "Tokens per input, longer ones are cut (default: 4096 for LittleBird, else 512)."},
    )
    pad_to_max_length: bool = dataclasses.field(
        default=False, metadata={"help": "Pad every input to max_seq_length (default: pad each batch to its longest)."}
    )
    max_train_samples: int | None = dataclasses.field(default=None, metadata={"help": "Use the first N examples."})
    max_eval_samples: int | None = dataclasses.field(default=None, metadata={"help": "Use the first N examples."})
    max_predict_samples: int | None = dataclasses.field(default=None, metadata={"help": "Use the first N examples."})

    def files(self) -> dict[str, str]:
        """{split: file} of the files given."""
        files = {"train": self.train_file, "validation": self.validation_file, "test": self.test_file}
        return {split: name for split, name in files.items() if name}

    def read(self, from_files: Callable, from_hub: Callable):
        """from_files({split: file}) when files are given, else from_hub(dataset_name, dataset_config_name)."""
        if files := self.files():
            return from_files(files)
        if self.dataset_name:
            return from_hub(self.dataset_name, self.dataset_config_name)
        raise DataError("no data: give --train_file / --validation_file / --test_file or --dataset_name")

    def limit(self, splits: dict) -> dict:
        """The first --max_train_samples / --max_eval_samples / --max_predict_samples examples of each split."""
        counts = (self.max_train_samples, self.max_eval_samples, self.max_predict_samples)
        for split, count in zip(("train", "validation", "test"), counts):
            if split in splits and count is not None:
                splits[split] = splits[split][:count]
        return splits

    def card_dataset(self) -> str | None:
        """The model card's dataset: its name, or the data files' names."""
        return self.dataset_name or ", ".join(Path(name).name for name in self.files().values()) or None


def parse_arguments(dataclass_types: Iterable[type], argv: list[str] | None = None) -> tuple:
    """HfArgumentParser over `dataclass_types`; `argv` may be CLI words or a single .json / .yaml file. `--help`
    lists the script's own options, a group per dataclass, and names the common TrainingArguments options;
    `--help_all` lists every option."""
    dataclass_types = tuple(dataclass_types)
    argv = sys.argv[1:] if argv is None else [str(word) for word in argv]
    if not {"-h", "--help"}.isdisjoint(argv):
        print_script_help(dataclass_types)
        raise SystemExit(0)
    argv = ["--help" if word == "--help_all" else word for word in argv]
    parser = HfArgumentParser(dataclass_types, epilog=EXIT_STATUS_HELP)
    train_together_on_cpu()  # before TrainingArguments sets up the processes (finetune/distributed.py)
    try:
        parsed = parse_words_or_file(parser, dataclass_types, argv)
    except ValueError as error:
        # TrainingArguments refuses --bf16 without a bf16 GPU, telling to "assign use_cpu" (a 35-line traceback)
        if "bf16" not in str(error):
            raise
        check_bf16_on_cpu()
        logger.warning("--bf16 without a GPU: training on the CPU in bfloat16 (as --use_cpu --bf16)")
        parsed = parse_words_or_file(parser, dataclass_types, argv, use_cpu=True)
    for arguments in parsed:
        if isinstance(arguments, TrainingArguments):
            check_processes_train_together(arguments)
            check_mixed_precision(arguments)
            pin_memory_only_with_an_accelerator(arguments)
    return tuple(parsed)


def parse_words_or_file(parser: HfArgumentParser, dataclass_types, argv: list[str], use_cpu: bool = False) -> tuple:
    """The dataclasses from CLI words or one .json / .yaml file (as HfArgumentParser reads them); `use_cpu` adds
    --use_cpu."""
    if len(argv) == 1 and argv[0].endswith((".json", ".yaml", ".yml")):
        text = Path(argv[0]).read_text(encoding="utf-8")
        values = json.loads(text) if argv[0].endswith(".json") else yaml.safe_load(text)
        return parser.parse_dict({**values, "use_cpu": True} if use_cpu else values)
    *parsed, unknown = parser.parse_args_into_dataclasses(
        args=[*argv, "--use_cpu"] if use_cpu else argv, return_remaining_strings=True
    )
    if unknown:
        raise ArgumentError(unknown_argument(dataclass_types, unknown))
    return tuple(parsed)


def check_bf16_on_cpu() -> None:
    """--bf16 where TrainingArguments finds no GPU that computes in bfloat16: fine on a machine without one, whose CPU
    torch computes bf16 on (autocast); one line saying what to pass otherwise. A GPU without bf16 (before NVIDIA
    Ampere) is not swapped for the CPU: a run many times slower than asked would be a surprise."""
    if torch.accelerator.is_available():
        raise ArgumentError(
            "--bf16 needs a GPU that computes in bfloat16 (NVIDIA Ampere or newer), and this one does not: pass --fp16 "
            "instead, or --use_cpu --bf16 to train on the CPU"
        )
    if not is_torch_bf16_available_on_device("cpu"):
        raise ArgumentError("--bf16: there is no GPU, and torch does not compute bfloat16 on this CPU: leave it out")


def print_script_help(dataclass_types: tuple[type, ...]) -> None:
    """The script's own options, grouped under each dataclass's first docstring line, then the training options."""
    own = [types for types in dataclass_types if not issubclass(types, TrainingArguments)]
    # for this help only: a subclass per dataclass that names its argument group (HfArgumentParser's documented hook)
    grouped = [type(types.__name__, (types,), {"_argument_group_name": help_title(types)}) for types in own]
    flags = ", ".join(COMMON_TRAINING_FLAGS)
    training = f"Training: every option of transformers' TrainingArguments works, e.g. {flags}. --help_all lists all."
    epilog = "\n\n".join(textwrap.fill(paragraph, width=100) for paragraph in (training, EXIT_STATUS_HELP))
    usage = "%(prog)s [--option value ...]"
    HfArgumentParser(grouped, usage=usage, epilog=epilog, formatter_class=HelpFormatter).print_help()


def help_title(dataclass_type: type) -> str:
    """The first line of a dataclass's docstring, without its final period."""
    return (dataclass_type.__doc__ or dataclass_type.__name__).strip().splitlines()[0].rstrip(".")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """transformers' formatter (defaults shown) with the epilog as written (its paragraphs apart)."""


def unknown_argument(dataclass_types: Iterable[type], unknown: list[str]) -> str:
    """One line for arguments no dataclass has: the first one, and why (a flag of transformers' example scripts that
    these scripts do not take) or the closest flag there is."""
    flag = next((word for word in unknown if word.startswith("-")), unknown[0]).split("=", 1)[0]
    if flag in RETIRED_FLAGS:
        return f"unknown argument {flag}: {RETIRED_FLAGS[flag]}"
    flags = [f"--{field.name}" for types in dataclass_types for field in dataclasses.fields(types)]
    close = difflib.get_close_matches(flag, flags, n=1)
    return f"unknown argument {flag}" + (f" (did you mean {close[0]}?)" if close else "") + "; see --help"


def check_mixed_precision(training_args: TrainingArguments) -> None:
    """--fp16 without a GPU: Trainer would train in float32 and its card would still claim mixed precision."""
    if training_args.fp16 and training_args.device.type == "cpu":
        logger.warning("--fp16 needs a GPU, and this run has none: training in float32")
        training_args.fp16 = False


def pin_memory_only_with_an_accelerator(training_args: TrainingArguments) -> None:
    """Pinned host memory only speeds up copies to an accelerator; without one, torch's DataLoader warns on every run
    that pin_memory is set (TrainingArguments sets it by default)."""
    if training_args.dataloader_pin_memory and training_args.device.type == "cpu":
        training_args.dataloader_pin_memory = False


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


def resolve_checkpoint(training_args: TrainingArguments) -> str | None:
    """`--resume_from_checkpoint` as given -> a folder or None. "True"/"1": the newest complete checkpoint-N in
    output_dir (newer incomplete ones, left by a killed run, are set aside: finetune/checkpoints.py); a path must be
    a complete checkpoint."""
    resume_from_checkpoint, output_dir = training_args.resume_from_checkpoint, training_args.output_dir
    if resume_from_checkpoint is None or str(resume_from_checkpoint).lower() in ("false", "0", ""):
        return None
    if str(resume_from_checkpoint).lower() in ("true", "1"):
        if not Path(output_dir).is_dir() or get_last_checkpoint(output_dir) is None:
            raise OutputDirError(f"--resume_from_checkpoint True: no checkpoint-N folder in {output_dir}")
        last = last_complete_checkpoint(output_dir, training_args)
        if last is None:  # killed while writing its first checkpoint: nothing to resume, nothing lost either
            logger.warning(
                "--resume_from_checkpoint True: no complete checkpoint in %s, training from the start", output_dir
            )
        return last
    if not Path(resume_from_checkpoint).is_dir():
        raise OutputDirError(f"--resume_from_checkpoint {resume_from_checkpoint}: no such folder")
    problems = checkpoint_problems(resume_from_checkpoint, training_args)
    if problems:
        raise OutputDirError(f"--resume_from_checkpoint {resume_from_checkpoint}: incomplete ({', '.join(problems)})")
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
    checkpoint = resolve_checkpoint(training_args)
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
