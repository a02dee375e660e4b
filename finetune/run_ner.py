"""Fine-tune a posformers (or any transformers) encoder for named-entity recognition: `posformers-ner`.

    posformers-ner --model_name_or_path <model> --train_file conll2003/train.txt \\
        --validation_file conll2003/valid.txt --test_file conll2003/test.txt \\
        --do_train --do_eval --do_predict --output_dir out/conll2003
    posformers-ner --model_name_or_path <model> --dataset_name conll2003 --do_train --do_eval ...   # the Hub
    posformers-ner --model_name_or_path <model> --dataset_name path/to/folder ...  # a local parquet/json dataset

Arguments as transformers' examples/pytorch/token-classification/run_ner.py (`--label_all_tokens`,
`--return_entity_level_metrics`, `--text_column_name`, `--label_column_name`, ...) plus every TrainingArguments flag
and the shared script options (`--padding_free auto|true|false`, `--skip_bad_examples`, `--overwrite_output_dir`,
`--resume_from_checkpoint True`, `--push_to_hub`). Data formats: finetune/ner_data.py (CoNLL files in IOB1 or IOB2,
JSON lines, Hub datasets with `tokens` / `ner_tags`).

Labels: each word's tag goes on its first sub-token; the other sub-tokens are ignored by the loss (-100), or, with
--label_all_tokens, get the word's tag too (B- turned into I-) for training. Evaluation always reads the first
sub-token of each word, so scores are per word whatever the training option: entity-level precision, recall and F1
exactly as `seqeval`'s default mode, word accuracy, and per entity type `<TYPE>_precision/_recall/_f1/_number`
(posformers' `evaluate` module "seqeval", computed by finetune/ner_metrics.py; --return_entity_level_metrics False
leaves the per-type scores out). Words past --max_seq_length tokens get no prediction: they count as "O" (a
warning says how many).

Writes into --output_dir: the model and tokenizer, `*_results.json`, and the predictions in CoNLL format, one
`word gold predicted` line per word and a blank line between sentences (conlleval reads it): `eval_predictions.txt`
for --do_eval and `predictions.txt` for --do_predict.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import datasets
import numpy as np
from transformers import (
    AutoModelForTokenClassification,
    AutoTokenizer,
    DataCollatorForTokenClassification,
    EvalPrediction,
    Trainer,
    TrainingArguments,
)

from . import metrics
from .arguments import ModelArguments, SplitDataArguments
from .errors import ArgumentError, DataError
from .loading import fit_config_to_tokenizer, hub_kwargs, load_config, load_model, load_tokenizer, window_length
from .ner_data import label_list, read_hub, read_split_files
from .ner_metrics import OVERALL
from .script import Script, check_splits, script_main

logger = logging.getLogger(__name__)

IGNORE = -100  # the label of tokens the loss and the scores skip


@dataclasses.dataclass
class NerDataArguments(SplitDataArguments):
    """posformers-ner's data options (names as in transformers' run_ner)."""

    text_column_name: str = dataclasses.field(default="tokens", metadata={"help": "The column of word lists."})
    label_column_name: str = dataclasses.field(default="ner_tags", metadata={"help": "The column of tag lists."})
    label_all_tokens: bool = dataclasses.field(
        default=False, metadata={"help": "Train on every sub-token of a word (default: its first sub-token only)."}
    )
    return_entity_level_metrics: bool = dataclasses.field(
        default=True, metadata={"help": "Report precision/recall/F1 per entity type besides the overall scores."}
    )

    @property
    def columns(self) -> tuple[str, str]:
        return self.text_column_name, self.label_column_name


def load_splits(
    data_args: NerDataArguments, training_args: TrainingArguments, skip_bad: bool, cache_dir, encoding=None
) -> tuple[dict, list | None]:
    """The sentences of each split the run needs (files read in `encoding`), and the dataset's declared tag order
    (or None)."""
    splits, declared = data_args.read(
        lambda files: (read_split_files(files, data_args.columns, skip_bad, encoding), None),
        lambda name, config_name: read_hub(name, config_name, data_args.columns, cache_dir),
    )
    check_splits(training_args, splits)
    return data_args.limit(splits), declared


# ---------------------------------------------------------------------------------------------------------------------
# Labels and the model head
# ---------------------------------------------------------------------------------------------------------------------


def is_token_classification_checkpoint(config) -> bool:
    return any(name.endswith("ForTokenClassification") for name in (getattr(config, "architectures", None) or []))


def set_labels(config, labels: list[str], model_args: ModelArguments) -> None:
    """Give the config the tag set. A fine-tuned NER checkpoint keeps its tags and their order when it knows every tag
    of the data; one that does not is refused unless --ignore_mismatched_sizes gives it a new head."""
    if model_args.model_name_or_path and is_token_classification_checkpoint(config):
        model_labels = [str(config.id2label[i]) for i in range(config.num_labels)]
        if set(labels) <= set(model_labels):
            labels = model_labels
        elif not model_args.ignore_mismatched_sizes:
            raise DataError(
                f"the data's tags ({', '.join(labels)}) are not those {model_args.model_name_or_path} was fine-tuned "
                f"with ({', '.join(model_labels)}); pass --ignore_mismatched_sizes to give it a new head",
                column="ner_tags",
            )
    config.num_labels = len(labels)
    config.id2label = dict(enumerate(labels))
    config.label2id = {label: i for i, label in enumerate(labels)}


def tokenizer_for_words(tokenizer, model_args: ModelArguments):
    """A fast tokenizer that takes words: byte-level BPE ones (GPT-2's, DeBERTa v1's) need add_prefix_space."""
    if not getattr(tokenizer, "is_fast", False):
        raise ArgumentError(f"{type(tokenizer).__name__} is not a fast tokenizer: aligning tags to words needs one")
    if getattr(tokenizer, "add_prefix_space", None) is False:
        name = model_args.tokenizer_name or model_args.model_name_or_path
        tokenizer = AutoTokenizer.from_pretrained(name, add_prefix_space=True, **hub_kwargs(model_args))
    tokenizer.padding_side = "right"
    return tokenizer


# ---------------------------------------------------------------------------------------------------------------------
# Features: tags on sub-tokens
# ---------------------------------------------------------------------------------------------------------------------


def inside_tag(tag: str) -> str:
    """The tag of a word's later sub-tokens under --label_all_tokens: B-X -> I-X (a word's pieces are one entity)."""
    return "I-" + tag[2:] if tag.startswith("B-") else tag


def align_labels(word_ids: list[int | None], tags: list[str], label2id: dict, all_tokens: bool) -> list[int]:
    """Per-token label ids: the word's tag on its first sub-token; later sub-tokens IGNORE, or (all_tokens) the
    word's inside tag; special tokens IGNORE."""
    labels, previous = [], None
    for word in word_ids:
        if word is None:
            labels.append(IGNORE)
        elif word != previous:
            labels.append(label2id[tags[word]])
        else:
            later = inside_tag(tags[word])
            labels.append(label2id.get(later, label2id[tags[word]]) if all_tokens else IGNORE)
        previous = word
    return labels


