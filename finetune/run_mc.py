"""Fine-tune a posformers (or any transformers) encoder for multiple choice: `posformers-mc`.

    posformers-mc --model_name_or_path <model> --train_file swag/train.csv --validation_file swag/val.csv \\
        --do_train --do_eval --output_dir out/swag
    posformers-mc --model_name_or_path <model> --train_file train_rand_split.jsonl \\
        --validation_file dev_rand_split.jsonl --do_train --do_eval --output_dir out/csqa     # CommonsenseQA, ARC
    posformers-mc --model_name_or_path <model> --dataset_name commonsense_qa --do_train --do_eval ...   # the Hub

Arguments as transformers' examples/pytorch/multiple-choice/run_swag.py plus every TrainingArguments flag and the
shared script options (`--skip_bad_examples`, `--overwrite_output_dir`, `--resume_from_checkpoint True`,
`--push_to_hub`, `--padding_free`). Data formats: finetune/mc_data.py. Each question becomes a (choices, tokens)
block, one (first, second) pair per choice, cut to --max_seq_length tokens from the longer segment (default: 4096 for
LittleBird, so a passage of thousands of tokens shared by the choices is read whole; else 512 or the model's
position limit). The metric is accuracy.

--padding_free: a multiple-choice head scores the choices of a question side by side, so batches stay padded
(B, choices, L); `auto` (default) lets the model skip the padding inside (unpad_inputs="auto"), `false` computes on
it, `true` is refused. RoFormer's head, as transformers', classifies each choice's last position
(summary_type="last"), which is a padding token in a padded choice, so its scores depend on the padding (a warning
says so): `--config_overrides summary_type=mean` (or `first`) gives it a summary that does not.

Writes into --output_dir: the model and tokenizer, `*_results.json`, and for --do_eval / --do_predict
`eval_predictions.jsonl` / `predictions.jsonl`: per question its id, the predicted choice's label ("A", "0", ...)
and the choices' probabilities.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import datasets
import numpy as np
from transformers import (
    AutoModelForMultipleChoice,
    DataCollatorForMultipleChoice,
    EvalPrediction,
    Trainer,
    TrainingArguments,
)

from .arguments import SplitDataArguments
from .errors import DataError
from .glue_metrics import accuracy
from .loading import fit_config_to_tokenizer, load_config, load_model, load_tokenizer, window_length
from .mc_data import read_hub, read_split_files
from .script import SPLIT_FLAGS, Script, check_splits, script_main

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class McDataArguments(SplitDataArguments):
    """posformers-mc's data options (names as in transformers' run_swag)."""


def load_splits(
    data_args: McDataArguments, training_args: TrainingArguments, skip_bad: bool, cache_dir, encoding: str | None = None
) -> dict:
    """The questions of each split the run needs (files read in `encoding`); training and evaluation need answers."""
    splits = data_args.read(
        lambda files: read_split_files(files, skip_bad, encoding),
        lambda name, config_name: read_hub(name, config_name, cache_dir),
    )
    check_splits(training_args, splits)
    for split in ("train", "validation"):
        if getattr(training_args, SPLIT_FLAGS[split]) and splits[split][0]["label"] is None:
            raise DataError(f"--{SPLIT_FLAGS[split]}: the {split} split has no answers (label / answerKey)")
    return data_args.limit(splits)


def to_features(questions: list[dict], tokenizer, max_length: int, pad_to_max_length: bool):
    """A datasets.Dataset with per question (choices, L) input_ids / attention_mask (/ token_type_ids) and `label`
    (when the questions have answers)."""
    firsts = [question["first"] for question in questions for _ in question["seconds"]]
    seconds = [second for question in questions for second in question["seconds"]]
    encoded = tokenizer(
        firsts,
        seconds,
        truncation=True,
        max_length=max_length,
        padding="max_length" if pad_to_max_length else False,
    )
    choices = len(questions[0]["seconds"])
    columns = {
        key: [values[i : i + choices] for i in range(0, len(values), choices)] for key, values in encoded.items()
    }
    cut = sum(len(ids) >= max_length for ids in encoded["input_ids"]) if not pad_to_max_length else 0
    if cut:
        logger.warning("%d of %d choices were cut to max_seq_length=%d tokens", cut, len(seconds), max_length)
    if questions[0]["label"] is not None:
        columns["label"] = [question["label"] for question in questions]
    return datasets.Dataset.from_dict(columns)


class ChoicesCollator(DataCollatorForMultipleChoice):
    """transformers' multiple-choice collator ((B, choices, L) tensors, padded to the batch's longest choice), also for
    questions without answers (a test split), which it would refuse."""

    def torch_call(self, features):
        if "label" in features[0] or "labels" in features[0]:
            return super().torch_call(features)
        batch = super().torch_call([{**feature, "label": 0} for feature in features])
        del batch["labels"]
        return batch


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
    logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
    return {"accuracy": accuracy(np.argmax(logits, axis=-1), prediction.label_ids)}


def write_predictions(path: Path, questions: list[dict], logits) -> None:
    """One JSON line per question: id, the predicted choice's label, the choices' probabilities."""
    logits = logits[0] if isinstance(logits, tuple) else logits
    probabilities = softmax(np.asarray(logits, dtype=np.float64))
    lines = []
    for question, row in zip(questions, probabilities):
        predicted = question["choice_labels"][int(np.argmax(row))]
        lines.append(
            json.dumps({"id": question["id"], "prediction": predicted, "probabilities": row.round(6).tolist()})
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


class MultipleChoice(Script):
    """posformers-mc's steps (finetune/script.py runs them)."""

    data_arguments = McDataArguments
    task = "multiple-choice"

    def load(self):
        model_args = self.model_args
        self.splits = load_splits(self.data_args, self.training_args, **self.read_options())
        config = load_config(model_args)
        self.tokenizer = load_tokenizer(model_args)
        self.tokenizer.padding_side = "right"
        self.config = fit_config_to_tokenizer(config, self.tokenizer, model_args)
        if getattr(config, "summary_type", None) == "last" and not self.data_args.pad_to_max_length:
            logger.warning(
                "%s's multiple-choice head reads each choice's last position (summary_type='last', as transformers' "
                "RoFormer), a padding token in a padded choice: scores then depend on the batch's padding. "
                "--config_overrides summary_type=mean (or first) avoids that",
                config.model_type,
            )
        return load_model(model_args, self.config, AutoModelForMultipleChoice)

    def padding_free_options(self) -> dict:
        return {
            **super().padding_free_options(),
            "flattenable": False,
            "reason": "a multiple-choice head scores padded (batch, choices, tokens) blocks",
        }

    def prepare_datasets(self) -> tuple:
        max_length = window_length(self.config, self.data_args.max_seq_length)
        self.features = {
            split: to_features(questions, self.tokenizer, max_length, self.data_args.pad_to_max_length)
            for split, questions in self.splits.items()
        }
        return self.features.get("train"), self.features.get("validation")

    def build_trainer(self, padding_free, **common) -> Trainer:
        collator = ChoicesCollator(self.tokenizer, pad_to_multiple_of=self.pad_to_multiple_of)  # never flattened
        return Trainer(**common, data_collator=collator, compute_metrics=compute_metrics)

    def evaluate(self) -> dict:
        output = self.trainer.predict(self.features["validation"], metric_key_prefix="eval")
        self.trainer.log(output.metrics)
        self.write_choices("eval_predictions.jsonl", "validation", output.predictions)
        return {**output.metrics, "eval_samples": len(self.features["validation"])}

    def predict(self) -> dict:
        output = self.trainer.predict(self.features["test"], metric_key_prefix="predict")
        self.write_choices("predictions.jsonl", "test", output.predictions)
        return {**output.metrics, "predict_samples": len(self.features["test"])}

    def write_choices(self, name: str, split: str, logits) -> None:
        """The choices' probabilities for `split` into output_dir/`name` (process 0 only)."""
        if self.trainer.is_world_process_zero():
            write_predictions(Path(self.training_args.output_dir) / name, self.splits[split], logits)

    def card(self) -> dict:
        return {**super().card(), "dataset": self.data_args.card_dataset()}


main = script_main(MultipleChoice)


if __name__ == "__main__":
    main()
