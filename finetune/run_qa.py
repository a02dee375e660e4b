"""Fine-tune a posformers (or any transformers) model for extractive question answering: `posformers-qa`.

The arguments are those of transformers' examples/pytorch/question-answering/run_qa.py plus every TrainingArguments
flag; the model, config and tokenizer load through the Auto classes (`import posformers` registers RoFormer, DeBERTa
and LittleBird), so all three families and any transformers QA model work the same way. `--padding_free
auto|true|false` (default auto) feeds the posformers models flattened batches (finetune/padding_free.py); their QA
heads then give per-window logits of the longest window's length, as a padded batch does. A model whose config has
`qa_head="span_selection"` (a recurring span selection checkpoint, `posformers-pretrain --objective rss`) answers with
its span-selection head: each window gets the model's [QUESTION] token (`question_token_id`, an added special token
of the tokenizer saved with the model) right after the question.
`--lora_r 8` (with `--lora_alpha`, `--lora_dropout`, `--lora_target_modules`) trains LoRA adapters and `qa_outputs`
instead of the whole model and saves the adapter with LOAD_ADAPTER.md (finetune/lora.py).

    posformers-qa --model_name_or_path path/to/model --train_file train-v1.1.json --validation_file dev-v1.1.json \
        --do_train --do_eval --output_dir out/squad

Data (finetune/qa_data.py tells the formats apart, or pass --data_format):
- SQuAD v1.1 / v2.0 JSON (v2: add --version_2_with_negative), flat {id, question, context, answers} records in JSON
  or JSON lines, or --dataset_name of a Hub dataset in the squad layout (online only).
- KorQuAD 2.x pages: --korquad_mode html (raw_html + html_answer_start, the default) or context (the cleaned
  context + answer_start). The HTML becomes text with the answers' offsets carried along (finetune/qa_html.py).
- TriviaQA reading comprehension: a qa/*.json question file; evidence documents from --triviaqa_evidence_dir
  (default: the `evidence` folder beside the `qa` folder). Scored with TriviaQA's normalisation against all aliases.

Windows: documents longer than --max_seq_length tokens are read in windows overlapping by --doc_stride tokens. The
default window is the whole document up to 4096 tokens for LittleBird (pass a larger --max_seq_length for longer
documents; LittleBird has no position limit) and 512 tokens for the other models (or their max_position_embeddings
if smaller). Evaluation writes <prefix>_predictions.json, <prefix>_nbest_predictions.json and, with
--version_2_with_negative, <prefix>_null_odds.json (prefix "eval" or "predict") beside eval_results.json.

Demo
----
`make demo` trains a small LittleBird from scratch on questions about one long document: the first ten paragraphs of
the SQuAD v1.1 dev article "Amazon_rainforest" joined into one document of 1,848 tokens, read whole in one window
(`finetune/demo_data/qa/`, provenance in its README.md; config `littlebird-qa.json`: 2 layers x 64, blocks of 64, 16
pack states, BiALiBi slopes starting at 0; the bert-base-uncased tokenizer of `finetune/demo_data/tokenizer`). With
DATA = the installed `posformers/demo_data` folder it runs:

    from posformers.finetune import run_qa
    metrics = run_qa.main([
        "--config_name", f"{DATA}/qa/littlebird-qa.json", "--tokenizer_name", f"{DATA}/tokenizer",
        "--train_file", f"{DATA}/qa/train.json", "--validation_file", f"{DATA}/qa/train.json",
        "--do_train", "--do_eval", "--output_dir", "demo_output/littlebird-qa", "--overwrite_output_dir",
        "--num_train_epochs", "50", "--learning_rate", "5e-3", "--warmup_steps", "10",
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "8",
        "--save_strategy", "no", "--logging_steps", "20", "--report_to", "none", "--seed", "42",
    ])
    print(f"EM {metrics['eval_exact_match']:.1f}  F1 {metrics['eval_f1']:.1f}")

and prints EM/F1. The validation file is the training file on purpose: a model this small, trained from scratch for
two minutes on 24 questions, can learn to find the answers it was shown in a 1,848-token document, not answer new
questions. What it measured, per seed, and why reading comprehension needs a pretrained encoder: README, "The demo"
(the one place the demo's numbers are stated).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

import datasets
from transformers import (
    AutoModelForQuestionAnswering,
    DataCollatorWithPadding,
    PreTrainedTokenizerFast,
    TrainingArguments,
    default_data_collator,
)

from .arguments import ModelArguments
from .errors import ArgumentError, BadExamples, DataError
from .loading import DEFAULT_WINDOW, LITTLEBIRD_WINDOW, load_config, load_model, load_tokenizer, window_length
from .qa_data import DATA_FORMATS, KORQUAD_MODES, check_examples, hub_examples, load_qa_file
from .qa_features import postprocess_predictions, prepare_features
from .qa_trainer import QuestionAnsweringTrainer, score_predictions
from .script import Script, script_main

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class QADataArguments:
    """What data to train and evaluate on (names as in transformers' run_qa.py, plus the long-document formats)."""

    dataset_name: str | None = dataclasses.field(
        default=None, metadata={"help": "Hub dataset in the squad layout (e.g. squad, squad_v2); needs the network."}
    )
    dataset_config_name: str | None = dataclasses.field(default=None, metadata={"help": "The Hub dataset's config."})
    train_file: str | None = dataclasses.field(default=None, metadata={"help": "Training data (.json / .jsonl)."})
    validation_file: str | None = dataclasses.field(default=None, metadata={"help": "Evaluation data."})
    test_file: str | None = dataclasses.field(default=None, metadata={"help": "Data to predict (answers optional)."})
    data_format: str = dataclasses.field(
        default="auto", metadata={"help": f"One of {DATA_FORMATS}: auto tells them apart by layout."}
    )
    korquad_mode: str = dataclasses.field(
        default="html",
        metadata={"help": f"KorQuAD 2 source, one of {KORQUAD_MODES}: raw_html + html_answer_start, or context."},
    )
    triviaqa_evidence_dir: str | None = dataclasses.field(
        default=None, metadata={"help": "TriviaQA evidence folder (wikipedia/, web/); default: ../evidence of qa/."}
    )
    overwrite_cache: bool = dataclasses.field(default=False, metadata={"help": "Redo cached preprocessing."})
    preprocessing_num_workers: int | None = dataclasses.field(
        default=None, metadata={"help": "Processes for tokenization."}
    )
    max_seq_length: int | None = dataclasses.field(
        default=None,
        metadata={
            "help": f"Window length in tokens; default {LITTLEBIRD_WINDOW} for LittleBird, {DEFAULT_WINDOW} for "
            "others (or their max_position_embeddings if smaller)."
        },
    )
    pad_to_max_length: bool = dataclasses.field(
        default=False,
        metadata={"help": "Pad every window to max_seq_length (default: pad each batch to its longest window)."},
    )
    max_train_samples: int | None = dataclasses.field(default=None, metadata={"help": "Use the first N questions."})
    max_eval_samples: int | None = dataclasses.field(default=None, metadata={"help": "Use the first N questions."})
    max_predict_samples: int | None = dataclasses.field(default=None, metadata={"help": "Use the first N questions."})
    version_2_with_negative: bool = dataclasses.field(
        default=False, metadata={"help": "Some questions have no answer (SQuAD v2.0)."}
    )
    null_score_diff_threshold: float = dataclasses.field(
        default=0.0, metadata={"help": "Answer 'no answer' when null score - best span score exceeds this."}
    )
    doc_stride: int = dataclasses.field(default=128, metadata={"help": "Overlap of consecutive windows, in tokens."})
    n_best_size: int = dataclasses.field(default=20, metadata={"help": "Candidate starts/ends per window."})
    max_answer_length: int = dataclasses.field(default=30, metadata={"help": "Longest answer, in tokens."})

    def __post_init__(self):
        if self.data_format not in DATA_FORMATS:
            raise ArgumentError(f"--data_format must be one of {DATA_FORMATS}, got {self.data_format!r}")
        if self.korquad_mode not in KORQUAD_MODES:
            raise ArgumentError(f"--korquad_mode must be one of {KORQUAD_MODES}, got {self.korquad_mode!r}")
        for name in ("doc_stride", "n_best_size", "max_answer_length", "max_seq_length"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ArgumentError(f"--{name} must be positive, got {value}")


SPLIT_FILES = {"train": "train_file", "validation": "validation_file", "test": "test_file"}


def wanted_splits(training_args: TrainingArguments) -> list[str]:
    wanted = []
    if training_args.do_train:
        wanted.append("train")
    if training_args.do_eval or (training_args.do_train and training_args.eval_strategy != "no"):
        wanted.append("validation")
    if training_args.do_predict:
        wanted.append("test")
    return wanted


def load_hub_split(data_args: QADataArguments, model_args: ModelArguments, split: str):
    """One split of --dataset_name from the Hub; a clear DataError where the Hub cannot be reached."""
    try:
        return datasets.load_dataset(
            data_args.dataset_name,
            data_args.dataset_config_name,
            split=split,
            cache_dir=model_args.cache_dir,
            token=model_args.token,
        )
    except Exception as error:  # datasets raises many kinds (offline, not found, no such split)
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
        hint = (
            " HF_HUB_OFFLINE is set, so nothing is downloaded: pass local files (--train_file, --validation_file)."
            if offline
            else ""
        )
        raise DataError(
            f"cannot load split {split!r} of dataset {data_args.dataset_name!r}: {type(error).__name__}: {error}.{hint}"
        ) from None


def load_split(data_args, model_args, run_args, split: str) -> list[dict]:
    """Checked examples of one split from its file or the Hub, cut to --max_*_samples."""
    bad = BadExamples(skip=run_args.skip_bad_examples, split=split)
    path = getattr(data_args, SPLIT_FILES[split])
    if path is not None:
        examples = load_qa_file(
            path,
            split,
            bad,
            data_format=data_args.data_format,
            korquad_mode=data_args.korquad_mode,
            evidence_dir=data_args.triviaqa_evidence_dir,
            version_2_with_negative=data_args.version_2_with_negative,
            encoding=run_args.encoding,
        )
    elif data_args.dataset_name is not None:
        records = hub_examples(load_hub_split(data_args, model_args, split), data_args.dataset_name)
        examples = check_examples(
            records, data_args.dataset_name, bad, split != "test", data_args.version_2_with_negative
        )
    else:
        raise ArgumentError(f"no {split} data: pass --{SPLIT_FILES[split]} or --dataset_name")
    if len(bad):
        logger.warning(bad.summary())
    limit = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples}.get(
        split, data_args.max_predict_samples
    )
    return examples[:limit] if limit is not None else examples


def check_tokenizer(tokenizer, max_seq_length: int, doc_stride: int) -> None:
    if not isinstance(tokenizer, PreTrainedTokenizerFast) and not getattr(tokenizer, "is_fast", False):
        raise ArgumentError(
            f"{type(tokenizer).__name__} is not a fast tokenizer: windowing needs offset mappings (use a tokenizer "
            "with a tokenizer.json, or one transformers can convert)"
        )
    if doc_stride >= max_seq_length:
        raise ArgumentError(f"--doc_stride ({doc_stride}) must be smaller than the window ({max_seq_length} tokens)")
    # Windows and positions count from the left: LittleBird and the span labels need real tokens first.
    tokenizer.padding_side = "right"


def question_token(config, tokenizer) -> str | None:
    """The [QUESTION] token that a span-selection QA head (config.qa_head "span_selection") reads after each question,
    checked to be an added special token of the tokenizer; None for any other head."""
    if getattr(config, "qa_head", "linear") != "span_selection":
        return None
    token_id = getattr(config, "question_token_id", None)
    if token_id is None:
        raise ArgumentError(
            "the model's config has qa_head='span_selection' but no question_token_id: set it to the id of the "
            "[QUESTION] token the head was trained with"
        )
    added = tokenizer.added_tokens_decoder.get(token_id)
    if added is None or not added.special:
        raise ArgumentError(
            f"the model's span-selection head reads a [QUESTION] token (id {token_id}) after each question, but the "
            "tokenizer has no added special token of that id: use the tokenizer saved with the model"
        )
    return added.content


def to_features(
    examples: list[dict], split: str, tokenizer, data_args, max_seq_length: int, training_args, question_token=None
):
    """(examples Dataset, features Dataset) of one split; `question_token` goes after each question."""
    dataset = datasets.Dataset.from_list(examples)
    with_labels = split != "test" or any(example["answers"]["text"] for example in examples)
    prepare = functools.partial(
        prepare_features,
        tokenizer=tokenizer,
        max_seq_length=max_seq_length,
        doc_stride=data_args.doc_stride,
        pad_to_max_length=data_args.pad_to_max_length,
        with_labels=with_labels,
        for_postprocessing=split != "train",
        question_token=question_token,
    )
    with training_args.main_process_first(desc=f"windowing {split}"):
        try:
            features = dataset.map(
                prepare,
                batched=True,
                remove_columns=dataset.column_names,
                num_proc=data_args.preprocessing_num_workers,
                load_from_cache_file=not data_args.overwrite_cache,
                desc=f"windowing {split} ({max_seq_length} tokens, stride {data_args.doc_stride})",
            )
        except Exception as error:
            if "truncat" in str(error).lower():  # the question leaves no room for the document
                raise DataError(
                    f"{split}: a question is too long for a {max_seq_length}-token window with stride "
                    f"{data_args.doc_stride} ({error}); raise --max_seq_length or lower --doc_stride"
                ) from None
            raise
    logger.info("%s: %d questions -> %d windows", split, len(dataset), len(features))
    return dataset, features


class QuestionAnswering(Script):
    """posformers-qa's steps (finetune/script.py runs them)."""

    data_arguments = QADataArguments
    task = "question-answering"

    def load(self):
        model_args, data_args = self.model_args, self.data_args
        # All data is read and checked before the model is built, so bad data stops the run at once.
        self.splits = {
            split: load_split(data_args, model_args, self.run_args, split)
            for split in wanted_splits(self.training_args)
        }
        config = load_config(model_args)
        self.tokenizer = load_tokenizer(model_args)
        self.max_seq_length = window_length(config, data_args.max_seq_length)
        check_tokenizer(self.tokenizer, self.max_seq_length, data_args.doc_stride)
        self.question = question_token(config, self.tokenizer)
        return load_model(model_args, config, AutoModelForQuestionAnswering)

    def lora_arguments(self, model) -> dict:
        # No task_type: peft's PeftModelForQuestionAnswering drops token_type_ids and position_ids (peft 0.21),
        # which would silently break segment embeddings and flattened batches; plain PeftModel passes everything.
        return {"task_type": None, "auto_class": "AutoModelForQuestionAnswering"}

    def prepare_datasets(self) -> tuple:
        self.windows = {
            split: to_features(
                examples, split, self.tokenizer, self.data_args, self.max_seq_length, self.training_args, self.question
            )
            for split, examples in self.splits.items()
        }
        train_features = self.windows["train"][1] if "train" in self.windows else None
        return train_features, self.windows.get("validation", (None, None))[1]

    def build_trainer(self, padding_free, **common) -> QuestionAnsweringTrainer:
        data_args = self.data_args
        examples = (example for examples in self.splits.values() for example in examples[:1])
        normalizer = "triviaqa" if any("aliases" in example for example in examples) else "squad"
        collator = padding_free.collator(
            default_data_collator
            if data_args.pad_to_max_length
            else DataCollatorWithPadding(self.tokenizer, pad_to_multiple_of=self.pad_to_multiple_of)
        )
        return QuestionAnsweringTrainer(
            **common,
            eval_examples=self.windows.get("validation", (None, None))[0],
            data_collator=collator,
            postprocess=functools.partial(
                postprocess_predictions,
                version_2_with_negative=data_args.version_2_with_negative,
                n_best_size=data_args.n_best_size,
                max_answer_length=data_args.max_answer_length,
                null_score_diff_threshold=data_args.null_score_diff_threshold,
            ),
            score=functools.partial(
                score_predictions, version_2_with_negative=data_args.version_2_with_negative, normalizer=normalizer
            ),
        )

    def evaluate(self) -> dict:
        eval_examples = self.windows["validation"][0]
        metrics = {**self.trainer.evaluate(), "eval_samples": len(eval_examples)}
        self.write_answers("eval")
        return metrics

    def predict(self) -> dict:
        test_examples, test_features = self.windows["test"]
        output = self.trainer.predict(test_features, test_examples, metric_key_prefix="predict")
        self.write_answers("predict")
        return {**output.metrics, "predict_samples": len(test_examples)}

    def write_answers(self, prefix: str) -> None:
        """The answers the trainer last predicted, into output_dir (process 0: every process has them)."""
        if self.trainer.is_world_process_zero():
            self.trainer.last_predictions.write(self.training_args.output_dir, prefix)

    def card(self) -> dict:
        return {**super().card(), "dataset": self.data_args.dataset_name}


main = script_main(QuestionAnswering)


if __name__ == "__main__":
    main()