def to_features(sentences, tokenizer, label2id, data_args: NerDataArguments, max_length: int, all_tokens: bool):
    """(datasets.Dataset of input_ids, attention_mask, (token_type_ids), labels; per sentence, the indices of the
    words that have a token: words past max_length, and words the tokenizer drops whole, have none)."""
    encoded = tokenizer(
        [sentence["tokens"] for sentence in sentences],
        is_split_into_words=True,
        truncation=True,
        max_length=max_length,
        padding="max_length" if data_args.pad_to_max_length else False,
    )
    labels, kept = [], []
    for index, sentence in enumerate(sentences):
        word_ids = encoded.word_ids(index)
        labels.append(align_labels(word_ids, sentence["ner_tags"], label2id, all_tokens))
        kept.append(sorted({word for word in word_ids if word is not None}))
    return datasets.Dataset.from_dict({**encoded, "labels": labels}), kept


# ---------------------------------------------------------------------------------------------------------------------
# Predictions and scores
# ---------------------------------------------------------------------------------------------------------------------


def argmax_logits(logits, labels):
    """Trainer's preprocess_logits_for_metrics: keep the predicted ids, not the (.., num_labels) logits."""
    return (logits[0] if isinstance(logits, tuple) else logits).argmax(dim=-1)


def word_predictions(predicted_ids, label_ids, sentences, kept, id2label) -> list[list[str]]:
    """Per-sentence predicted tags from Trainer's gathered (rows, L) predictions and labels.

    The scored positions (labels != IGNORE: each kept word's first sub-token) are read in order, which holds for
    padded batches (one row per sentence) and flattened ones (one row per batch) alike; words cut off by
    max_seq_length (and words without a token) are predicted "O".
    """
    predicted_ids, label_ids = np.asarray(predicted_ids), np.asarray(label_ids)
    scored = iter(predicted_ids[label_ids != IGNORE].tolist())
    expected = sum(len(words) for words in kept)
    if int((label_ids != IGNORE).sum()) != expected:
        raise ValueError(f"predictions: {int((label_ids != IGNORE).sum())} scored tokens for {expected} words")
    tags = []
    for sentence, words in zip(sentences, kept):
        sentence_tags = ["O"] * len(sentence["tokens"])
        for word in words:
            sentence_tags[word] = id2label[next(scored)]
        tags.append(sentence_tags)
    return tags


