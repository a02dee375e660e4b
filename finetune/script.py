"""Every fine-tuning script's `main`, written once. posformers-glue, -ner, -qa, -mc and -pretrain take the same steps;
each is a `Script` subclass that brings only what is its own: its arguments, its data, its model, its features, its
Trainer (collator, metrics) and the files it writes besides the model.

    class Glue(Script):                               # finetune/run_glue.py
        data_arguments = DataTrainingArguments        # with ModelArguments, RunArguments, TrainingArguments
        task = "text-classification"                 # the model card's task

        def load(self): ...                           # the data, checked; then config, self.tokenizer; -> the model
        def prepare_datasets(self): ...               # -> (train_dataset, eval_dataset), None where the run has none
        def build_trainer(self, padding_free, **common):
            return Trainer(**common, data_collator=padding_free.collator(...), compute_metrics=...)
        def evaluate(self): ...                       # self.trainer's metrics (and the script's predictions files)
        def predict(self): ...

    main = script_main(Glue)    # main(argv=None): CLI words or one .json / .yaml file; metrics for in-process callers

The steps, in order (`Script.main`, `start`, `run`):

     1. parse_arguments(argument_groups(), argv)   finetune/arguments.py: --help, unknown flags, --bf16 on a CPU
     2. setup_logging                               this process's log level (finetune/reporting.py)
     3. prepare_output_dir                          a previous run is not overwritten unasked; the checkpoint to resume
     4. set_seed
     5. load()                                      the script's: its data first, so that bad data stops the run before
                                                    a model is built; then config, tokenizer and model
     6. plan_padding_free(padding_free_options())   flattened or padded batches (finetune/padding_free.py)
     7. apply_lora(lora_arguments(model))           --lora_r, in the scripts that train LoRA adapters (finetune/lora.py)
     8. prepare_datasets()                          the script's features
     9. count_tokens, prepare_processes             tokens/s; the process group on a CPU (finetune/distributed.py)
    10. build_trainer(padding_free, model=, args=, processing_class=, train_dataset=, eval_dataset=, callbacks=)
    11. padding_free.attach, attach                 the run's unpad_inputs; FSDP2, saves and losses across processes
    12. run_stages                                  train, evaluate(), predict(), results files, card, push to the Hub;
                                                    exit status 75 when pre-empted (finetune/stages.py)

`script_main` wraps it all: bad input (finetune/errors.py) ends the process with one line and exit status 1, a lost
process (finetune/distributed.py) with its own one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sized

from transformers import Trainer, TrainingArguments, set_seed

from .arguments import ModelArguments, RunArguments, parse_arguments, prepare_output_dir
from .distributed import attach, exit_on_lost_process, prepare_processes
from .errors import DataError, exit_on_data_error
from .lora import apply_lora
from .padding_free import PaddingFreePlan, plan_padding_free
from .reporting import ThroughputCallback, count_tokens, setup_logging
from .stages import run_stages

# The split each stage needs (a prefix: GLUE's MNLI has validation_matched and validation_mismatched).
SPLIT_FLAGS = {"train": "do_train", "validation": "do_eval", "test": "do_predict"}


class Script:
    """One run of a script: its parsed arguments, and what its steps made (`tokenizer`, `trainer`)."""

    data_arguments: type  # the script's data options (a dataclass)
    task: str  # the model card's task tag ("text-classification", ...)

    def __init__(self, model_args: ModelArguments, data_args, run_args: RunArguments, training_args: TrainingArguments):
        self.model_args, self.data_args = model_args, data_args
        self.run_args, self.training_args = run_args, training_args
        self.tokenizer = None  # set by load()
        self.trainer: Trainer | None = None  # set by run()

    # ----------------------------------------------------------------------------------------------------------------
    # The steps every script takes
    # ----------------------------------------------------------------------------------------------------------------

    @classmethod
    def argument_groups(cls) -> tuple[type, ...]:
        """The dataclasses HfArgumentParser fills, in the order --help lists them; `__init__` takes them so."""
        return (ModelArguments, cls.data_arguments, RunArguments, TrainingArguments)

    @classmethod
    def main(cls, argv: list[str] | None = None) -> dict:
        """Run the script with `argv` (None: sys.argv[1:]); returns every metric it reported."""
        script = cls(*parse_arguments(cls.argument_groups(), argv))
        setup_logging(script.training_args)
        return script.start()

    def start(self) -> dict:
        """Check the output folder, then run (posformers-pretrain's two-stage recipe runs twice, in two folders)."""
        checkpoint = prepare_output_dir(self.training_args, self.run_args.overwrite_output_dir)
        return self.run(checkpoint)

    def run(self, checkpoint: str | None = None) -> dict:
        """Load, build the Trainer and run the stages, resuming training from `checkpoint`."""
        training_args = self.training_args
        set_seed(training_args.seed)
        model = self.load()
        padding_free = plan_padding_free(
            self.run_args.padding_free, model, training_args, **self.padding_free_options()
        )
        lora = self.lora_arguments(model) if self.run_args.lora_r is not None else None
        if lora is not None:
            model = apply_lora(model, self.model_args, self.run_args, training_args, **lora)
        train_dataset, eval_dataset = self.prepare_datasets()
        count_tokens(training_args)
        prepare_processes(training_args)
        self.trainer = self.build_trainer(
            padding_free,
            model=model,
            args=training_args,
            processing_class=self.tokenizer,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            callbacks=[ThroughputCallback()],  # before Trainer's printer: the log lines it prints carry the speeds
        )
        padding_free.attach(self.trainer)
        attach(self.trainer)
        return run_stages(
            self.trainer,
            checkpoint,
            train_samples=len(train_dataset) if isinstance(train_dataset, Sized) else None,  # streamed: unknown
            evaluate=self.evaluate,
            predict=self.predict,
            card=self.card(),
        )

    # ----------------------------------------------------------------------------------------------------------------
    # What each script brings
    # ----------------------------------------------------------------------------------------------------------------

    def load(self):
        """Read and check the data, then load the config, the tokenizer (`self.tokenizer`) and the model; return it."""
        raise NotImplementedError

    def read_options(self) -> dict:
        """The options of the script's data reader: skip_bad (--skip_bad_examples), cache_dir (for Hub datasets) and
        encoding (--encoding)."""
        run_args = self.run_args
        return {
            "skip_bad": run_args.skip_bad_examples,
            "cache_dir": self.model_args.cache_dir,
            "encoding": run_args.encoding,
        }

    def padding_free_options(self) -> dict:
        """plan_padding_free's keyword arguments besides --padding_free."""
        return {"pad_to_max_length": self.data_args.pad_to_max_length}

    def lora_arguments(self, model) -> dict | None:
        """apply_lora's task_type, auto_class and config fields for --lora_r; None: the script does not train LoRA
        adapters."""
        return None

    def prepare_datasets(self) -> tuple:
        """(train_dataset, eval_dataset) as the model takes them; None where the run has none."""
        raise NotImplementedError

    def build_trainer(self, padding_free: PaddingFreePlan, **common) -> Trainer:
        """The script's Trainer from `common` (model, args, processing_class, train_dataset, eval_dataset, callbacks)
        and its own collator (through `padding_free.collator` where batches may be flattened) and metrics."""
        raise NotImplementedError

    def evaluate(self) -> dict:
        """--do_eval: the metrics of `self.trainer` on the evaluation data, with `eval_samples`."""
        raise NotImplementedError

    def predict(self) -> dict:
        """--do_predict: the predictions files, and their metrics where the test data has labels."""
        return {}

    def card(self) -> dict:
        """The model card's arguments (run_stages' `card`)."""
        return {
            "finetuned_from": self.model_args.model_name_or_path,
            "tasks": self.task,
            "license": self.model_args.license,
        }

    @property
    def pad_to_multiple_of(self) -> int | None:
        """Padded lengths in multiples of 8 under --fp16 (tensor cores)."""
        return 8 if self.training_args.fp16 else None


def script_main(script: type[Script]) -> Callable[[list[str] | None], dict | None]:
    """`script`'s `main(argv=None)`: what the console script and `python -m` run."""

    @exit_on_data_error
    @exit_on_lost_process
    def main(argv: list[str] | None = None) -> dict | None:
        """Run the script with `argv` (CLI words; None: sys.argv[1:]). In-process callers get every metric it
        reported; the command line gets exit status 0, 1 for bad input (one line says what), 75 when pre-empted."""
        return script.main(argv)

    return main


def check_splits(training_args: TrainingArguments, splits) -> None:
    """Each stage asked for (--do_train, --do_eval, --do_predict) needs its split."""
    for prefix, flag in SPLIT_FLAGS.items():
        if getattr(training_args, flag) and not any(split.startswith(prefix) for split in splits):
            raise DataError(f"--{flag} needs a {prefix} split (have: {', '.join(splits) or 'none'})")
