"""Fine-tune a posformers (or any transformers) encoder on GLUE or on your own sentence(-pair) classification data.

    posformers-glue --model_name_or_path <model> --task_name sst2 --data_dir glue/SST-2 \\
        --do_train --do_eval --do_predict --output_dir out/sst2        # GLUE's TSV files as distributed
    posformers-glue --model_name_or_path <model> --task_name mnli --do_train --do_eval --output_dir out/mnli
                                                                        # the Hub dataset nyu-mll/glue (online)
    posformers-glue --model_name_or_path <model> --train_file train.csv --validation_file dev.jsonl ...
                                                                        # your own table with a `label` column
    posformers-glue --config_name config.json --tokenizer_name <tokenizer> ...   # a new model, from scratch

Also `python -m posformers.finetune.run_glue` and, in Python, `posformers.finetune.run_glue.main([...])`. Every
`TrainingArguments` flag works (`--eval_strategy`, `--save_steps`, `--push_to_hub`, `--resume_from_checkpoint True`,
`--ddp_backend`, `--fsdp`, `--deepspeed`, ...); under torchrun / accelerate launch Trainer runs it distributed.
`--padding_free auto|true|false` (default auto): flattened batches for the posformers models, or padded ones
(finetune/padding_free.py).
`--lora_r 8` (with `--lora_alpha`, `--lora_dropout`, `--lora_target_modules`) trains LoRA adapters and the head instead
of the whole model and saves the adapter with LOAD_ADAPTER.md (finetune/lora.py).

What it writes into --output_dir: the model and tokenizer (`save_pretrained`), train/eval `*_results.json`
and `all_results.json`, and for --do_predict the test predictions in GLUE's submission format: `<TASK>.tsv`
(`SST-2.tsv`, `MNLI-m.tsv` and `MNLI-mm.tsv`, ...; `predictions.tsv` for custom data) with `index\\tprediction`
lines, label names for classification and scores for STS-B. MNLI is evaluated on validation_matched (`eval_*`) and
validation_mismatched (`eval_mm_*`). Metrics: the `evaluate` module finetune/metrics/glue (computed by
finetune/glue_metrics.py). Data rules: finetune/glue_data.py.

Bad data stops the script before training with one line naming file, line and column (exit status 1):
unknown task, missing text or label columns, empty labels, labels outside the task's label set, empty files, malformed
rows (`--skip_bad_examples` skips those rows and says how many), labels that do not fit a fine-tuned model's head,
a training label that looks like a typo of another (finetune/glue_data.py's suspicious_labels; `--label_names neg,pos`
declares the labels instead, and every other one stops the run), and files that are not in --encoding (default UTF-8).
A --max_seq_length beyond the model's positions is lowered to them, with a warning.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
from transformers import (
    AutoModelForSequenceClassification,
    DataCollatorWithPadding,
    EvalPrediction,
    Trainer,
    TrainingArguments,
)
from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

from . import metrics
from .arguments import ModelArguments
from .errors import ArgumentError, DataError
from .glue_data import GlueTask, Table, get_task, read_files, read_hub, rename_labels, split_files, submission_name
from .glue_metrics import TASK_METRICS
from .loading import fit_config_to_tokenizer, load_config, load_model, load_tokenizer
from .script import Script, check_splits, script_main

logger = logging.getLogger(__name__)

GLUE_HUB_NAMES = ("nyu-mll/glue", "glue")


@dataclasses.dataclass
class DataTrainingArguments:
    """What data to train and evaluate on (names as in transformers' run_glue)."""

    task_name: str | None = dataclasses.field(
        default=None, metadata={"help": "GLUE task: " + ", ".join(TASK_METRICS) + ". Leave out for custom data."}
    )
    dataset_name: str | None = dataclasses.field(
        default=None, metadata={"help": "A Hub dataset (default for a task without files: nyu-mll/glue)."}
    )
    dataset_config_name: str | None = dataclasses.field(
        default=None, metadata={"help": "Its configuration (for nyu-mll/glue: the task name)."}
    )
    data_dir: str | None = dataclasses.field(
        default=None,
        metadata={
            "help": "A GLUE task folder with the official files (train.tsv, dev.tsv, test.tsv; MNLI: dev_matched...)"
        },
    )
    train_file: str | None = dataclasses.field(
        default=None,
        metadata={
            "help": "A .tsv/.csv/.json/.jsonl file. Its labels are the label set, unless --label_names neg,pos "
            "declares it (then every other label stops the run)."
        },
    )
    validation_file: str | None = dataclasses.field(default=None, metadata={"help": "Same; MNLI: the matched set."})
    validation_mismatched_file: str | None = dataclasses.field(default=None, metadata={"help": "MNLI mismatched dev."})
    test_file: str | None = dataclasses.field(default=None, metadata={"help": "Same; MNLI: the matched test set."})
    test_mismatched_file: str | None = dataclasses.field(default=None, metadata={"help": "MNLI mismatched test."})
    text_columns: str | None = dataclasses.field(
        default=None, metadata={"help": "Text column names of custom files, comma-separated (default: guessed)."}
    )
    max_seq_length: int = dataclasses.field(default=128, metadata={"help": "Longer inputs are truncated."})
    pad_to_max_length: bool = dataclasses.field(
        default=False, metadata={"help": "Pad every input to max_seq_length (default: pad each batch to its longest)."}
    )
    max_train_samples: int | None = dataclasses.field(default=None, metadata={"help": "Use the first N train rows."})
    max_eval_samples: int | None = dataclasses.field(default=None, metadata={"help": "Use the first N eval rows."})
    max_predict_samples: int | None = dataclasses.field(default=None, metadata={"help": "Use the first N test rows."})
    overwrite_cache: bool = dataclasses.field(default=False, metadata={"help": "Re-tokenize cached Hub datasets."})
    preprocessing_num_workers: int | None = dataclasses.field(default=None, metadata={"help": "Tokenizer processes."})

    def explicit_files(self) -> dict[str, str | None]:
        return {
            "train": self.train_file,
            "validation": self.validation_file,
            "validation_mismatched": self.validation_mismatched_file,
            "test": self.test_file,
            "test_mismatched": self.test_mismatched_file,
        }


# ---------------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------------


def load_tables(
    data_args: DataTrainingArguments, skip_bad: bool, cache_dir, encoding: str | None = None, label_names=None
) -> tuple[GlueTask | None, dict]:
    """The task (None: custom data) and its validated splits, from files (read in `encoding`) or the Hub;
    `label_names`: the declared labels of custom data (--label_names)."""
    task = get_task(data_args.task_name) if data_args.task_name else None
    if task is not None and label_names is not None:
        raise ArgumentError(
            f"--label_names declares the labels of custom data; {task.name} has its own ({', '.join(task.label_names)})"
        )
    text_columns = tuple(c.strip() for c in data_args.text_columns.split(",")) if data_args.text_columns else None
    files = split_files(task, data_args.data_dir, data_args.explicit_files())
    if files:
        return task, read_files(files, task, text_columns, skip_bad, encoding, label_names)
    if data_args.dataset_name is None and task is None:
        raise DataError("no data: give --task_name, --data_dir, --train_file/--validation_file or --dataset_name")
    name = data_args.dataset_name or GLUE_HUB_NAMES[0]
    config_name = data_args.dataset_config_name
    if config_name is None and name in GLUE_HUB_NAMES and task is not None:
        config_name = task.name
    return task, read_hub(name, config_name, task, text_columns, cache_dir, label_names)


def declared_labels(training_args: TrainingArguments) -> tuple[str, ...] | None:
    """--label_names: the labels of custom data, in id order ("neg,pos" or "neg pos"); None when not given.

    The flag is TrainingArguments' (the names of the model's label inputs), which a sequence classifier always calls
    "labels": here it declares the label set, and Trainer is left its default."""
    given, training_args.label_names = training_args.label_names, None
    if not given:
        return None
    names = tuple(name.strip() for word in given for name in word.split(",") if name.strip())
    if len(names) < 2 or len(set(names)) < len(names):
        raise ArgumentError(
            f"--label_names {','.join(given)}: declare the labels of the data, each once, at least two (e.g. "
            "--label_names negative,positive)"
        )
    return names


def splits_for(task: GlueTask | None, tables: dict, prefix: str) -> list[str]:
    """The validation (prefix "validation") or test splits present, matched before mismatched."""
    return sorted((split for split in tables if split.startswith(prefix)), key=lambda s: s.endswith("mismatched"))


def limit(table: Table, count: int | None) -> Table:
    """The first `count` rows of a table (all when count is None)."""
    if count is not None and count < len(table):
        table.examples = table.examples[:count]
        if table.labels is not None:
            table.labels = table.labels[:count]
    return table


def position_limit(config, tokenizer) -> int | None:
    """The longest input the model takes: its position table's size, or less where its tokenizer says so (RoBERTa's
    514 positions hold 512 tokens). None: no limit (LittleBird has no position table)."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        return None
    return min(positions, tokenizer.model_max_length) if tokenizer.model_max_length < VERY_LARGE_INTEGER else positions


def cap_max_seq_length(data_args: DataTrainingArguments, config, tokenizer) -> None:
    """--max_seq_length beyond the model's positions would fail mid-training on the first long text: use the limit."""
    limit = position_limit(config, tokenizer)
    if limit is not None and data_args.max_seq_length > limit:
        logger.warning(
            "max_seq_length %d is more than the model's %d positions: using %d", data_args.max_seq_length, limit, limit
        )
        data_args.max_seq_length = limit


def tokenize(table: Table, tokenizer, data_args: DataTrainingArguments):
    """A datasets.Dataset of input_ids, attention_mask (token_type_ids), label and idx (the example id, which Trainer
    drops before batching: the model does not take it)."""
    dataset = table.to_dataset()
    pair = "text_pair" in dataset.column_names
    padding = "max_length" if data_args.pad_to_max_length else False

    def encode(batch):
        return tokenizer(
            batch["text"],
            batch["text_pair"] if pair else None,
            truncation=True,
            max_length=data_args.max_seq_length,
            padding=padding,
        )

    removed = ["text", "text_pair"] if pair else ["text"]
    return dataset.map(encode, batched=True, remove_columns=removed, num_proc=data_args.preprocessing_num_workers)


# ---------------------------------------------------------------------------------------------------------------------
# Labels and the model head
# ---------------------------------------------------------------------------------------------------------------------


def is_classification_checkpoint(config) -> bool:
    """True when the config comes from a model fine-tuned with a sequence-classification head."""
    return any(name.endswith("ForSequenceClassification") for name in (getattr(config, "architectures", None) or []))


def align_with_checkpoint(
    config, tables: dict, label_names: tuple[str, ...] | None, task: GlueTask | None
) -> tuple[str, ...] | None:
    """A checkpoint fine-tuned on the same label names in another order keeps its order: the data's label ids are
    renumbered to the model's (e.g. an MNLI model trained with contradiction=0), so its head stays meaningful. A
    GLUE task's class names in the checkpoint ("negative", "positive") stand for the file labels they name."""
    if label_names is None or not is_classification_checkpoint(config):
        return label_names
    model_names = tuple(str(config.id2label[i]) for i in range(config.num_labels))
    if task is not None:
        model_names = rename_labels(model_names, task.class_names, task.label_names)
    if model_names == label_names or sorted(model_names) != sorted(label_names):
        return label_names
    new_id = [model_names.index(name) for name in label_names]
    for table in tables.values():
        table.label_names = model_names
        if table.labels is not None:
            table.labels = [new_id[label] for label in table.labels]
    logger.info("using the checkpoint's label order %s", ", ".join(model_names))
    return model_names


def set_labels(config, label_names: tuple[str, ...] | None, task: GlueTask | None, model_args: ModelArguments):
    """Give the config the data's labels; refuse a fine-tuned head that has another number of labels."""
    num_labels = 1 if label_names is None else len(label_names)
    if (
        model_args.model_name_or_path
        and is_classification_checkpoint(config)
        and config.num_labels != num_labels
        and not model_args.ignore_mismatched_sizes
    ):
        raise DataError(
            f"the data has {num_labels} label(s) ({', '.join(label_names or ['a score'])}) but "
            f"{model_args.model_name_or_path} was fine-tuned with num_labels={config.num_labels} "
            f"({', '.join(map(str, config.id2label.values()))}){_unknown_to(config, label_names, task)}; pass "
            "--ignore_mismatched_sizes to give it a new head",
            column="label",
        )
    if task is not None:  # the model carries what the file labels mean (SST-2: "0" -> "negative")
        label_names = rename_labels(label_names, task.label_names, task.class_names)
    names = list(label_names) if label_names is not None else ["score"]
    config.id2label = dict(enumerate(names))
    config.label2id = {name: i for i, name in enumerate(names)}
    config.problem_type = "regression" if label_names is None else "single_label_classification"
    config.finetuning_task = task.name if task else None
    return config


def _unknown_to(config, label_names, task: GlueTask | None) -> str:
    """The data's labels that a fine-tuned head lacks, where it has some of the others (a label mistyped, or a class
    added), for the error of set_labels: ", without 'neutral'"; "" otherwise."""
    model_names = {str(name) for name in config.id2label.values()}
    if task is not None:
        model_names |= set(rename_labels(tuple(model_names), task.class_names, task.label_names))
    unknown = [name for name in label_names or () if name not in model_names]
    if not unknown or len(unknown) == len(label_names):
        return ""
    return f", without {', '.join(map(repr, unknown))}"


# ---------------------------------------------------------------------------------------------------------------------
# Metrics and predictions
# ---------------------------------------------------------------------------------------------------------------------


def logits_to_predictions(logits, regression: bool) -> np.ndarray:
    """(N, num_labels) logits -> (N,) class ids, or (N,) scores for regression."""
    logits = logits[0] if isinstance(logits, tuple) else logits
    return np.squeeze(logits, axis=-1) if regression else np.argmax(logits, axis=-1)


def make_compute_metrics(task: GlueTask | None, label_names: tuple[str, ...] | None):
    """Trainer's compute_metrics: the task's GLUE metrics (posformers' `evaluate` module "glue", see
    finetune/metrics); accuracy (or correlations) for custom data.

    Ids are mapped back to the task's own label order first (they differ for a checkpoint that kept its order, see
    align_with_checkpoint), so that F1 is always that of GLUE's positive class.
    """
    regression = label_names is None
    metric_task = task.name if task else ("stsb" if regression else "sst2")
    to_task_id = None
    if task is not None and not regression:
        to_task_id = np.array([task.label_names.index(name) for name in label_names])
    metric = metrics.load("glue", config_name=metric_task)

    def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
        predictions, labels = logits_to_predictions(prediction.predictions, regression), prediction.label_ids
        if to_task_id is not None:
            predictions, labels = to_task_id[predictions], to_task_id[labels]
        return metric.compute(predictions=predictions, references=labels)

    return compute_metrics


def write_predictions(path: Path, ids, predictions, label_names: tuple[str, ...] | None) -> None:
    """GLUE submission format: a header `index\\tprediction`, then one line per test example."""
    lines = ["index\tprediction"]
    for idx, value in zip(ids, predictions):
        shown = f"{float(value):.3f}" if label_names is None else label_names[int(value)]
        lines.append(f"{idx}\t{shown}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------------------------


class Glue(Script):
    """posformers-glue's steps (finetune/script.py runs them)."""

    data_arguments = DataTrainingArguments
    task = "text-classification"

    def load(self):
        declared = declared_labels(self.training_args)
        self.glue_task, self.tables = load_tables(self.data_args, **self.read_options(), label_names=declared)
        check_splits(self.training_args, self.tables)
        label_names = next(iter(self.tables.values())).label_names
        self.regression = label_names is None

        config = load_config(self.model_args)
        self.label_names = align_with_checkpoint(config, self.tables, label_names, self.glue_task)
        config = set_labels(config, self.label_names, self.glue_task, self.model_args)
        self.tokenizer = load_tokenizer(self.model_args)
        config = fit_config_to_tokenizer(config, self.tokenizer, self.model_args)
        cap_max_seq_length(self.data_args, config, self.tokenizer)
        return load_model(self.model_args, config, AutoModelForSequenceClassification)

    def lora_arguments(self, model) -> dict:
        labels = {"id2label": model.config.id2label, "label2id": model.config.label2id}
        if self.regression:
            labels = {"num_labels": 1, "problem_type": "regression"}
        return {"task_type": "SEQ_CLS", "auto_class": "AutoModelForSequenceClassification", **labels}

    def prepare_datasets(self) -> tuple:
        data_args, tables = self.data_args, self.tables
        train_dataset = None
        if self.training_args.do_train:
            train_dataset = tokenize(limit(tables["train"], data_args.max_train_samples), self.tokenizer, data_args)
        eval_splits = splits_for(self.glue_task, tables, "validation") if self.training_args.do_eval else []
        self.eval_datasets = {
            split: tokenize(limit(tables[split], data_args.max_eval_samples), self.tokenizer, data_args)
            for split in eval_splits
        }
        return train_dataset, next(iter(self.eval_datasets.values()), None)

    def build_trainer(self, padding_free, **common) -> Trainer:
        collator = DataCollatorWithPadding(self.tokenizer, pad_to_multiple_of=self.pad_to_multiple_of)
        return Trainer(
            **common,
            data_collator=padding_free.collator(collator),
            compute_metrics=make_compute_metrics(self.glue_task, self.label_names),
        )

    def evaluate(self) -> dict[str, float]:
        """Every validation split: MNLI's mismatched one under `eval_mm_*`."""
        scores = {}
        for split, dataset in self.eval_datasets.items():
            prefix = "eval_mm" if split.endswith("mismatched") else "eval"
            scores.update(self.trainer.evaluate(eval_dataset=dataset, metric_key_prefix=prefix))
            scores[f"{prefix}_samples"] = len(dataset)
        return scores

    def predict(self) -> dict:
        """The test predictions in GLUE's submission format (no metrics: test sets have no labels)."""
        task = self.glue_task
        for split in splits_for(task, self.tables, "test"):
            table = limit(self.tables[split], self.data_args.max_predict_samples)
            dataset = tokenize(table, self.tokenizer, self.data_args)
            if "label" in dataset.column_names:
                dataset = dataset.remove_columns("label")  # predict only: the submission has no labels
            output = self.trainer.predict(dataset, metric_key_prefix="predict")
            predictions = logits_to_predictions(output.predictions, self.regression)
            if self.trainer.is_world_process_zero():
                name = submission_name(task, split) if task else "predictions" + split.removeprefix("test")
                path = Path(self.training_args.output_dir) / f"{name}.tsv"
                write_predictions(path, [example.idx for example in table.examples], predictions, self.label_names)
                logger.info("wrote %s", path)
        return {}

    def card(self) -> dict:
        card = super().card()
        if self.glue_task is not None:
            name = self.glue_task.name
            card.update(language="en", dataset_tags="glue", dataset_args=name, dataset=f"GLUE {name.upper()}")
        return card


main = script_main(Glue)


if __name__ == "__main__":
    main()