def write_conll(path: Path, sentences, predictions) -> None:
    """`word gold predicted` per line, a blank line after each sentence."""
    lines = []
    for sentence, predicted in zip(sentences, predictions):
        lines += [f"{w} {g} {p}" for w, g, p in zip(sentence["tokens"], sentence["ner_tags"], predicted)] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")


def flatten_seqeval(result: dict, per_type: bool) -> dict[str, float]:
    """evaluate's seqeval layout -> Trainer metrics: precision, recall, f1, accuracy and, per type,
    <TYPE>_precision / _recall / _f1 / _number (as transformers' run_ner with --return_entity_level_metrics)."""
    scores = {name: result[f"overall_{name}"] for name in OVERALL}
    if per_type:
        for type_, values in result.items():
            if isinstance(values, dict):
                scores.update({f"{type_}_{name}": value for name, value in values.items()})
    return scores


class NerScorer:
    """Trainer's compute_metrics for whichever split is being scored (`use(split)` before predicting another),
    through posformers' `evaluate` module "seqeval" (finetune/metrics)."""

    def __init__(self, splits: dict, kept: dict, id2label: dict, per_type: bool):
        self.splits, self.kept, self.id2label, self.per_type = splits, kept, id2label, per_type
        self.split = "validation"
        self.last_tags: list[list[str]] | None = None
        self.metric = metrics.load("seqeval")

    def use(self, split: str) -> NerScorer:
        self.split = split
        return self

    def __call__(self, prediction: EvalPrediction) -> dict[str, float]:
        sentences, kept = self.splits[self.split], self.kept[self.split]
        self.last_tags = word_predictions(prediction.predictions, prediction.label_ids, sentences, kept, self.id2label)
        gold = [sentence["ner_tags"] for sentence in sentences]
        return flatten_seqeval(self.metric.compute(predictions=self.last_tags, references=gold), self.per_type)


# ---------------------------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------------------------


class Ner(Script):
    """posformers-ner's steps (finetune/script.py runs them)."""

    data_arguments = NerDataArguments
    task = "token-classification"

    def load(self):
        model_args = self.model_args
        self.splits, declared = load_splits(self.data_args, self.training_args, **self.read_options())
        config = load_config(model_args)
        set_labels(config, label_list(self.splits, declared), model_args)
        self.tokenizer = tokenizer_for_words(load_tokenizer(model_args), model_args)
        self.config = fit_config_to_tokenizer(config, self.tokenizer, model_args)
        return load_model(model_args, self.config, AutoModelForTokenClassification)

    def prepare_datasets(self) -> tuple:
        data_args, label2id = self.data_args, self.config.label2id
        max_length = window_length(self.config, data_args.max_seq_length)
        self.features, kept = {}, {}
        for split, sentences in self.splits.items():
            all_tokens = data_args.label_all_tokens and split == "train"  # scores always read first sub-tokens
            self.features[split], kept[split] = to_features(
                sentences, self.tokenizer, label2id, data_args, max_length, all_tokens
            )
            cut = sum(len(sentence["tokens"]) - len(words) for sentence, words in zip(sentences, kept[split]))
            if cut:
                logger.warning(
                    "%s: %d words get no prediction (past max_seq_length=%d tokens, or no token)",
                    split,
                    cut,
                    max_length,
                )
        self.scorer = NerScorer(self.splits, kept, self.config.id2label, data_args.return_entity_level_metrics)
        return self.features.get("train"), self.features.get("validation")

    def build_trainer(self, padding_free, **common) -> Trainer:
        collator = DataCollatorForTokenClassification(self.tokenizer, pad_to_multiple_of=self.pad_to_multiple_of)
        return Trainer(
            **common,
            data_collator=padding_free.collator(collator, token_keys=("input_ids", "token_type_ids", "labels")),
            compute_metrics=self.scorer,
            preprocess_logits_for_metrics=argmax_logits,
        )

    def evaluate(self) -> dict:
        metrics = {**self.trainer.evaluate(), "eval_samples": len(self.splits["validation"])}
        self.write_tags("eval_predictions.txt", "validation")
        return metrics

    def predict(self) -> dict:
        self.scorer.use("test")
        output = self.trainer.predict(self.features["test"], metric_key_prefix="predict")
        self.scorer.use("validation")  # evaluations during training score the validation split
        self.write_tags("predictions.txt", "test")
        return {**output.metrics, "predict_samples": len(self.splits["test"])}

    def write_tags(self, name: str, split: str) -> None:
        """The tags the scorer last predicted, for `split`, into output_dir/`name` (process 0 only)."""
        if self.trainer.is_world_process_zero():
            write_conll(Path(self.training_args.output_dir) / name, self.splits[split], self.scorer.last_tags)

    def card(self) -> dict:
        return {**super().card(), "dataset": self.data_args.card_dataset()}


main = script_main(Ner)


if __name__ == "__main__":
    main()
