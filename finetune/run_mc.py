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
    set_seed,
)

from .arguments import ModelArguments, RunArguments, parse_arguments, prepare_output_dir
from .distributed import attach, exit_on_lost_process, prepare_processes
from .errors import DataError, exit_on_data_error
from .glue_metrics import accuracy
from .loading import fit_config_to_tokenizer, load_config, load_model, load_tokenizer
from .mc_data import read_hub, read_split_files
from .padding_free import plan_padding_free
from .reporting import ThroughputCallback, count_tokens, setup_logging
from .run_ner import SPLIT_FLAGS, SplitDataArguments, limit_splits, model_card, require_splits
from .run_qa import window_length
from .stages import run_stages

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class McDataArguments(SplitDataArguments):
    """posformers-mc's data options (names as in transformers' run_swag)."""


def load_splits(
    data_args: McDataArguments, training_args, skip_bad: bool, cache_dir, encoding: str | None = None
) -> dict:
    """The questions of each split the run needs (files read in `encoding`); training and evaluation need answers."""
    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    files = {split: name for split, name in files.items() if name}
    if files:
        splits = read_split_files(files, skip_bad, encoding)
    elif data_args.dataset_name:
        splits = read_hub(data_args.dataset_name, data_args.dataset_config_name, cache_dir)
    else:
        raise DataError("no data: give --train_file / --validation_file / --test_file or --dataset_name")
    require_splits(splits, training_args)
    for split in ("train", "validation"):
        if getattr(training_args, SPLIT_FLAGS[split]) and splits[split][0]["label"] is None:
            raise DataError(f"--{SPLIT_FLAGS[split]}: the {split} split has no answers (label / answerKey)")
    return limit_splits(splits, data_args)


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


@exit_on_data_error
@exit_on_lost_process
def main(argv: list[str] | None = None) -> dict | None:
    """Run the script with `argv` (CLI words; None: sys.argv). In-process callers get every metric it reported."""
    model_args, data_args, run_args, training_args = parse_arguments(
        (ModelArguments, McDataArguments, RunArguments, TrainingArguments), argv
    )
    setup_logging(training_args)
    checkpoint = prepare_output_dir(training_args, run_args.overwrite_output_dir)
    set_seed(training_args.seed)

    splits = load_splits(data_args, training_args, run_args.skip_bad_examples, model_args.cache_dir, run_args.encoding)
    config = load_config(model_args)
    tokenizer = load_tokenizer(model_args)
    tokenizer.padding_side = "right"
    config = fit_config_to_tokenizer(config, tokenizer, model_args)
    if getattr(config, "summary_type", None) == "last" and not data_args.pad_to_max_length:
        logger.warning(
            "%s's multiple-choice head reads each choice's last position (summary_type='last', as transformers' "
            "RoFormer), a padding token in a padded choice: scores then depend on the batch's padding. "
            "--config_overrides summary_type=mean (or first) avoids that",
            config.model_type,
        )
    model = load_model(model_args, config, AutoModelForMultipleChoice)
    padding_free = plan_padding_free(
        run_args.padding_free,
        model,
        training_args,
        pad_to_max_length=data_args.pad_to_max_length,
        flattenable=False,
        reason="a multiple-choice head scores padded (batch, choices, tokens) blocks",
    )
    max_length = window_length(config, data_args.max_seq_length)
    features = {
        split: to_features(questions, tokenizer, max_length, data_args.pad_to_max_length)
        for split, questions in splits.items()
    }

    count_tokens(training_args)
    prepare_processes(training_args)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=features.get("train"),
        eval_dataset=features.get("validation"),
        processing_class=tokenizer,
        data_collator=ChoicesCollator(tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None),
        compute_metrics=compute_metrics,
        callbacks=[ThroughputCallback()],
    )
    padding_free.attach(trainer)
    attach(trainer)
    output_dir = Path(training_args.output_dir)

    def evaluate() -> dict:
        output = trainer.predict(features["validation"], metric_key_prefix="eval")
        trainer.log(output.metrics)
        if trainer.is_world_process_zero():
            write_predictions(output_dir / "eval_predictions.jsonl", splits["validation"], output.predictions)
        return {**output.metrics, "eval_samples": len(features["validation"])}

    def predict() -> dict:
        output = trainer.predict(features["test"], metric_key_prefix="predict")
        if trainer.is_world_process_zero():
            write_predictions(output_dir / "predictions.jsonl", splits["test"], output.predictions)
        return {**output.metrics, "predict_samples": len(features["test"])}

    return run_stages(
        trainer,
        checkpoint,
        train_samples=len(features["train"]) if "train" in features else None,
        evaluate=evaluate,
        predict=predict,
        card=model_card(model_args, data_args, "multiple-choice"),
    )


if __name__ == "__main__":
    main()
